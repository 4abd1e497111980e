// The HIP runtime entry points of rhi/amdgpu/hip_runtime.inc over the shared fake core
// (test/fake_gpu/fake_gpu.h): this file is the HIP dialect — names, codes, modes — and thin entry
// points. Each call counts itself, then answers in this order: stub mode
// (hipErrorInsufficientDriver), the sticky error of the device it acts on — the one it names
// (hipGetDeviceProperties) or the calling thread's (memory, module, launch and synchronize
// calls); not for hipSetDevice, which only selects, hipDeviceReset, which clears it, nor for
// hipInit, hipRuntimeGetVersion, hipGetDeviceCount and hipGetErrorName, which act on no device —
// then an injected fault, hipInit not called (hipErrorNotInitialized), bad arguments; only then
// does it do its work. HIP has no context calls: the current device is per thread and starts as
// device 0, and a device's implicit context is made by the first call that uses it.
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "fake_gpu.h"
#include "fake_hip_control.h"
#include "hip_types.h"
#include "kiln/runtime/elf_image.h"

namespace kiln::fake_gpu {
namespace {

constexpr hipError_t kSuccess = 0;
constexpr hipError_t kInvalidValue = 1;
constexpr hipError_t kInsufficientDriver = 35;
constexpr hipError_t kNoDevice = 100;
constexpr hipError_t kInvalidDevice = 101;
constexpr hipError_t kInvalidImage = 200;
constexpr hipError_t kNoBinaryForGpu = 209;

constexpr int kRuntimeVersion = 60000000;  // what hipRuntimeGetVersion reports (HIP 6.0)
constexpr uint64_t kMaxImageBytes = uint64_t{1} << 30;

constexpr std::string_view kEntryPoints[] = {
#define KILN_HIP_ENTRY(ret, name, params) #name,
#include "hip_runtime.inc"
#undef KILN_HIP_ENTRY
};

// The hipError_t values of rhi/amdgpu/hip_types.h, by their hip_runtime_api.h enumerator names.
constexpr NamedCode kCodes[] = {
    {0, "hipSuccess"},
    {1, "hipErrorInvalidValue"},
    {2, "hipErrorOutOfMemory"},
    {3, "hipErrorNotInitialized"},
    {4, "hipErrorDeinitialized"},
    {9, "hipErrorInvalidConfiguration"},
    {13, "hipErrorInvalidSymbol"},
    {17, "hipErrorInvalidDevicePointer"},
    {35, "hipErrorInsufficientDriver"},
    {53, "hipErrorPriorLaunchFailure"},
    {98, "hipErrorInvalidDeviceFunction"},
    {100, "hipErrorNoDevice"},
    {101, "hipErrorInvalidDevice"},
    {200, "hipErrorInvalidImage"},
    {201, "hipErrorInvalidContext"},
    {209, "hipErrorNoBinaryForGpu"},
    {214, "hipErrorECCNotCorrectable"},
    {218, "hipErrorInvalidKernelFile"},
    {302, "hipErrorSharedObjectSymbolNotFound"},
    {303, "hipErrorSharedObjectInitFailed"},
    {400, "hipErrorInvalidHandle"},
    {500, "hipErrorNotFound"},
    {700, "hipErrorIllegalAddress"},
    {701, "hipErrorLaunchOutOfResources"},
    {702, "hipErrorLaunchTimeOut"},
    {709, "hipErrorContextIsDestroyed"},
    {710, "hipErrorAssert"},
    {719, "hipErrorLaunchFailure"},
    {801, "hipErrorNotSupported"},
    {999, "hipErrorUnknown"},
    {1052, "hipErrorRuntimeMemory"},
    {1053, "hipErrorRuntimeOther"},
};

bool is_sticky(int result) {
  return result == 53 || result == 214 || result == 700 || result == 702 || result == 709 ||
         result == 710 || result == 719;
}

/// The calling thread's device (hipSetDevice; 0 until then).
int &thread_device() {
  thread_local int ordinal = 0;
  return ordinal;
}

int current_device(const State &state) {
  return thread_device() < state.device_count() ? thread_device() : -1;
}

bool has_current(const State &state) { return current_device(state) >= 0; }
void on_reset() { thread_device() = 0; }

/// The processor of a gcnArchName, "gfx942" for "gfx942:sramecc+:xnack-".
std::string_view processor(std::string_view arch) { return arch.substr(0, arch.find(':')); }

bool is_valid_arch(std::string_view arch) {
  const std::string_view gfx = processor(arch);
  return arch.size() < hip::kGcnArchNameBytes && gfx.size() > 3 && gfx.starts_with("gfx") &&
         gfx.find_first_not_of("0123456789abcdef", 3) == std::string_view::npos;
}

constexpr Dialect kDialect{
    .title = "kiln fake HIP runtime",
    .env_prefix = "KILN_FAKE_HIP_",
    .init_entry = "hipInit",
    .alloc_entry = "hipMalloc",
    .entry_points = kEntryPoints,
    .codes = kCodes,
    .success = kSuccess,
    .invalid_value = kInvalidValue,
    .out_of_memory = 2,
    .not_initialized = 3,
    .invalid_context = 201,
    .stub = kInsufficientDriver,
    .invalid_handle = 400,
    .not_found = 500,
    .not_supported = 801,
    .illegal_address = 700,
    .is_sticky = is_sticky,
    .has_current = has_current,
    .on_reset = on_reset,
    .current_device = current_device,
    .default_arch = "gfx90a:sramecc+:xnack-",
    .is_valid_arch = is_valid_arch,
};

/// Reads an HSACO: hipErrorInvalidImage unless it is an ELF64 image for EM_AMDGPU that exports
/// at least one function. Fills the module's entry points and the image size.
hipError_t parse_hsaco(const void *image, const State &state, Module *module, std::size_t *size_bytes) {
  const uint64_t size = runtime::elf_image_size(image);
  if (size == 0 || size > kMaxImageBytes) return kInvalidImage;
  runtime::ElfImageInfo info;
  std::string error;
  if (!runtime::read_elf_image({static_cast<const std::byte *>(image), size}, &info, &error) ||
      info.machine != runtime::kElfMachineAmdgpu || info.functions.empty()) {
    return kInvalidImage;
  }
  module->entries.insert(info.functions.begin(), info.functions.end());
  // A user kernel's image carries the user's IR in a section of its own: the fake runs that IR.
  const std::span<const std::byte> bytes(static_cast<const std::byte *>(image), size);
  if (const auto section = runtime::find_elf_section(bytes, runtime::kUserModuleSection)) {
    auto user = std::make_shared<UserCode>();
    const std::string_view text(reinterpret_cast<const char *>(section->data()), section->size());
    if (!runtime::parse_user_module_comment(text, &user->ir, &user->entry, &user->params)) return kInvalidImage;
    module->user = std::move(user);
  }
  // A code object runs only on the processor it was built for (no JIT between gfx processors).
  module->target = std::string(runtime::amdgpu_processor(info.flags));
  if (module->target != processor(state.arch)) return kNoBinaryForGpu;
  *size_bytes = size;
  return kSuccess;
}

}  // namespace

const Dialect &dialect() { return kDialect; }

}  // namespace kiln::fake_gpu

using namespace kiln::fake_gpu;  // NOLINT: this file only defines the C entry points

#define KILN_FAKE_CONTROL(name) kiln_fake_hip_##name
#include "fake_control.inc"
#undef KILN_FAKE_CONTROL

namespace {
uint64_t address(const void *ptr) { return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(ptr)); }
Module *core(hipModule_t module) { return reinterpret_cast<Module *>(module); }
const Function *core(hipFunction_t function) { return reinterpret_cast<const Function *>(function); }
}  // namespace

// --- initialization, version, errors, devices ---------------------------------------------------

KILN_FAKE_GPU_EXPORT hipError_t hipInit(unsigned int flags) {
  KILN_FAKE_BEGIN("hipInit", Needs::nothing);
  if (!call.state->config_error.empty()) return kInvalidValue;
  if (flags != 0) return kInvalidValue;
  call.state->initialized = true;
  return kSuccess;
}

KILN_FAKE_GPU_EXPORT hipError_t hipRuntimeGetVersion(int *version) {
  KILN_FAKE_BEGIN("hipRuntimeGetVersion", Needs::nothing);
  if (version == nullptr) return kInvalidValue;
  *version = kRuntimeVersion;
  return kSuccess;
}

KILN_FAKE_GPU_EXPORT const char *hipGetErrorName(hipError_t error) {
  // A pure lookup in every mode, as in the real runtime, which names unknown codes this way.
  auto state = lock_state();
  ++state->call_counts["hipGetErrorName"];
  const char *name = error_name(error);
  return name != nullptr ? name : "hipErrorUnknown";
}

KILN_FAKE_GPU_EXPORT hipError_t hipGetDeviceCount(int *count) {
  KILN_FAKE_BEGIN("hipGetDeviceCount", Needs::init);
  if (count == nullptr) return kInvalidValue;
  *count = call.state->mode == Mode::nodevice ? 0 : call.state->device_count();
  return call.state->mode == Mode::nodevice ? kNoDevice : kSuccess;
}

/// Fills the fields of a hipDeviceProp_t (the HIP 5 layout that the unversioned symbol keeps)
/// that kiln reads: gcnArchName from KILN_FAKE_HIP_ARCH; the rest of the struct is zeroed.
KILN_FAKE_GPU_EXPORT hipError_t hipGetDeviceProperties(void *properties, int ordinal) {
  KILN_FAKE_BEGIN_ON("hipGetDeviceProperties", Needs::init, ordinal);
  if (properties == nullptr) return kInvalidValue;
  if (call.state->mode == Mode::nodevice || call.state->device(ordinal) == nullptr) return kInvalidDevice;
  constexpr std::size_t kHip5PropertiesBytes = 792;  // sizeof(hipDeviceProp_t) in HIP 5.2
  auto *bytes = static_cast<char *>(properties);
  std::memset(bytes, 0, kHip5PropertiesBytes);
  const std::string &arch = call.state->arch;  // shorter than kGcnArchNameBytes: checked when set
  std::memcpy(bytes + kiln::hip::kDevicePropertiesGcnArchNameOffset, arch.c_str(), arch.size() + 1);
  return kSuccess;
}

KILN_FAKE_GPU_EXPORT hipError_t hipSetDevice(int ordinal) {
  // Only selects (as the real runtime's, it checks no device health): it succeeds for a device
  // with a sticky error, so that hipDeviceReset after it resets that device and no other.
  KILN_FAKE_BEGIN_ON("hipSetDevice", Needs::select, ordinal);
  if (call.state->mode == Mode::nodevice || call.state->device(ordinal) == nullptr) return kInvalidDevice;
  thread_device() = ordinal;
  return kSuccess;
}

KILN_FAKE_GPU_EXPORT hipError_t hipDeviceSynchronize() {
  // Launches run to completion inside hipModuleLaunchKernel; a sticky error of the current
  // device is returned here too.
  KILN_FAKE_BEGIN("hipDeviceSynchronize", Needs::context);
  return kSuccess;
}

KILN_FAKE_GPU_EXPORT hipError_t hipDeviceReset() {
  // Destroys everything this process made on the current device, its context included; a
  // sticky error belonged to it, so the device starts clean (what recovers a real device after a
  // fault). Other devices keep their memory and their sticky errors.
  KILN_FAKE_BEGIN_ON("hipDeviceReset", Needs::teardown, kOnCurrentDevice);
  call.state->current().destroy_context();
  return kSuccess;
}

// --- memory --------------------------------------------------------------------------------------

KILN_FAKE_GPU_EXPORT hipError_t hipMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
  KILN_FAKE_BEGIN("hipMemGetInfo", Needs::context);
  return memory_info(*call.state.state, free_bytes, total_bytes);
}

KILN_FAKE_GPU_EXPORT hipError_t hipMalloc(void **ptr, size_t size_bytes) {
  KILN_FAKE_BEGIN("hipMalloc", Needs::context);
  if (ptr == nullptr) return kInvalidValue;
  uint64_t at = 0;
  const int result = allocate(*call.state.state, size_bytes, &at);
  if (result == kSuccess) *ptr = reinterpret_cast<void *>(static_cast<uintptr_t>(at));
  return result;
}

KILN_FAKE_GPU_EXPORT hipError_t hipFree(void *ptr) {
  KILN_FAKE_BEGIN("hipFree", Needs::context);
  if (ptr == nullptr) return kSuccess;  // as in the real runtime
  return free_allocation(*call.state.state, address(ptr));
}

KILN_FAKE_GPU_EXPORT hipError_t hipMemcpyHtoD(hipDeviceptr_t dst, void *src, size_t size_bytes) {
  KILN_FAKE_BEGIN("hipMemcpyHtoD", Needs::context);
  return copy_to_device(*call.state.state, address(dst), src, size_bytes);
}

KILN_FAKE_GPU_EXPORT hipError_t hipMemcpyDtoH(void *dst, hipDeviceptr_t src, size_t size_bytes) {
  KILN_FAKE_BEGIN("hipMemcpyDtoH", Needs::context);
  return copy_to_host(*call.state.state, dst, address(src), size_bytes);
}

KILN_FAKE_GPU_EXPORT hipError_t hipMemcpyDtoD(hipDeviceptr_t dst, hipDeviceptr_t src, size_t size_bytes) {
  KILN_FAKE_BEGIN("hipMemcpyDtoD", Needs::context);
  return copy_device(*call.state.state, address(dst), address(src), size_bytes);
}

KILN_FAKE_GPU_EXPORT hipError_t hipMemsetD8(hipDeviceptr_t dst, unsigned char value, size_t count) {
  KILN_FAKE_BEGIN("hipMemsetD8", Needs::context);
  return memset8(*call.state.state, address(dst), value, count);
}

// --- modules and launches ------------------------------------------------------------------------

KILN_FAKE_GPU_EXPORT hipError_t hipModuleLoadData(hipModule_t *module, const void *image) {
  KILN_FAKE_BEGIN("hipModuleLoadData", Needs::context);
  if (module == nullptr || image == nullptr) return kInvalidValue;
  auto loaded = std::make_unique<Module>();
  std::size_t size_bytes = 0;
  if (const hipError_t parsed = parse_hsaco(image, *call.state.state, loaded.get(), &size_bytes);
      parsed != kSuccess) {
    return parsed;
  }
  Module *handle = nullptr;
  const int result = add_module(*call.state.state, std::move(loaded), size_bytes, &handle);
  if (result == kSuccess) *module = reinterpret_cast<hipModule_t>(handle);
  return result;
}

KILN_FAKE_GPU_EXPORT hipError_t hipModuleUnload(hipModule_t module) {
  KILN_FAKE_BEGIN("hipModuleUnload", Needs::context);
  return unload_module(*call.state.state, core(module));
}

KILN_FAKE_GPU_EXPORT hipError_t hipModuleGetFunction(hipFunction_t *function, hipModule_t module,
                                                     const char *name) {
  KILN_FAKE_BEGIN("hipModuleGetFunction", Needs::context);
  if (function == nullptr) return kInvalidValue;
  Function *found = nullptr;
  const int result = get_function(*call.state.state, core(module), name, &found);
  if (result == kSuccess) *function = reinterpret_cast<hipFunction_t>(found);
  return result;
}

KILN_FAKE_GPU_EXPORT hipError_t hipModuleLaunchKernel(hipFunction_t f, unsigned int grid_x,
                                                      unsigned int grid_y, unsigned int grid_z,
                                                      unsigned int block_x, unsigned int block_y,
                                                      unsigned int block_z, unsigned int shared_bytes,
                                                      hipStream_t stream, void **params, void **extra) {
  KILN_FAKE_BEGIN("hipModuleLaunchKernel", Needs::context);
  return call.result(launch(*call.state.state, core(f), grid_x, grid_y, grid_z, block_x, block_y,
                            block_z, shared_bytes, stream, params, extra));
}
