// Failure -> Python exception: the ONLY place a named error becomes a Python exception.
//
// make_exception() classifies a Failure with kiln::classify and builds an instance of that
// ErrorKind's class (defined in kiln/_errors.py); messages are never parsed. check() is how every
// binding reads an executor result. The OOM-observer interrupt stash lives here too: a
// KeyboardInterrupt or SystemExit an observer raised is re-raised by the next check() on its thread.
//
// Threading: every function here needs the GIL held. The stash is per thread.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <utility>

#include "kiln/executor/errors.h"

namespace kiln::python {

namespace py = pybind11;

/// The exception object for `failure` (not raised): its class is the one of classify(failure),
/// its message advises with the knobs a Python user sets (kiln.init(...)).
py::object make_exception(const Failure &unadvised);

/// Raises the named error of `failure` (a C++ throw that pybind11 turns into the Python raise).
[[noreturn]] void raise_failure(const Failure &failure);

/// Sets the Python error of `failure` without throwing (for exception translators).
void set_python_error(const Failure &failure);

/// Sets the Python error for the C++ exception being handled (call only inside a catch block),
/// as pybind11's dispatcher would: kiln's mapping (std::bad_alloc is HostOutOfMemoryError,
/// std::future_error and std::system_error RuntimeFaultError), then pybind11's documented
/// translation of its own and the standard exceptions (std::invalid_argument is ValueError, ...).
void translate_active_exception();

/// Raises kiln.InvalidUsageError for `device` at `site`.
[[noreturn]] void raise_invalid_usage(const std::string &device, const char *site, std::string detail);

/// Raises kiln.InvalidTypeError (InvalidUsageError and TypeError): an argument of `site` has a
/// type it cannot use. `detail` names the argument, what it must be and what it got.
[[noreturn]] void raise_invalid_type(const char *site, std::string detail);

/// A host allocation (numpy) failed: HostOutOfMemoryError instead of numpy's MemoryError.
[[noreturn]] void raise_host_oom(const std::string &device, const char *site, uint64_t size_bytes,
                                 std::string detail);

/// raise_invalid_type(site, detail) with `cause` (an ordinary error user code raised, e.g. in
/// __index__ or __float__) as the raised error's __cause__.
[[noreturn]] void raise_invalid_type_from(const py::error_already_set &cause, const char *site,
                                          std::string detail);

// ----------------------------------------------------------------------------------------------
// OOM-observer interrupts.

/// Marks this thread as running an OOM observer while it lives.
class ObserverScope {
 public:
  ObserverScope();
  ~ObserverScope();
  ObserverScope(const ObserverScope &) = delete;
  ObserverScope &operator=(const ObserverScope &) = delete;
};

/// Whether an OOM observer runs on this thread now.
[[nodiscard]] bool in_observer();

/// Keeps `interrupt` (a KeyboardInterrupt or SystemExit an observer raised) for the call that ran
/// the observer: raised by its check(), in place of its result. The first one is kept.
void stash_observer_interrupt(const py::error_already_set &interrupt);

/// Drops an interrupt left by a call that threw past check() (it is not the next call's).
void discard_stale_observer_interrupt();

/// Raises what an observer stashed, if anything and if no observer runs on this thread now.
void raise_observer_interrupt();

/// The result of an executor call, or its failure raised as the named Python error. An
/// interrupt raised by an OOM observer during the call comes first (the result is dropped:
/// RAII handles free what it held).
inline void check(const RhiStatus &status) {
  raise_observer_interrupt();
  if (!status) raise_failure(status.error());
}
template <class T>
T check(RhiExpected<T> expected) {
  raise_observer_interrupt();
  if (!expected) raise_failure(expected.error());
  return std::move(expected).value();
}

}  // namespace kiln::python
