#include "kiln/rhi/cuda_device.h"

#include <mutex>
#include <unordered_map>

#include <fmt/format.h>

#include "cuda_driver.h"

namespace kiln {
namespace {

using cuda::CudaDriver;

class CudaDevice final : public GpuDevice {
 public:
  CudaDevice(const CudaDriver *driver, CUdevice device, CUcontext context, int ordinal)
      : GpuDevice(fmt::format("cuda:{}", ordinal)), driver_(driver), device_(device), context_(context) {}
  ~CudaDevice() override;

  [[nodiscard]] Backend backend() const override { return Backend::cuda; }
  RhiExpected<MemoryInfo> memory_info() override;
  RhiStatus synchronize() override;
  RhiExpected<uint64_t> load_module(std::span<const std::byte> image) override;
  RhiStatus unload_module(uint64_t module) override;
  RhiStatus launch_kernel(uint64_t module, const std::string &kernel, unsigned grid_x,
                          unsigned block_x, std::span<void *> params) override;

 protected:
  RhiExpected<uint64_t> driver_allocate(const LlvmRuntimeAllocParams &params) override;
  RhiStatus driver_free(uint64_t address, uint64_t size_bytes) override;
  RhiStatus driver_copy_to_device(uint64_t dst, const void *src, uint64_t size_bytes) override;
  RhiStatus driver_copy_to_host(void *dst, uint64_t src, uint64_t size_bytes) override;
  RhiStatus driver_copy_device(uint64_t dst, uint64_t src, uint64_t size_bytes) override;
  RhiStatus driver_memset_zero(uint64_t dst, uint64_t size_bytes) override;

 private:
  // Maps a driver answer; a sticky fault marks the device lost.
  RhiStatus check(CUresult result, const char *site);
  // Makes the context current on the calling thread and fails fast on a lost device.
  RhiStatus enter(const char *site);

  const CudaDriver *driver_;
  CUdevice device_;
  CUcontext context_;
  std::mutex modules_mutex_;
  uint64_t next_module_ = 1;
  struct Module {
    CUmodule handle;
    std::unordered_map<std::string, CUfunction> functions;
  };
  std::unordered_map<uint64_t, Module> modules_;
};

RhiStatus CudaDevice::check(CUresult result, const char *site) {
  auto status = cuda::to_rhi(driver_, result, site, name());
  if (!status && status.error().result == RhiResult::device_lost) mark_lost(status.error());
  return status;
}

RhiStatus CudaDevice::enter(const char *site) {
  KILN_RETURN_IF_ERROR(check_alive(site));
  return check(driver_->cuCtxSetCurrent(context_), "cuCtxSetCurrent");
}

CudaDevice::~CudaDevice() {
  if (!is_lost() && enter("~CudaDevice")) {
    for (auto &[id, module] : modules_) (void)driver_->cuModuleUnload(module.handle);
  }
  (void)driver_->cuDevicePrimaryCtxRelease_v2(device_);
}

RhiExpected<Device::MemoryInfo> CudaDevice::memory_info() {
  KILN_RETURN_IF_ERROR(enter("cuMemGetInfo_v2"));
  size_t free_bytes = 0, total_bytes = 0;
  KILN_RETURN_IF_ERROR(check(driver_->cuMemGetInfo_v2(&free_bytes, &total_bytes), "cuMemGetInfo_v2"));
  return MemoryInfo{free_bytes, total_bytes};
}

RhiStatus CudaDevice::synchronize() {
  KILN_RETURN_IF_ERROR(enter("cuCtxSynchronize"));
  return check(driver_->cuCtxSynchronize(), "cuCtxSynchronize");
}

RhiExpected<uint64_t> CudaDevice::driver_allocate(const LlvmRuntimeAllocParams &params) {
  KILN_RETURN_IF_ERROR(enter("cuMemAlloc_v2"));
  CUdeviceptr ptr = 0;
  auto status = check(driver_->cuMemAlloc_v2(&ptr, params.size_bytes), "cuMemAlloc_v2");
  if (!status) {
    status.error().category = params.category;
    status.error().requested_bytes = params.size_bytes;
    return std::unexpected(std::move(status).error());
  }
  return static_cast<uint64_t>(ptr);
}

RhiStatus CudaDevice::driver_free(uint64_t address, uint64_t) {
  KILN_RETURN_IF_ERROR(enter("cuMemFree_v2"));
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

RhiExpected<uint64_t> CudaDevice::load_module(std::span<const std::byte> image) {
  KILN_RETURN_IF_ERROR(enter("cuModuleLoadData"));
  if (image.empty() || image.back() != std::byte{0})
    return std::unexpected(failure(RhiResult::invalid_usage, "cuModuleLoadData",
                                   "a PTX image must be NUL-terminated text"));
  CUmodule handle = nullptr;
  KILN_RETURN_IF_ERROR(check(driver_->cuModuleLoadData(&handle, image.data()), "cuModuleLoadData"));
  std::lock_guard lock(modules_mutex_);
  modules_.emplace(next_module_, Module{handle, {}});
  return next_module_++;
}

RhiStatus CudaDevice::unload_module(uint64_t module) {
  CUmodule handle = nullptr;
  {
    std::lock_guard lock(modules_mutex_);
    auto it = modules_.find(module);
    if (it == modules_.end())
      return std::unexpected(failure(RhiResult::invalid_usage, "cuModuleUnload",
                                     fmt::format("module {} is not loaded", module)));
    handle = it->second.handle;
    modules_.erase(it);
  }
  if (is_lost()) return {};
  KILN_RETURN_IF_ERROR(enter("cuModuleUnload"));
  return check(driver_->cuModuleUnload(handle), "cuModuleUnload");
}

RhiStatus CudaDevice::launch_kernel(uint64_t module, const std::string &kernel, unsigned grid_x,
                                    unsigned block_x, std::span<void *> params) {
  KILN_RETURN_IF_ERROR(enter("cuLaunchKernel"));
  CUfunction function = nullptr;
  {
    std::lock_guard lock(modules_mutex_);
    auto it = modules_.find(module);
    if (it == modules_.end())
      return std::unexpected(failure(RhiResult::invalid_usage, "cuLaunchKernel",
                                     fmt::format("module {} is not loaded", module)));
    auto &functions = it->second.functions;
    if (auto f = functions.find(kernel); f != functions.end()) {
      function = f->second;
    } else {
      auto status = check(driver_->cuModuleGetFunction(&function, it->second.handle, kernel.c_str()),
                          "cuModuleGetFunction");
      if (!status) {
        status.error().detail += fmt::format(" for kernel {}", kernel);
        return status;
      }
      functions.emplace(kernel, function);
    }
  }
  KILN_RETURN_IF_ERROR(check(driver_->cuLaunchKernel(function, grid_x, 1, 1, block_x, 1, 1, 0, nullptr,
                                                     params.data(), nullptr),
                             "cuLaunchKernel"));
  return check(driver_->cuCtxSynchronize(), "cuCtxSynchronize");
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
  CUcontext context = nullptr;
  if (auto s = cuda::to_rhi(driver, driver->cuDevicePrimaryCtxRetain(&context, handle),
                            "cuDevicePrimaryCtxRetain", device);
      !s)
    return add_library(s.error());
  return std::unique_ptr<GpuDevice>(new CudaDevice(driver, handle, context, ordinal));
}

}  // namespace kiln
