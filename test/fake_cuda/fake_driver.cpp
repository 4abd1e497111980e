// The CUDA driver entry points of rhi/cuda/cuda_driver.inc, over host memory. Each call counts
// itself, then answers in this order: stub mode (CUDA_ERROR_STUB_LIBRARY), a sticky error (not
// for cuGetErrorName and cuDevicePrimaryCtxRelease_v2), an injected fault, cuInit not called (CUDA_ERROR_NOT_INITIALIZED), no current context
// (CUDA_ERROR_INVALID_CONTEXT), bad arguments; only then does it do its work.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <string_view>

#include "fake_state.h"

#define KILN_FAKE_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace kiln::fake_cuda {

/// Runs the kernel behind `function` (fake_kernels.cpp); returns the launch's CUresult.
CUresult run_launch(State &state, const CUfunc_st &function, unsigned grid_x, unsigned block_x,
                    void **params);

namespace {

constexpr CUresult kSuccess = 0;
constexpr CUresult kInvalidValue = 1;
constexpr CUresult kOutOfMemory = 2;
constexpr CUresult kNotInitialized = 3;
constexpr CUresult kStubLibrary = 34;
constexpr CUresult kNoDevice = 100;
constexpr CUresult kInvalidDevice = 101;
constexpr CUresult kInvalidImage = 200;
constexpr CUresult kInvalidContext = 201;
constexpr CUresult kInvalidPtx = 218;
constexpr CUresult kInvalidHandle = 400;
constexpr CUresult kNotFound = 500;
constexpr CUresult kNotSupported = 801;

constexpr int kDriverVersion = 13000;
constexpr std::size_t kAllocationAlignment = 256;  // what cuMemAlloc guarantees
constexpr std::size_t kMaxImageBytes = std::size_t{1} << 30;

enum class Needs {
  nothing,   ///< works before cuInit
  init,      ///< needs cuInit
  context,   ///< needs cuInit and a current context
  teardown,  ///< needs cuInit; answers even after a sticky error (it destroys the bad context)
};

/// What every entry point does first. `answer` is set when the call must return at once.
struct Call {
  LockedState state;
  CUresult answer = kSuccess;
  bool done = false;

  Call(const char *entry, Needs needs) : state(lock_state()) {
    ++state->call_counts[entry];
    answer = first_answer(entry, needs);
    done = answer != kSuccess;
  }

  CUresult first_answer(const char *entry, Needs needs) {
    if (state->mode == Mode::stub) return kStubLibrary;
    if (state->sticky_error != kSuccess && needs != Needs::teardown) return state->sticky_error;
    if (const CUresult fault = state->planned_fault(entry); fault != kSuccess) return fault;
    if (needs != Needs::nothing && !state->initialized) return kNotInitialized;
    if (needs == Needs::context && (current_context() != &state->primary_context ||
                                    state->primary_context.retain_count == 0)) {
      return kInvalidContext;
    }
    return kSuccess;
  }

  /// Returns `result`, making it the sticky error if it is one.
  CUresult result(CUresult result) {
    if (is_sticky(result)) state->sticky_error = result;
    return result;
  }
};

#define KILN_FAKE_BEGIN(entry, needs)       \
  Call call(entry, needs);                  \
  if (call.done) return call.result(call.answer)

/// Collects the .entry names of NUL-terminated PTX text `image` and its size with the NUL.
/// CUDA_ERROR_INVALID_IMAGE if it is not NUL-terminated text (or is a cubin), CUDA_ERROR_INVALID_PTX
/// if it has no .version, .target or .entry.
CUresult parse_ptx(const char *image, std::set<std::string, std::less<>> *entries,
                   std::size_t *size_bytes) {
  const void *nul = std::memchr(image, '\0', kMaxImageBytes);
  if (nul == nullptr) return kInvalidImage;
  const std::string_view text(image, static_cast<const char *>(nul) - image);
  if (text.starts_with("\x7f" "ELF")) return kInvalidImage;  // a cubin: the fake runs PTX only
  if (text.find(".version") == std::string_view::npos ||
      text.find(".target") == std::string_view::npos) {
    return kInvalidPtx;
  }
  for (std::size_t pos = text.find(".entry"); pos != std::string_view::npos;
       pos = text.find(".entry", pos + 6)) {
    std::size_t begin = pos + 6;
    while (begin < text.size() && (text[begin] == ' ' || text[begin] == '\t')) ++begin;
    std::size_t end = begin;
    while (end < text.size() && (std::isalnum(static_cast<unsigned char>(text[end])) ||
                                 text[end] == '_' || text[end] == '$')) {
      ++end;
    }
    if (end > begin) entries->emplace(text.substr(begin, end - begin));
  }
  if (entries->empty()) return kInvalidPtx;
  *size_bytes = text.size() + 1;
  return kSuccess;
}

}  // namespace
}  // namespace kiln::fake_cuda

using namespace kiln::fake_cuda;  // NOLINT: this file only defines the C entry points

// --- initialization, version, errors, devices ---------------------------------------------------

KILN_FAKE_CUDA_EXPORT CUresult cuInit(unsigned int flags) {
  KILN_FAKE_BEGIN("cuInit", Needs::nothing);
  if (!call.state->config_error.empty()) return kInvalidValue;
  if (flags != 0) return kInvalidValue;
  call.state->initialized = true;
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuDriverGetVersion(int *version) {
  KILN_FAKE_BEGIN("cuDriverGetVersion", Needs::nothing);
  if (version == nullptr) return kInvalidValue;
  *version = kDriverVersion;
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuGetErrorName(CUresult error, const char **name) {
  // Like the real driver, a pure lookup: neither initialization nor a sticky error matters.
  auto state = lock_state();
  ++state->call_counts["cuGetErrorName"];
  if (state->mode == Mode::stub) return kStubLibrary;
  if (const CUresult fault = state->planned_fault("cuGetErrorName"); fault != kSuccess) {
    return fault;
  }
  if (name == nullptr) return kInvalidValue;
  *name = error_name(error);
  return *name != nullptr ? kSuccess : kInvalidValue;
}

KILN_FAKE_CUDA_EXPORT CUresult cuDeviceGetCount(int *count) {
  KILN_FAKE_BEGIN("cuDeviceGetCount", Needs::init);
  if (count == nullptr) return kInvalidValue;
  *count = call.state->mode == Mode::nodevice ? 0 : 1;
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  KILN_FAKE_BEGIN("cuDeviceGet", Needs::init);
  if (device == nullptr) return kInvalidValue;
  if (call.state->mode == Mode::nodevice) return kNoDevice;
  if (ordinal != 0) return kInvalidDevice;
  *device = 0;
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
  KILN_FAKE_BEGIN("cuDeviceGetName", Needs::init);
  if (name == nullptr || length <= 0) return kInvalidValue;
  if (device != 0 || call.state->mode == Mode::nodevice) return kInvalidDevice;
  const std::string text = "kiln fake CUDA device (" +
                           std::to_string(call.state->capacity_bytes >> 20) + " MiB)";
  const std::size_t n = std::min(text.size(), static_cast<std::size_t>(length) - 1);
  std::memcpy(name, text.data(), n);
  name[n] = '\0';
  return kSuccess;
}

// --- contexts ------------------------------------------------------------------------------------

KILN_FAKE_CUDA_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
  KILN_FAKE_BEGIN("cuDevicePrimaryCtxRetain", Needs::init);
  if (context == nullptr) return kInvalidValue;
  if (device != 0 || call.state->mode == Mode::nodevice) return kInvalidDevice;
  ++call.state->primary_context.retain_count;
  *context = &call.state->primary_context;
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  KILN_FAKE_BEGIN("cuDevicePrimaryCtxRelease_v2", Needs::teardown);
  if (device != 0 || call.state->mode == Mode::nodevice) return kInvalidDevice;
  CUctx_st &primary = call.state->primary_context;
  if (primary.retain_count == 0) return kInvalidContext;
  // The last release destroys the primary context and everything allocated in it; a sticky
  // error belonged to that context, so the next retained context starts clean.
  if (--primary.retain_count == 0) {
    call.state->release_device_memory();
    call.state->sticky_error = kSuccess;
  }
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuCtxSetCurrent(CUcontext context) {
  KILN_FAKE_BEGIN("cuCtxSetCurrent", Needs::init);
  if (context != nullptr &&
      (context != &call.state->primary_context || call.state->primary_context.retain_count == 0)) {
    return kInvalidContext;
  }
  current_context() = context;
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuCtxSynchronize() {
  // Launches run to completion inside cuLaunchKernel, so there is nothing left to wait for;
  // a sticky error from a launch is returned here too (by KILN_FAKE_BEGIN).
  KILN_FAKE_BEGIN("cuCtxSynchronize", Needs::context);
  return kSuccess;
}

// --- memory --------------------------------------------------------------------------------------

KILN_FAKE_CUDA_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
  KILN_FAKE_BEGIN("cuMemGetInfo_v2", Needs::context);
  if (free_bytes == nullptr || total_bytes == nullptr) return kInvalidValue;
  State &state = *call.state.state;
  // Other processes' usage follows the script: one value per call, the last one stays.
  state.other_bytes = state.other_script[std::min(state.other_index, state.other_script.size() - 1)];
  if (state.other_index < state.other_script.size()) ++state.other_index;
  *free_bytes = state.free_bytes();
  *total_bytes = state.capacity_bytes;
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size_bytes) {
  KILN_FAKE_BEGIN("cuMemAlloc_v2", Needs::context);
  if (ptr == nullptr || size_bytes == 0) return kInvalidValue;
  State &state = *call.state.state;
  if (size_bytes > state.free_bytes()) {
    ++state.oom_count;
    return kOutOfMemory;
  }
  const std::size_t rounded = (size_bytes + kAllocationAlignment - 1) / kAllocationAlignment *
                              kAllocationAlignment;
  void *host = std::aligned_alloc(kAllocationAlignment, rounded);
  if (host == nullptr) {
    ++state.oom_count;
    return kOutOfMemory;
  }
  const auto address = static_cast<CUdeviceptr>(reinterpret_cast<uintptr_t>(host));
  state.allocations[address] = Allocation{host, size_bytes};
  state.held_bytes += size_bytes;
  state.high_water_bytes = std::max(state.high_water_bytes, state.held_bytes);
  *ptr = address;
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
  KILN_FAKE_BEGIN("cuMemFree_v2", Needs::context);
  State &state = *call.state.state;
  const auto it = state.allocations.find(ptr);
  if (it == state.allocations.end()) return kInvalidValue;  // not the start of a live allocation
  std::free(it->second.host);
  state.held_bytes -= it->second.size_bytes;
  state.allocations.erase(it);
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src,
                                               size_t size_bytes) {
  KILN_FAKE_BEGIN("cuMemcpyHtoD_v2", Needs::context);
  if (size_bytes == 0) return kSuccess;
  if (src == nullptr || !call.state->device_range_ok(dst, size_bytes)) return kInvalidValue;
  std::memcpy(reinterpret_cast<void *>(static_cast<uintptr_t>(dst)), src, size_bytes);
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t size_bytes) {
  KILN_FAKE_BEGIN("cuMemcpyDtoH_v2", Needs::context);
  if (size_bytes == 0) return kSuccess;
  if (dst == nullptr || !call.state->device_range_ok(src, size_bytes)) return kInvalidValue;
  std::memcpy(dst, reinterpret_cast<const void *>(static_cast<uintptr_t>(src)), size_bytes);
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src,
                                               size_t size_bytes) {
  KILN_FAKE_BEGIN("cuMemcpyDtoD_v2", Needs::context);
  if (size_bytes == 0) return kSuccess;
  if (!call.state->device_range_ok(dst, size_bytes) ||
      !call.state->device_range_ok(src, size_bytes)) {
    return kInvalidValue;
  }
  std::memmove(reinterpret_cast<void *>(static_cast<uintptr_t>(dst)),
               reinterpret_cast<const void *>(static_cast<uintptr_t>(src)), size_bytes);
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) {
  KILN_FAKE_BEGIN("cuMemsetD8_v2", Needs::context);
  if (count == 0) return kSuccess;
  if (!call.state->device_range_ok(dst, count)) return kInvalidValue;
  std::memset(reinterpret_cast<void *>(static_cast<uintptr_t>(dst)), value, count);
  return kSuccess;
}

// --- modules and launches ------------------------------------------------------------------------

KILN_FAKE_CUDA_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  KILN_FAKE_BEGIN("cuModuleLoadData", Needs::context);
  if (module == nullptr || image == nullptr) return kInvalidValue;
  auto loaded = std::make_unique<CUmod_st>();
  std::size_t size_bytes = 0;
  if (const CUresult parsed = parse_ptx(static_cast<const char *>(image), &loaded->entries,
                                        &size_bytes);
      parsed != kSuccess) {
    return parsed;
  }
  State &state = *call.state.state;
  if (size_bytes > state.free_bytes()) return kOutOfMemory;  // code lives in device memory too
  loaded->charged_bytes = size_bytes;
  state.module_bytes += size_bytes;
  CUmodule handle = loaded.get();
  state.modules.emplace(handle, std::move(loaded));
  *module = handle;
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuModuleUnload(CUmodule module) {
  KILN_FAKE_BEGIN("cuModuleUnload", Needs::context);
  State &state = *call.state.state;
  const auto it = state.modules.find(module);
  if (it == state.modules.end()) return kInvalidHandle;
  state.module_bytes -= it->second->charged_bytes;
  state.modules.erase(it);  // its functions go with it
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuModuleGetFunction(CUfunction *function, CUmodule module,
                                                   const char *name) {
  KILN_FAKE_BEGIN("cuModuleGetFunction", Needs::context);
  if (function == nullptr || name == nullptr) return kInvalidValue;
  const auto it = call.state->modules.find(module);
  if (it == call.state->modules.end()) return kInvalidHandle;
  CUmod_st &loaded = *it->second;
  if (const auto known = loaded.functions.find(std::string_view(name));
      known != loaded.functions.end()) {
    *function = known->second.get();
    return kSuccess;
  }
  const HostKernel *kernel = find_host_kernel(name);
  if (!loaded.entries.contains(std::string_view(name)) || kernel == nullptr) return kNotFound;
  auto created = std::make_unique<CUfunc_st>();
  created->module = module;
  created->kernel = kernel;
  *function = created.get();
  loaded.functions.emplace(name, std::move(created));
  return kSuccess;
}

KILN_FAKE_CUDA_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int grid_x,
                                              unsigned int grid_y, unsigned int grid_z,
                                              unsigned int block_x, unsigned int block_y,
                                              unsigned int block_z, unsigned int shared_bytes,
                                              CUstream stream, void **params, void **extra) {
  KILN_FAKE_BEGIN("cuLaunchKernel", Needs::context);
  State &state = *call.state.state;
  const CUfunc_st *function = nullptr;
  for (const auto &[handle, loaded] : state.modules) {
    for (const auto &[name, candidate] : loaded->functions) {
      if (candidate.get() == f) function = candidate.get();
    }
  }
  if (function == nullptr) return kInvalidHandle;
  if (stream != nullptr) return kInvalidHandle;  // the fake has only the default stream
  if (grid_x == 0 || grid_y == 0 || grid_z == 0 || block_x == 0 || block_y == 0 ||
      block_z == 0 || uint64_t{block_x} * block_y * block_z > 1024 || block_z > 64 ||
      shared_bytes > 48 * 1024 || params == nullptr || params[0] == nullptr ||
      params[1] == nullptr) {
    return kInvalidValue;
  }
  // kiln's entry points index tasks by x only; the fake runs exactly what kiln launches.
  if (grid_y != 1 || grid_z != 1 || block_y != 1 || block_z != 1 || extra != nullptr) {
    return kNotSupported;
  }
  return call.result(run_launch(state, *function, grid_x, block_x, params));
}
