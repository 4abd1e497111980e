// The CUDA driver entry points of rhi/cuda/cuda_driver.inc over the shared fake core
// (test/fake_gpu/fake_gpu.h): this file is the CUDA dialect — names, codes, the primary context —
// and thin entry points. Each call counts itself, then answers in this order: stub mode
// (CUDA_ERROR_STUB_LIBRARY), the sticky error of the device it acts on — the one it names
// (cuDeviceGet, cuDeviceGetName, cuDeviceGetAttribute, cuDevicePrimaryCtxRetain, cuCtxSetCurrent's
// context) or its current context's (memory, module, launch and synchronize calls); not for
// cuDevicePrimaryCtxRelease_v2, nor for cuInit, cuDriverGetVersion, cuDeviceGetCount and
// cuGetErrorName, which act on no device — then an injected fault, cuInit not called
// (CUDA_ERROR_NOT_INITIALIZED), no current context (CUDA_ERROR_INVALID_CONTEXT), bad arguments;
// only then does it do its work.
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "cuda_types.h"
#include "fake_cuda_control.h"
#include "fake_gpu.h"

// The primary context handle; CUmodule and CUfunction are the core's Module and Function.
struct CUctx_st {};

namespace kiln::fake_gpu {
namespace {

constexpr CUresult kSuccess = 0;
constexpr CUresult kInvalidValue = 1;
constexpr CUresult kNoDevice = 100;
constexpr CUresult kInvalidDevice = 101;
constexpr CUresult kInvalidImage = 200;
constexpr CUresult kInvalidContext = 201;
constexpr CUresult kInvalidPtx = 218;
constexpr CUresult kStubLibrary = 34;

constexpr int kDriverVersion = 13000;
constexpr std::size_t kMaxImageBytes = std::size_t{1} << 30;

constexpr std::string_view kEntryPoints[] = {
#define KILN_CUDA_ENTRY(name, params) #name,
#include "cuda_driver.inc"
#undef KILN_CUDA_ENTRY
};

// The CUresult values of rhi/cuda/cuda_types.h, by their cuda.h enumerator names.
constexpr NamedCode kCodes[] = {
    {0, "CUDA_SUCCESS"},
    {1, "CUDA_ERROR_INVALID_VALUE"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY"},
    {3, "CUDA_ERROR_NOT_INITIALIZED"},
    {4, "CUDA_ERROR_DEINITIALIZED"},
    {34, "CUDA_ERROR_STUB_LIBRARY"},
    {35, "CUDA_ERROR_INSUFFICIENT_DRIVER"},
    {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
    {100, "CUDA_ERROR_NO_DEVICE"},
    {101, "CUDA_ERROR_INVALID_DEVICE"},
    {200, "CUDA_ERROR_INVALID_IMAGE"},
    {201, "CUDA_ERROR_INVALID_CONTEXT"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE"},
    {218, "CUDA_ERROR_INVALID_PTX"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
    {400, "CUDA_ERROR_INVALID_HANDLE"},
    {500, "CUDA_ERROR_NOT_FOUND"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS"},
    {717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"},
    {718, "CUDA_ERROR_INVALID_PC"},
    {719, "CUDA_ERROR_LAUNCH_FAILED"},
    {800, "CUDA_ERROR_NOT_PERMITTED"},
    {801, "CUDA_ERROR_NOT_SUPPORTED"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
    {999, "CUDA_ERROR_UNKNOWN"},
};

CUctx_st primary_contexts[kMaxDevices];  // device i's primary context; live while retained

/// The context current on this thread (cuCtxSetCurrent), or nullptr.
CUcontext &current_context() {
  thread_local CUcontext context = nullptr;
  return context;
}

bool is_sticky(int result) { return result == 214 || result == 700 || (result >= 714 && result <= 719); }

/// The ordinal of `context` if it is one of the primary-context handles (the state may have
/// fewer devices), else kOnNoDevice. Takes no lock: the handles never move.
int context_ordinal(CUcontext context) {
  for (int i = 0; i < kMaxDevices; ++i) {
    if (context == &primary_contexts[i]) return i;
  }
  return kOnNoDevice;
}

/// The ordinal of `context` (a primary context of one of the state's devices), or -1.
int ordinal_of(const State &state, CUcontext context) {
  const int ordinal = context_ordinal(context);
  return ordinal < state.device_count() ? ordinal : -1;
}

int current_device(const State &state) { return ordinal_of(state, current_context()); }

bool has_current(const State &state) {
  const int ordinal = current_device(state);
  return ordinal >= 0 && state.devices[static_cast<std::size_t>(ordinal)].context_retain_count > 0;
}

/// Device `device` of `state` when the fake has it (not in nodevice mode), else nullptr.
Device *find_device(State &state, CUdevice device) {
  return state.mode == Mode::nodevice ? nullptr : state.device(device);
}

void on_reset() { current_context() = nullptr; }

/// The number of "sm_<digits>" with at least two digits (the last is the minor version), with an
/// optional feature suffix "a" or "f"; 0 when `arch` is not of that form.
int sm_number(std::string_view arch) {
  if (!arch.starts_with("sm_")) return 0;
  std::string_view digits = arch.substr(3);
  if (!digits.empty() && (digits.back() == 'a' || digits.back() == 'f')) digits.remove_suffix(1);
  int number = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), number);
  if (digits.size() < 2 || digits.size() > 4 || ec != std::errc() || end != digits.data() + digits.size())
    return 0;
  return number >= 10 ? number : 0;
}

bool is_valid_arch(std::string_view arch) { return sm_number(arch) != 0; }

constexpr Dialect kDialect{
    .title = "kiln fake CUDA driver",
    .env_prefix = "KILN_FAKE_CUDA_",
    .init_entry = "cuInit",
    .alloc_entry = "cuMemAlloc_v2",
    .entry_points = kEntryPoints,
    .codes = kCodes,
    .success = kSuccess,
    .invalid_value = kInvalidValue,
    .out_of_memory = 2,
    .not_initialized = 3,
    .invalid_context = kInvalidContext,
    .stub = kStubLibrary,
    .invalid_handle = 400,
    .not_found = 500,
    .not_supported = 801,
    .illegal_address = 700,
    .is_sticky = is_sticky,
    .has_current = has_current,
    .on_reset = on_reset,
    .current_device = current_device,
    .default_arch = "sm_80",
    .is_valid_arch = is_valid_arch,
};

/// Collects the .entry names and the .target of NUL-terminated PTX text `image` into `module`, and
/// its size with the NUL. CUDA_ERROR_INVALID_IMAGE if it is not NUL-terminated text (or is a
/// cubin), CUDA_ERROR_INVALID_PTX if it has no .version, .entry or .target sm_<digits>, or if
/// its SM version is newer than the device's (as the real driver's JIT: "SM version specified by
/// .target is higher than default").
CUresult parse_ptx(const char *image, const State &state, Module *module, std::size_t *size_bytes) {
  std::set<std::string, std::less<>> *entries = &module->entries;
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
  // ".target sm_90": the driver JIT-compiles PTX for its device, never for a newer one.
  const std::size_t target = text.find(".target");
  std::size_t begin = target + 7;
  while (begin < text.size() && (text[begin] == ' ' || text[begin] == '\t')) ++begin;
  const std::size_t end = text.find_first_of(", \t\r\n", begin);
  module->target = std::string(text.substr(begin, end == std::string_view::npos ? end : end - begin));
  const int image_sm = sm_number(module->target);
  if (image_sm == 0) return kInvalidPtx;
  if (image_sm > sm_number(state.arch)) return kInvalidPtx;  // ptxas: .target newer than the GPU
  // A user kernel's image carries the user's IR in its last comment: the fake runs that IR.
  auto user = std::make_shared<UserCode>();
  if (kiln::runtime::parse_user_module_comment(text, &user->ir, &user->entry, &user->params))
    module->user = std::move(user);
  *size_bytes = text.size() + 1;
  return kSuccess;
}

}  // namespace

const Dialect &dialect() { return kDialect; }

}  // namespace kiln::fake_gpu

using namespace kiln::fake_gpu;  // NOLINT: this file only defines the C entry points

#define KILN_FAKE_CONTROL(name) kiln_fake_cuda_##name
#include "fake_control.inc"
#undef KILN_FAKE_CONTROL

namespace {
uint64_t address(CUdeviceptr ptr) { return static_cast<uint64_t>(ptr); }
Module *core(CUmodule module) { return reinterpret_cast<Module *>(module); }
const Function *core(CUfunction function) { return reinterpret_cast<const Function *>(function); }
}  // namespace

// --- initialization, version, errors, devices ---------------------------------------------------

KILN_FAKE_GPU_EXPORT CUresult cuInit(unsigned int flags) {
  KILN_FAKE_BEGIN("cuInit", Needs::nothing);
  if (!call.state->config_error.empty()) return kInvalidValue;
  if (flags != 0) return kInvalidValue;
  call.state->initialized = true;
  return kSuccess;
}

KILN_FAKE_GPU_EXPORT CUresult cuDriverGetVersion(int *version) {
  KILN_FAKE_BEGIN("cuDriverGetVersion", Needs::nothing);
  if (version == nullptr) return kInvalidValue;
  *version = kDriverVersion;
  return kSuccess;
}

KILN_FAKE_GPU_EXPORT CUresult cuGetErrorName(CUresult error, const char **name) {
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

KILN_FAKE_GPU_EXPORT CUresult cuDeviceGetCount(int *count) {
  KILN_FAKE_BEGIN("cuDeviceGetCount", Needs::init);
  if (count == nullptr) return kInvalidValue;
  *count = call.state->mode == Mode::nodevice ? 0 : call.state->device_count();
  return kSuccess;
}

KILN_FAKE_GPU_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal) {
  KILN_FAKE_BEGIN_ON("cuDeviceGet", Needs::init, ordinal);
  if (device == nullptr) return kInvalidValue;
  if (call.state->mode == Mode::nodevice) return kNoDevice;
  if (call.state->device(ordinal) == nullptr) return kInvalidDevice;
  *device = ordinal;
  return kSuccess;
}

KILN_FAKE_GPU_EXPORT CUresult cuDeviceGetName(char *name, int length, CUdevice device) {
  KILN_FAKE_BEGIN_ON("cuDeviceGetName", Needs::init, device);
  if (name == nullptr || length <= 0) return kInvalidValue;
  const Device *found = find_device(*call.state.state, device);
  if (found == nullptr) return kInvalidDevice;
  const std::string text = "kiln fake CUDA device (" + std::to_string(found->capacity_bytes >> 20) + " MiB)";
  const std::size_t n = std::min(text.size(), static_cast<std::size_t>(length) - 1);
  std::memcpy(name, text.data(), n);
  name[n] = '\0';
  return kSuccess;
}

KILN_FAKE_GPU_EXPORT CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice device) {
  KILN_FAKE_BEGIN_ON("cuDeviceGetAttribute", Needs::init, device);
  if (value == nullptr) return kInvalidValue;
  if (find_device(*call.state.state, device) == nullptr) return kInvalidDevice;
  const int sm = sm_number(call.state->arch);  // KILN_FAKE_CUDA_ARCH, checked when read
  switch (attribute) {
    case 75: *value = sm / 10; return kSuccess;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    case 76: *value = sm % 10; return kSuccess;  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR
    default: return kInvalidValue;               // the fake knows no other attribute
  }
}

// --- contexts ------------------------------------------------------------------------------------

KILN_FAKE_GPU_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *context, CUdevice device) {
  KILN_FAKE_BEGIN_ON("cuDevicePrimaryCtxRetain", Needs::init, device);
  if (context == nullptr) return kInvalidValue;
  Device *found = find_device(*call.state.state, device);
  if (found == nullptr) return kInvalidDevice;
  ++found->context_retain_count;
  found->create_context();  // the first retain makes the primary context
  *context = &primary_contexts[device];
  return kSuccess;
}

KILN_FAKE_GPU_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
  KILN_FAKE_BEGIN_ON("cuDevicePrimaryCtxRelease_v2", Needs::teardown, device);
  Device *found = find_device(*call.state.state, device);
  if (found == nullptr) return kInvalidDevice;
  if (found->context_retain_count == 0) return kInvalidContext;
  // The last release destroys the primary context and everything allocated in it; a sticky
  // error belonged to that context, so the next retained context starts clean.
  if (--found->context_retain_count == 0) found->destroy_context();
  return kSuccess;
}

KILN_FAKE_GPU_EXPORT CUresult cuCtxSetCurrent(CUcontext context) {
  KILN_FAKE_BEGIN_ON("cuCtxSetCurrent", Needs::init, context_ordinal(context));
  if (context != nullptr) {
    const int ordinal = ordinal_of(*call.state.state, context);
    if (ordinal < 0 || call.state->devices[static_cast<std::size_t>(ordinal)].context_retain_count == 0) {
      return kInvalidContext;
    }
  }
  current_context() = context;
  return kSuccess;
}

KILN_FAKE_GPU_EXPORT CUresult cuCtxSynchronize() {
  // Launches run to completion inside cuLaunchKernel, so there is nothing left to wait for;
  // a sticky error from a launch on this context's device is returned here too (by KILN_FAKE_BEGIN).
  KILN_FAKE_BEGIN("cuCtxSynchronize", Needs::context);
  return kSuccess;
}

// --- memory --------------------------------------------------------------------------------------

KILN_FAKE_GPU_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
  KILN_FAKE_BEGIN("cuMemGetInfo_v2", Needs::context);
  return memory_info(*call.state.state, free_bytes, total_bytes);
}

KILN_FAKE_GPU_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t size_bytes) {
  KILN_FAKE_BEGIN("cuMemAlloc_v2", Needs::context);
  if (ptr == nullptr) return kInvalidValue;
  uint64_t at = 0;
  const int result = allocate(*call.state.state, size_bytes, &at);
  if (result == kSuccess) *ptr = static_cast<CUdeviceptr>(at);
  return result;
}

KILN_FAKE_GPU_EXPORT CUresult cuMemFree_v2(CUdeviceptr ptr) {
  KILN_FAKE_BEGIN("cuMemFree_v2", Needs::context);
  return free_allocation(*call.state.state, address(ptr));
}

KILN_FAKE_GPU_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t size_bytes) {
  KILN_FAKE_BEGIN("cuMemcpyHtoD_v2", Needs::context);
  return copy_to_device(*call.state.state, address(dst), src, size_bytes);
}

KILN_FAKE_GPU_EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t size_bytes) {
  KILN_FAKE_BEGIN("cuMemcpyDtoH_v2", Needs::context);
  return copy_to_host(*call.state.state, dst, address(src), size_bytes);
}

KILN_FAKE_GPU_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t size_bytes) {
  KILN_FAKE_BEGIN("cuMemcpyDtoD_v2", Needs::context);
  return copy_device(*call.state.state, address(dst), address(src), size_bytes);
}

KILN_FAKE_GPU_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t count) {
  KILN_FAKE_BEGIN("cuMemsetD8_v2", Needs::context);
  return memset8(*call.state.state, address(dst), value, count);
}

// --- modules and launches ------------------------------------------------------------------------

KILN_FAKE_GPU_EXPORT CUresult cuModuleLoadData(CUmodule *module, const void *image) {
  KILN_FAKE_BEGIN("cuModuleLoadData", Needs::context);
  if (module == nullptr || image == nullptr) return kInvalidValue;
  auto loaded = std::make_unique<Module>();
  std::size_t size_bytes = 0;
  if (const CUresult parsed = parse_ptx(static_cast<const char *>(image), *call.state.state, loaded.get(), &size_bytes);
      parsed != kSuccess) {
    return parsed;
  }
  Module *handle = nullptr;
  const int result = add_module(*call.state.state, std::move(loaded), size_bytes, &handle);
  if (result == kSuccess) *module = reinterpret_cast<CUmodule>(handle);
  return result;
}

KILN_FAKE_GPU_EXPORT CUresult cuModuleUnload(CUmodule module) {
  KILN_FAKE_BEGIN("cuModuleUnload", Needs::context);
  return unload_module(*call.state.state, core(module));
}

KILN_FAKE_GPU_EXPORT CUresult cuModuleGetFunction(CUfunction *function, CUmodule module,
                                                  const char *name) {
  KILN_FAKE_BEGIN("cuModuleGetFunction", Needs::context);
  if (function == nullptr) return kInvalidValue;
  Function *found = nullptr;
  const int result = get_function(*call.state.state, core(module), name, &found);
  if (result == kSuccess) *function = reinterpret_cast<CUfunction>(found);
  return result;
}

KILN_FAKE_GPU_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int grid_x, unsigned int grid_y,
                                             unsigned int grid_z, unsigned int block_x,
                                             unsigned int block_y, unsigned int block_z,
                                             unsigned int shared_bytes, CUstream stream,
                                             void **params, void **extra) {
  KILN_FAKE_BEGIN("cuLaunchKernel", Needs::context);
  return call.result(launch(*call.state.state, core(f), grid_x, grid_y, grid_z, block_x, block_y, block_z,
                            shared_bytes, stream, params, extra));
}
