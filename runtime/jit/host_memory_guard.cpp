#include "kiln/runtime/host_memory_guard.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <future>
#include <mutex>
#include <system_error>

#include <fmt/format.h>
#include <llvm/Support/ErrorHandling.h>

namespace kiln::runtime {

RhiStatus check_host_headroom(std::string device, const char *site, uint64_t headroom_bytes) {
  void *probe = mmap(nullptr, headroom_bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                     -1, 0);
  if (probe == MAP_FAILED) {
    const int error = errno;
    return std::unexpected(host_out_of_memory(
        std::move(device), site, headroom_bytes,
        fmt::format("compiling kiln's kernels (mapping that much address space failed: {}; raise "
                    "the process's memory limit, ulimit -v, or free host memory)",
                    std::strerror(error)),
        "ENOMEM"));
  }
  munmap(probe, headroom_bytes);
  return {};
}

Failure failure_from_current_exception(std::string device, const char *site) {
  try {
    throw;
  } catch (const std::bad_alloc &) {
    return host_out_of_memory(std::move(device), site, 0, "a C++ allocation (std::bad_alloc)",
                              "std::bad_alloc");
  } catch (const LlvmFatalError &e) {
    return make_failure(RhiResult::error, std::move(device), site,
                        fmt::format("LLVM reported a fatal error: {}", e.reason));
  } catch (const std::system_error &e) {
    // A thread the runtime needs could not be made (EAGAIN: no memory for its stack, or a limit).
    return make_failure(RhiResult::error, std::move(device), site,
                        fmt::format("the host refused a resource ({}: {})", e.code().message(), e.what()));
  } catch (const std::exception &e) {
    return make_failure(RhiResult::error, std::move(device), site,
                        fmt::format("unexpected C++ exception: {}", e.what()));
  } catch (...) {
    return make_failure(RhiResult::error, std::move(device), site, "unexpected non-C++ exception");
  }
}

void install_llvm_error_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    llvm::install_bad_alloc_error_handler(
        [](void *, const char *, bool) { throw std::bad_alloc(); });
    llvm::install_fatal_error_handler([](void *, const char *reason, bool) {
      throw LlvmFatalError(reason != nullptr ? reason : "unknown");
    });
  });
}

}  // namespace kiln::runtime
