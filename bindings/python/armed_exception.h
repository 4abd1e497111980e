// A testing hook: a C++ exception armed to be thrown once at one of the few places where the
// bindings catch C++ exceptions themselves (outside pybind11's dispatch and the fast entries),
// so a test can prove each one reaches Python through the one error mapping
// (translate_active_exception): std::bad_alloc as HostOutOfMemoryError, never a plain builtin.
// kiln._kiln._arm_cpp_exception(site, kind) arms it (testing.cpp). Thread-safe; costs one
// relaxed atomic load per pass when nothing is armed.
#ifndef KILN_PYTHON_ARMED_EXCEPTION_H_
#define KILN_PYTHON_ARMED_EXCEPTION_H_

#include <cstdint>

namespace kiln::python {

/// Where an armed exception is thrown.
enum class ArmedSite : uint8_t {
  none,
  buffer,        ///< kiln.ndarray's buffer export (memoryview, numpy.asarray)
  observer,      ///< making the exception an OOM observer is called with
};

/// The exception kinds: as kiln._kiln._throw_cpp_exception's.
enum class ArmedKind : uint8_t { bad_alloc, future_error, system_error };

/// Arms `kind` at `site` (none disarms); the next pass through `site` throws it and disarms.
void arm_cpp_exception(ArmedSite site, ArmedKind kind);

/// Throws the armed exception if `site` is armed.
void throw_if_armed(ArmedSite site);

/// Throws an exception of `kind`.
[[noreturn]] void throw_cpp_exception_of(ArmedKind kind);

}  // namespace kiln::python

#endif  // KILN_PYTHON_ARMED_EXCEPTION_H_
