// The only place a CUresult becomes an RhiResult.
#include "cuda_driver.h"
#include "src/driver_loader.h"

namespace kiln::cuda {
namespace {

struct Code {
  CUresult value;
  const char *name;
  RhiResult result;
};

// Codes kiln classifies, with the driver's names (CUDA Driver API reference, cudaError_enum).
constexpr Code kCodes[] = {
    // kiln checks every argument before it calls the driver, so a value the driver refuses is
    // a fault of kiln or of the driver, never the caller's usage: RuntimeFaultError.
    {kErrorInvalidValue, "CUDA_ERROR_INVALID_VALUE", RhiResult::error},
    {kErrorOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY", RhiResult::out_of_memory},
    {kErrorNotInitialized, "CUDA_ERROR_NOT_INITIALIZED", RhiResult::not_supported},
    {kErrorDeinitialized, "CUDA_ERROR_DEINITIALIZED", RhiResult::not_supported},
    {kErrorStubLibrary, "CUDA_ERROR_STUB_LIBRARY", RhiResult::not_supported},
    {kErrorInsufficientDriver, "CUDA_ERROR_INSUFFICIENT_DRIVER", RhiResult::not_supported},
    {kErrorCallRequiresNewerDriver, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER", RhiResult::not_supported},
    {kErrorDeviceUnavailable, "CUDA_ERROR_DEVICE_UNAVAILABLE", RhiResult::not_supported},
    {kErrorNoDevice, "CUDA_ERROR_NO_DEVICE", RhiResult::not_supported},
    {kErrorInvalidDevice, "CUDA_ERROR_INVALID_DEVICE", RhiResult::not_supported},
    {kErrorSystemDriverMismatch, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", RhiResult::not_supported},
    {kErrorCompatNotSupportedOnDevice, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", RhiResult::not_supported},
    {kErrorNotSupported, "CUDA_ERROR_NOT_SUPPORTED", RhiResult::not_supported},
    {kErrorSystemNotReady, "CUDA_ERROR_SYSTEM_NOT_READY", RhiResult::not_supported},
    {kErrorNoBinaryForGpu, "CUDA_ERROR_NO_BINARY_FOR_GPU", RhiResult::not_supported},
    {kErrorUnsupportedPtxVersion, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION", RhiResult::not_supported},
    {kErrorInvalidImage, "CUDA_ERROR_INVALID_IMAGE", RhiResult::error},
    {kErrorInvalidPtx, "CUDA_ERROR_INVALID_PTX", RhiResult::error},
    {kErrorInvalidContext, "CUDA_ERROR_INVALID_CONTEXT", RhiResult::error},
    {kErrorInvalidHandle, "CUDA_ERROR_INVALID_HANDLE", RhiResult::error},
    {kErrorNotFound, "CUDA_ERROR_NOT_FOUND", RhiResult::error},
    {kErrorNotPermitted, "CUDA_ERROR_NOT_PERMITTED", RhiResult::error},
    {kErrorLaunchOutOfResources, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", RhiResult::error},
    {kErrorContextIsDestroyed, "CUDA_ERROR_CONTEXT_IS_DESTROYED", RhiResult::device_lost},
    // Sticky faults: the context is unusable after them.
    {kErrorEccUncorrectable, "CUDA_ERROR_ECC_UNCORRECTABLE", RhiResult::device_lost},
    {kErrorIllegalAddress, "CUDA_ERROR_ILLEGAL_ADDRESS", RhiResult::device_lost},
    {kErrorAssert, "CUDA_ERROR_ASSERT", RhiResult::device_lost},
    {kErrorLaunchTimeout, "CUDA_ERROR_LAUNCH_TIMEOUT", RhiResult::device_lost},
    {kErrorHardwareStackError, "CUDA_ERROR_HARDWARE_STACK_ERROR", RhiResult::device_lost},
    {kErrorIllegalInstruction, "CUDA_ERROR_ILLEGAL_INSTRUCTION", RhiResult::device_lost},
    {kErrorMisalignedAddress, "CUDA_ERROR_MISALIGNED_ADDRESS", RhiResult::device_lost},
    {kErrorInvalidAddressSpace, "CUDA_ERROR_INVALID_ADDRESS_SPACE", RhiResult::device_lost},
    {kErrorInvalidPc, "CUDA_ERROR_INVALID_PC", RhiResult::device_lost},
    {kErrorLaunchFailed, "CUDA_ERROR_LAUNCH_FAILED", RhiResult::device_lost},
    {kErrorUnknown, "CUDA_ERROR_UNKNOWN", RhiResult::error},
};

const Code *find(CUresult result) {
  for (const Code &c : kCodes)
    if (c.value == result) return &c;
  return nullptr;
}

}  // namespace

const char *error_name(const CudaDriver *driver, CUresult result) {
  if (const Code *c = find(result)) return c->name;
  const char *name = nullptr;
  // The driver is never closed, so the name it returns stays valid.
  if (driver != nullptr && driver->cuGetErrorName != nullptr &&
      driver->cuGetErrorName(result, &name) == kSuccess && name != nullptr)
    return name;
  return "unrecognized CUresult";
}

RhiStatus to_rhi(const CudaDriver *driver, CUresult result, const char *site, std::string device,
                 const AllocationFigures *allocation) {
  if (result == kSuccess) return {};
  const Code *code = find(result);
  return std::unexpected(driver_call_failure(code != nullptr ? code->result : RhiResult::error,
                                             std::move(device), site, error_name(driver, result),
                                             static_cast<int>(result), allocation));
}

}  // namespace kiln::cuda
