#include "cuda_driver.h"

#include <dlfcn.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>

#include <fmt/format.h>

namespace kiln::cuda {

RhiExpected<const CudaDriver *> CudaDriver::load() {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<CudaDriver>> loaded;  // never closed
  const char *env = std::getenv("KILN_CUDA_DRIVER");
  const std::string library = env != nullptr && *env != '\0' ? env : "libcuda.so.1";
  std::lock_guard lock(mutex);
  if (auto it = loaded.find(library); it != loaded.end()) return it->second.get();
  void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr)
    return std::unexpected(make_failure(
        RhiResult::not_supported, "cuda", "dlopen",
        fmt::format("the CUDA driver {} could not be loaded ({}); install the NVIDIA driver or set "
                    "KILN_CUDA_DRIVER", library, dlerror())));
  auto driver = std::make_unique<CudaDriver>();
  driver->library = library;
#define KILN_CUDA_ENTRY(name, params)                                                         \
  driver->name = reinterpret_cast<decltype(driver->name)>(dlsym(handle, #name));              \
  if (driver->name == nullptr)                                                                \
    return std::unexpected(make_failure(                                                      \
        RhiResult::not_supported, "cuda", "dlsym",                                            \
        fmt::format("the CUDA driver {} has no entry point {}; it is too old", library, #name)));
#include "cuda_driver.inc"
#undef KILN_CUDA_ENTRY
  return loaded.emplace(library, std::move(driver)).first->second.get();
}

}  // namespace kiln::cuda
