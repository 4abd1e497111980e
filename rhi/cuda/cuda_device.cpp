#include "kiln/rhi/cuda_device.h"

#include <fmt/format.h>

#include "cuda_driver.h"
#include "kiln/rhi/backend_registry.h"
#include "kiln/rhi/teardown_failures.h"

namespace kiln {
namespace {

using cuda::CudaDriver;

constexpr GpuDevice::EntryNames kEntryNames{"cuModuleLoadData", "cuModuleUnload",
                                                  "cuModuleGetFunction", "cuLaunchKernel",
                                                  "cuCtxSynchronize"};

/// A CUDA device with its primary context; modules, launches and the lost-device state are
/// GpuDevice's.
class CudaDevice final : public GpuDevice {
 public:
  CudaDevice(const CudaDriver *driver, CUdevice device, CUcontext context, int ordinal,
             std::string code_target)
      : GpuDevice(fmt::format("cuda:{}", ordinal), kEntryNames, std::move(code_target)),
        driver_(driver),
        device_(device),
        context_(context) {}
  ~CudaDevice() override;

  [[nodiscard]] Backend backend() const override { return Backend::cuda; }
  RhiExpected<MemoryInfo> memory_info() override;

 protected:
  RhiExpected<uint64_t> driver_allocate(const LlvmRuntimeAllocParams &params) override;
  RhiStatus driver_free(uint64_t address, uint64_t size_bytes) override;
  RhiStatus driver_copy_to_device(uint64_t dst, const void *src, uint64_t size_bytes) override;
  RhiStatus driver_copy_to_host(void *dst, uint64_t src, uint64_t size_bytes) override;
  RhiStatus driver_copy_device(uint64_t dst, uint64_t src, uint64_t size_bytes) override;
  RhiStatus driver_memset_zero(uint64_t dst, uint64_t size_bytes) override;

  RhiStatus to_status(int code, const char *site, const AllocationFigures *allocation) override {
    return cuda::to_rhi(driver_, code, site, name(), allocation);
  }
  RhiStatus make_current() override { return check(driver_->cuCtxSetCurrent(context_), "cuCtxSetCurrent"); }
  RhiStatus validate_image(std::span<const std::byte> image) override;
  int module_load(Handle *module, const void *image) override {
    return driver_->cuModuleLoadData(reinterpret_cast<CUmodule *>(module), image);
  }
  int module_unload(Handle module) override { return driver_->cuModuleUnload(static_cast<CUmodule>(module)); }
  int module_get_function(Handle *function, Handle module, const char *name) override {
    return driver_->cuModuleGetFunction(reinterpret_cast<CUfunction *>(function),
                                        static_cast<CUmodule>(module), name);
  }
  int launch(Handle function, unsigned grid_x, unsigned block_x, void **params) override {
    return driver_->cuLaunchKernel(static_cast<CUfunction>(function), grid_x, 1, 1, block_x, 1, 1, 0,
                                   nullptr, params, nullptr);
  }
  int device_synchronize() override { return driver_->cuCtxSynchronize(); }

 private:
  const CudaDriver *driver_;
  CUdevice device_;
  CUcontext context_;
};

/// A release the driver refuses leaves the primary context retained, and with it everything
/// allocated in it: recorded (teardown_failures.h), since a destructor cannot return it.
CudaDevice::~CudaDevice() {
  unload_all_modules("~CudaDevice");
  if (crossed_fork()) return;  // the context is the parent's
  const CUresult code = driver_->cuDevicePrimaryCtxRelease_v2(device_);
  if (code != cuda::kSuccess) try {
      record_teardown_failure(fmt::format(
          "{}: cuDevicePrimaryCtxRelease_v2 failed with {} while kiln released the device: its "
          "primary context stays retained, and the memory allocated in it (kiln's device heap "
          "and launch buffers, arrays not freed) stays held on the device until the process exits",
          name(), cuda::error_name(driver_, code)));
    } catch (...) {  // no memory for the message: the report is lost, never the process
    }
}

RhiExpected<LlvmDevice::MemoryInfo> CudaDevice::memory_info() {
  KILN_RETURN_IF_ERROR(enter("cuMemGetInfo_v2"));
  size_t free_bytes = 0, total_bytes = 0;
  KILN_RETURN_IF_ERROR(check(driver_->cuMemGetInfo_v2(&free_bytes, &total_bytes), "cuMemGetInfo_v2"));
  return MemoryInfo{free_bytes, total_bytes};
}

RhiExpected<uint64_t> CudaDevice::driver_allocate(const LlvmRuntimeAllocParams &params) {
  KILN_RETURN_IF_ERROR(enter("cuMemAlloc_v2"));
  CUdeviceptr ptr = 0;
  const CUresult code = driver_->cuMemAlloc_v2(&ptr, params.size_bytes);  // before ptr is read
  return allocated(code, "cuMemAlloc_v2", ptr, params);
}

RhiStatus CudaDevice::driver_free(uint64_t address, uint64_t) {
  KILN_RETURN_IF_ERROR(enter_to_release("cuMemFree_v2"));
  return check(driver_->cuMemFree_v2(address), "cuMemFree_v2");
}

RhiStatus CudaDevice::driver_copy_to_device(uint64_t dst, const void *src, uint64_t size_bytes) {
  KILN_RETURN_IF_ERROR(enter("cuMemcpyHtoD_v2"));
  return check(driver_->cuMemcpyHtoD_v2(dst, src, size_bytes), "cuMemcpyHtoD_v2");
}

RhiStatus CudaDevice::driver_copy_to_host(void *dst, uint64_t src, uint64_t size_bytes) {
  KILN_RETURN_IF_ERROR(enter("cuMemcpyDtoH_v2"));
  return check(driver_->cuMemcpyDtoH_v2(dst, src, size_bytes), "cuMemcpyDtoH_v2");
}

RhiStatus CudaDevice::driver_copy_device(uint64_t dst, uint64_t src, uint64_t size_bytes) {
  KILN_RETURN_IF_ERROR(enter("cuMemcpyDtoD_v2"));
  return check(driver_->cuMemcpyDtoD_v2(dst, src, size_bytes), "cuMemcpyDtoD_v2");
}

RhiStatus CudaDevice::driver_memset_zero(uint64_t dst, uint64_t size_bytes) {
  KILN_RETURN_IF_ERROR(enter("cuMemsetD8_v2"));
  return check(driver_->cuMemsetD8_v2(dst, 0, size_bytes), "cuMemsetD8_v2");
}

RhiStatus CudaDevice::validate_image(std::span<const std::byte> image) {
  if (image.empty() || image.back() != std::byte{0})
    return std::unexpected(failure(RhiResult::invalid_usage, "cuModuleLoadData",
                                   "a PTX image must be NUL-terminated text"));
  return {};
}

/// "sm_<major><minor>" from the device's compute capability (sm_90 for 9.0, sm_100 for 10.0).
/// Errors: the driver's answer to cuDeviceGetAttribute, mapped by cuda::to_rhi.
RhiExpected<std::string> sm_target(const CudaDriver *driver, CUdevice handle, const std::string &device) {
  int major = 0, minor = 0;
  KILN_RETURN_IF_ERROR(cuda::to_rhi(
      driver, driver->cuDeviceGetAttribute(&major, cuda::kDeviceAttributeComputeCapabilityMajor, handle),
      "cuDeviceGetAttribute", device));
  KILN_RETURN_IF_ERROR(cuda::to_rhi(
      driver, driver->cuDeviceGetAttribute(&minor, cuda::kDeviceAttributeComputeCapabilityMinor, handle),
      "cuDeviceGetAttribute", device));
  if (major <= 0 || minor < 0 || minor > 9)
    return std::unexpected(make_failure(
        RhiResult::not_supported, device, "cuDeviceGetAttribute",
        fmt::format("the driver reports compute capability {}.{}, which is no SM version", major, minor)));
  return fmt::format("sm_{}{}", major, minor);
}

}  // namespace

RhiExpected<std::unique_ptr<GpuDevice>> create_cuda_device(int ordinal) {
  KILN_ASSIGN_OR_RETURN(const CudaDriver *driver, CudaDriver::load());
  const std::string device = fmt::format("cuda:{}", ordinal);
  const auto add_library = [&](Failure f) {
    f.detail += fmt::format(" (driver library {})", driver->library);
    return std::unexpected(std::move(f));
  };
  if (auto s = cuda::to_rhi(driver, driver->cuInit(0), "cuInit", device); !s) return add_library(s.error());
  int count = 0;
  if (auto s = cuda::to_rhi(driver, driver->cuDeviceGetCount(&count), "cuDeviceGetCount", device); !s)
    return add_library(s.error());
  if (ordinal < 0 || ordinal >= count)
    return std::unexpected(make_failure(
        RhiResult::not_supported, device, "cuDeviceGet",
        fmt::format("no CUDA device {}: the driver {} reports {} device(s)", ordinal, driver->library, count)));
  CUdevice handle = 0;
  if (auto s = cuda::to_rhi(driver, driver->cuDeviceGet(&handle, ordinal), "cuDeviceGet", device); !s)
    return add_library(s.error());
  auto target = sm_target(driver, handle, device);
  if (!target) return add_library(target.error());
  CUcontext context = nullptr;
  if (auto s = cuda::to_rhi(driver, driver->cuDevicePrimaryCtxRetain(&context, handle),
                            "cuDevicePrimaryCtxRetain", device);
      !s)
    return add_library(s.error());
  return std::unique_ptr<GpuDevice>(new CudaDevice(driver, handle, context, ordinal, std::move(*target)));
}

/// The registry's factory for Backend::cuda (backends.inc): GPU options.ordinal.
RhiExpected<std::unique_ptr<LlvmDevice>> make_cuda_device(const DeviceOptions &options) {
  KILN_ASSIGN_OR_RETURN(auto device, create_cuda_device(options.ordinal));
  return std::unique_ptr<LlvmDevice>(std::move(device));
}

}  // namespace kiln
