// The only place a hipError_t becomes an RhiResult.
#include "hip_runtime.h"
#include "src/driver_loader.h"

namespace kiln::hip {
namespace {

struct Code {
  hipError_t value;
  const char *name;
  RhiResult result;
};

// Codes kiln classifies, with the runtime's names (hip_runtime_api.h, enum hipError_t).
constexpr Code kCodes[] = {
    // kiln checks every argument before it calls the driver, so a value the driver refuses is
    // a fault of kiln or of the driver, never the caller's usage: RuntimeFaultError.
    {kErrorInvalidValue, "hipErrorInvalidValue", RhiResult::error},
    {kErrorOutOfMemory, "hipErrorOutOfMemory", RhiResult::out_of_memory},
    {kErrorNotInitialized, "hipErrorNotInitialized", RhiResult::not_supported},
    {kErrorDeinitialized, "hipErrorDeinitialized", RhiResult::not_supported},
    {kErrorInsufficientDriver, "hipErrorInsufficientDriver", RhiResult::not_supported},
    {kErrorNoDevice, "hipErrorNoDevice", RhiResult::not_supported},
    {kErrorInvalidDevice, "hipErrorInvalidDevice", RhiResult::not_supported},
    {kErrorNoBinaryForGpu, "hipErrorNoBinaryForGpu", RhiResult::not_supported},
    {kErrorNotSupported, "hipErrorNotSupported", RhiResult::not_supported},
    {kErrorInvalidConfiguration, "hipErrorInvalidConfiguration", RhiResult::error},
    {kErrorInvalidSymbol, "hipErrorInvalidSymbol", RhiResult::error},
    {kErrorInvalidDevicePointer, "hipErrorInvalidDevicePointer", RhiResult::error},
    {kErrorInvalidDeviceFunction, "hipErrorInvalidDeviceFunction", RhiResult::error},
    {kErrorInvalidImage, "hipErrorInvalidImage", RhiResult::error},
    {kErrorInvalidContext, "hipErrorInvalidContext", RhiResult::error},
    {kErrorInvalidKernelFile, "hipErrorInvalidKernelFile", RhiResult::error},
    {kErrorSharedObjectSymbolNotFound, "hipErrorSharedObjectSymbolNotFound", RhiResult::error},
    {kErrorSharedObjectInitFailed, "hipErrorSharedObjectInitFailed", RhiResult::error},
    {kErrorInvalidHandle, "hipErrorInvalidHandle", RhiResult::error},
    {kErrorNotFound, "hipErrorNotFound", RhiResult::error},
    {kErrorLaunchOutOfResources, "hipErrorLaunchOutOfResources", RhiResult::error},
    {kErrorRuntimeMemory, "hipErrorRuntimeMemory", RhiResult::error},
    {kErrorRuntimeOther, "hipErrorRuntimeOther", RhiResult::error},
    {kErrorUnknown, "hipErrorUnknown", RhiResult::error},
    // Sticky faults: the device (its queues) is unusable after them.
    {kErrorPriorLaunchFailure, "hipErrorPriorLaunchFailure", RhiResult::device_lost},
    {kErrorEccNotCorrectable, "hipErrorECCNotCorrectable", RhiResult::device_lost},
    {kErrorIllegalAddress, "hipErrorIllegalAddress", RhiResult::device_lost},
    {kErrorLaunchTimeOut, "hipErrorLaunchTimeOut", RhiResult::device_lost},
    {kErrorContextIsDestroyed, "hipErrorContextIsDestroyed", RhiResult::device_lost},
    {kErrorAssert, "hipErrorAssert", RhiResult::device_lost},
    {kErrorLaunchFailure, "hipErrorLaunchFailure", RhiResult::device_lost},
};

const Code *find(hipError_t result) {
  for (const Code &c : kCodes)
    if (c.value == result) return &c;
  return nullptr;
}

}  // namespace

const char *error_name(const HipRuntime *runtime, hipError_t result) {
  if (const Code *c = find(result)) return c->name;
  // The runtime is never closed, so the name it returns stays valid.
  if (runtime != nullptr && runtime->hipGetErrorName != nullptr)
    if (const char *name = runtime->hipGetErrorName(result); name != nullptr) return name;
  return "unrecognized hipError_t";
}

RhiStatus to_rhi(const HipRuntime *runtime, hipError_t result, const char *site, std::string device,
                 const AllocationFigures *allocation) {
  if (result == kSuccess) return {};
  const Code *code = find(result);
  return std::unexpected(driver_call_failure(code != nullptr ? code->result : RhiResult::error,
                                             std::move(device), site, error_name(runtime, result),
                                             static_cast<int>(result), allocation));
}

}  // namespace kiln::hip
