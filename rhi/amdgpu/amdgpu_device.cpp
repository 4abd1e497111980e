#include "kiln/rhi/amdgpu_device.h"

#include <cstring>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "hip_runtime.h"
#include "kiln/rhi/backend_registry.h"
#include "kiln/rhi/teardown_failures.h"

namespace kiln {
namespace {

using hip::HipRuntime;

constexpr GpuDevice::EntryNames kEntryNames{"hipModuleLoadData", "hipModuleUnload",
                                                  "hipModuleGetFunction", "hipModuleLaunchKernel",
                                                  "hipDeviceSynchronize"};

void *pointer(uint64_t address) { return reinterpret_cast<void *>(static_cast<uintptr_t>(address)); }

/// An AMD GPU through HIP; modules, launches and the lost-device state are GpuDevice's.
class AmdgpuDevice final : public GpuDevice {
 public:
  AmdgpuDevice(const HipRuntime *runtime, int ordinal, std::string code_target)
      : GpuDevice(fmt::format("amdgpu:{}", ordinal), kEntryNames, std::move(code_target)),
        runtime_(runtime),
        ordinal_(ordinal) {}
  /// A lost device is reset when its last user lets go, as CUDA destroys a primary context on
  /// its last release: a sticky fault stays with the HIP runtime's device until hipDeviceReset,
  /// so without it a new executor would find the device lost again. (The reset also destroys
  /// what another executor of this process holds on the device, all of it lost with the device.)
  /// A reset the runtime refuses is recorded (teardown_failures.h).
  ~AmdgpuDevice() override {
    unload_all_modules("~AmdgpuDevice");
    if (!resources_lost() || crossed_fork()) return;  // an injected loss resets nothing
    (void)runtime_->hipSetDevice(ordinal_);  // may answer the sticky fault: reset anyway
    const hipError_t code = runtime_->hipDeviceReset();
    if (code != hip::kSuccess) try {
        record_teardown_failure(fmt::format(
            "{}: hipDeviceReset failed with {} while kiln released the lost device: the device "
            "keeps its sticky fault and the memory allocated on it until the process exits",
            name(), hip::error_name(runtime_, code)));
      } catch (...) {  // no memory for the message: the report is lost, never the process
      }
  }

  [[nodiscard]] Backend backend() const override { return Backend::amdgpu; }
  RhiExpected<MemoryInfo> memory_info() override;

 protected:
  RhiExpected<uint64_t> driver_allocate(const LlvmRuntimeAllocParams &params) override;
  RhiStatus driver_free(uint64_t address, uint64_t size_bytes) override;
  RhiStatus driver_copy_to_device(uint64_t dst, const void *src, uint64_t size_bytes) override;
  RhiStatus driver_copy_to_host(void *dst, uint64_t src, uint64_t size_bytes) override;
  RhiStatus driver_copy_device(uint64_t dst, uint64_t src, uint64_t size_bytes) override;
  RhiStatus driver_memset_zero(uint64_t dst, uint64_t size_bytes) override;

  RhiStatus to_status(int code, const char *site, const AllocationFigures *allocation) override {
    return hip::to_rhi(runtime_, code, site, name(), allocation);
  }
  // HIP's current device is per thread, so every call that reaches the runtime sets it first.
  RhiStatus make_current() override { return check(runtime_->hipSetDevice(ordinal_), "hipSetDevice"); }
  RhiStatus validate_image(std::span<const std::byte> image) override;
  int module_load(Handle *module, const void *image) override {
    return runtime_->hipModuleLoadData(reinterpret_cast<hipModule_t *>(module), image);
  }
  int module_unload(Handle module) override { return runtime_->hipModuleUnload(static_cast<hipModule_t>(module)); }
  int module_get_function(Handle *function, Handle module, const char *name) override {
    return runtime_->hipModuleGetFunction(reinterpret_cast<hipFunction_t *>(function),
                                          static_cast<hipModule_t>(module), name);
  }
  int launch(Handle function, unsigned grid_x, unsigned block_x, void **params) override {
    return runtime_->hipModuleLaunchKernel(static_cast<hipFunction_t>(function), grid_x, 1, 1, block_x, 1,
                                           1, 0, nullptr, params, nullptr);
  }
  int device_synchronize() override { return runtime_->hipDeviceSynchronize(); }

 private:
  const HipRuntime *runtime_;
  int ordinal_;
};

RhiExpected<LlvmDevice::MemoryInfo> AmdgpuDevice::memory_info() {
  KILN_RETURN_IF_ERROR(enter("hipMemGetInfo"));
  size_t free_bytes = 0, total_bytes = 0;
  KILN_RETURN_IF_ERROR(check(runtime_->hipMemGetInfo(&free_bytes, &total_bytes), "hipMemGetInfo"));
  return MemoryInfo{free_bytes, total_bytes};
}

RhiExpected<uint64_t> AmdgpuDevice::driver_allocate(const LlvmRuntimeAllocParams &params) {
  KILN_RETURN_IF_ERROR(enter("hipMalloc"));
  void *ptr = nullptr;
  const hipError_t code = runtime_->hipMalloc(&ptr, params.size_bytes);
  return allocated(code, "hipMalloc", reinterpret_cast<uintptr_t>(ptr), params);
}

RhiStatus AmdgpuDevice::driver_free(uint64_t address, uint64_t) {
  KILN_RETURN_IF_ERROR(enter_to_release("hipFree"));
  return check(runtime_->hipFree(pointer(address)), "hipFree");
}

RhiStatus AmdgpuDevice::driver_copy_to_device(uint64_t dst, const void *src, uint64_t size_bytes) {
  KILN_RETURN_IF_ERROR(enter("hipMemcpyHtoD"));
  // hipMemcpyHtoD takes a non-const source but only reads it.
  return check(runtime_->hipMemcpyHtoD(pointer(dst), const_cast<void *>(src), size_bytes), "hipMemcpyHtoD");
}

RhiStatus AmdgpuDevice::driver_copy_to_host(void *dst, uint64_t src, uint64_t size_bytes) {
  KILN_RETURN_IF_ERROR(enter("hipMemcpyDtoH"));
  return check(runtime_->hipMemcpyDtoH(dst, pointer(src), size_bytes), "hipMemcpyDtoH");
}

RhiStatus AmdgpuDevice::driver_copy_device(uint64_t dst, uint64_t src, uint64_t size_bytes) {
  KILN_RETURN_IF_ERROR(enter("hipMemcpyDtoD"));
  return check(runtime_->hipMemcpyDtoD(pointer(dst), pointer(src), size_bytes), "hipMemcpyDtoD");
}

RhiStatus AmdgpuDevice::driver_memset_zero(uint64_t dst, uint64_t size_bytes) {
  KILN_RETURN_IF_ERROR(enter("hipMemsetD8"));
  return check(runtime_->hipMemsetD8(pointer(dst), 0, size_bytes), "hipMemsetD8");
}

RhiStatus AmdgpuDevice::validate_image(std::span<const std::byte> image) {
  constexpr char kElfMagic[4] = {'\x7f', 'E', 'L', 'F'};
  if (image.size() < 64 || std::memcmp(image.data(), kElfMagic, sizeof kElfMagic) != 0)
    return std::unexpected(failure(RhiResult::invalid_usage, "hipModuleLoadData",
                                   "an AMDGPU code object must be an HSACO (ELF) image"));
  return {};
}

/// The gfx processor of device `ordinal`: hipGetDeviceProperties' gcnArchName up to its first
/// ':' ("gfx942" for "gfx942:sramecc+:xnack-"). Errors: the runtime's answer, mapped by
/// hip::to_rhi; not_supported when the name is not a gfx processor (a runtime whose properties
/// layout kiln does not know).
RhiExpected<std::string> gfx_target(const HipRuntime *runtime, int ordinal, const std::string &device) {
  std::vector<char> properties(hip::kDevicePropertiesBufferBytes, '\0');
  KILN_RETURN_IF_ERROR(hip::to_rhi(runtime, runtime->hipGetDeviceProperties(properties.data(), ordinal),
                                   "hipGetDeviceProperties", device));
  const char *field = properties.data() + hip::kDevicePropertiesGcnArchNameOffset;
  const std::string_view name(field, strnlen(field, hip::kGcnArchNameBytes));
  const std::string_view processor = name.substr(0, name.find(':'));
  const bool valid = processor.size() > 3 && processor.starts_with("gfx") &&
                     processor.find_first_not_of("0123456789abcdef", 3) == std::string_view::npos;
  if (!valid)
    return std::unexpected(make_failure(
        RhiResult::not_supported, device, "hipGetDeviceProperties",
        fmt::format("the HIP runtime's gcnArchName '{}' names no gfx processor (a properties layout "
                    "kiln does not know)",
                    name.substr(0, 64))));
  return std::string(processor);
}

}  // namespace

RhiExpected<std::unique_ptr<GpuDevice>> create_amdgpu_device(int ordinal) {
  KILN_ASSIGN_OR_RETURN(const HipRuntime *runtime, HipRuntime::load());
  const std::string device = fmt::format("amdgpu:{}", ordinal);
  const auto add_library = [&](Failure f) {
    f.detail += fmt::format(" (HIP runtime library {})", runtime->library);
    return std::unexpected(std::move(f));
  };
  if (auto s = hip::to_rhi(runtime, runtime->hipInit(0), "hipInit", device); !s) return add_library(s.error());
  int count = 0;
  if (auto s = hip::to_rhi(runtime, runtime->hipGetDeviceCount(&count), "hipGetDeviceCount", device); !s)
    return add_library(s.error());
  if (ordinal < 0 || ordinal >= count)
    return std::unexpected(make_failure(
        RhiResult::not_supported, device, "hipSetDevice",
        fmt::format("no AMD GPU {}: the HIP runtime {} reports {} device(s)", ordinal, runtime->library, count)));
  if (auto s = hip::to_rhi(runtime, runtime->hipSetDevice(ordinal), "hipSetDevice", device); !s)
    return add_library(s.error());
  auto target = gfx_target(runtime, ordinal, device);
  if (!target) return add_library(target.error());
  return std::unique_ptr<GpuDevice>(new AmdgpuDevice(runtime, ordinal, std::move(*target)));
}

/// The registry's factory for Backend::amdgpu (backends.inc): GPU options.ordinal.
RhiExpected<std::unique_ptr<LlvmDevice>> make_amdgpu_device(const DeviceOptions &options) {
  KILN_ASSIGN_OR_RETURN(auto device, create_amdgpu_device(options.ordinal));
  return std::unique_ptr<LlvmDevice>(std::move(device));
}

}  // namespace kiln
