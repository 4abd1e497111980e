// Host memory exhaustion at the boundaries where kiln runs code it does not control (LLVM, the
// C++ library, thread creation): it becomes a named failure, never an abort.
#ifndef KILN_RUNTIME_HOST_MEMORY_GUARD_H_
#define KILN_RUNTIME_HOST_MEMORY_GUARD_H_

#include <cxxabi.h>

#include <cstdint>
#include <exception>
#include <new>
#include <string>
#include <utility>

#include "kiln/rhi/result.h"

namespace kiln::runtime {

/// Address space (bytes) kept free before LLVM compiles kiln's runtime module. Measured with
/// LLVM 19 (CpuJit::create in a child under RLIMIT_AS = mapped + room, no check first): 6 MiB of
/// room works, 4 MiB ends in SIGSEGV inside LLVM, which is why the room is checked before LLVM
/// runs; 32 MiB is five times the need. Tested by [host_oom] in test/unit/test_lifecycle.cpp.
inline constexpr uint64_t kJitHeadroomBytes = 32ull << 20;

/// Checks, before work that cannot fail cleanly (LLVM, built without exceptions), that
/// `headroom_bytes` of address space can still be mapped: maps and unmaps that much, PROT_NONE
/// (it counts against RLIMIT_AS but uses no memory). Errors: out_of_memory (host). Thread-safe.
[[nodiscard]] RhiStatus check_host_headroom(std::string device, const char *site,
                                            uint64_t headroom_bytes);

/// A C++ exception caught at a kiln boundary, as a failure: std::bad_alloc (and an LLVM
/// out-of-memory report, see install_llvm_error_handlers) is host out_of_memory; anything else
/// (std::future_error and std::system_error when a thread cannot be made, an LLVM fatal error)
/// is `error` naming it. Call inside a catch block.
[[nodiscard]] Failure failure_from_current_exception(std::string device, const char *site);

/// Runs `fn` (returning an RhiExpected or RhiStatus) and turns an exception escaping it into the
/// failure failure_from_current_exception makes.
template <class Fn>
auto guard_host_exceptions(const std::string &device, const char *site, Fn &&fn) -> decltype(fn()) {
  try {
    return std::forward<Fn>(fn)();
  } catch (abi::__forced_unwind &) {
    throw;  // the thread is being ended (pthread_exit, cancellation): never swallowed
  } catch (...) {
    return std::unexpected(failure_from_current_exception(device, site));
  }
}

/// Installs, once per process, LLVM's bad-alloc handler (an allocation LLVM makes with
/// safe_malloc fails) and fatal-error handler (report_fatal_error), which otherwise print
/// "LLVM ERROR: ..." and abort. They throw std::bad_alloc and LlvmFatalError, which kiln
/// catches where it calls LLVM and turns into named failures.
///
/// LLVM 19 as Debian builds it has no exceptions (`llvm-config-19 --cxxflags`: -fno-exceptions
/// -funwind-tables): the throw unwinds through LLVM's frames (their unwind tables are kept)
/// without running their destructors, as a std::bad_alloc from operator new inside LLVM already
/// does. Memory LLVM held then is leaked,
/// and the JIT that failed is not used again. check_host_headroom before compiling keeps this
/// path for allocations that fail for other reasons than a full address space.
void install_llvm_error_handlers();

/// What the fatal-error handler throws (the reason LLVM gave).
struct LlvmFatalError : std::exception {
  explicit LlvmFatalError(std::string why) : reason(std::move(why)) {}
  const char *what() const noexcept override { return reason.c_str(); }
  std::string reason;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_HOST_MEMORY_GUARD_H_
