// The few HIP runtime API types and hipError_t values kiln uses, declared here so kiln builds
// without ROCm. Values and signatures follow the HIP runtime API (hip/hip_runtime_api.h, enum
// hipError_t; checked against Debian 12's libamdhip64-dev 5.2); the fake HIP runtime in
// test/fake_hip implements the same signatures.
#ifndef KILN_RHI_HIP_TYPES_H_
#define KILN_RHI_HIP_TYPES_H_

#include <cstddef>

#include "hip_device_properties.h"

extern "C" {

typedef int hipError_t;  // an enum in hip_runtime_api.h; an int has the same ABI
typedef void *hipDeviceptr_t;
typedef struct ihipModule_t *hipModule_t;
typedef struct ihipModuleSymbol_t *hipFunction_t;
typedef struct ihipStream_t *hipStream_t;

}  // extern "C"

namespace kiln::hip {

// hipError_t values kiln names (hip_runtime_api.h, enum hipError_t).
inline constexpr hipError_t kSuccess = 0;
inline constexpr hipError_t kErrorInvalidValue = 1;
inline constexpr hipError_t kErrorOutOfMemory = 2;
inline constexpr hipError_t kErrorNotInitialized = 3;
inline constexpr hipError_t kErrorDeinitialized = 4;
inline constexpr hipError_t kErrorInvalidConfiguration = 9;
inline constexpr hipError_t kErrorInvalidSymbol = 13;
inline constexpr hipError_t kErrorInvalidDevicePointer = 17;
inline constexpr hipError_t kErrorInsufficientDriver = 35;
inline constexpr hipError_t kErrorPriorLaunchFailure = 53;
inline constexpr hipError_t kErrorInvalidDeviceFunction = 98;
inline constexpr hipError_t kErrorNoDevice = 100;
inline constexpr hipError_t kErrorInvalidDevice = 101;
inline constexpr hipError_t kErrorInvalidImage = 200;
inline constexpr hipError_t kErrorInvalidContext = 201;
inline constexpr hipError_t kErrorNoBinaryForGpu = 209;
inline constexpr hipError_t kErrorEccNotCorrectable = 214;
inline constexpr hipError_t kErrorInvalidKernelFile = 218;
inline constexpr hipError_t kErrorSharedObjectSymbolNotFound = 302;
inline constexpr hipError_t kErrorSharedObjectInitFailed = 303;
inline constexpr hipError_t kErrorInvalidHandle = 400;
inline constexpr hipError_t kErrorNotFound = 500;
inline constexpr hipError_t kErrorIllegalAddress = 700;
inline constexpr hipError_t kErrorLaunchOutOfResources = 701;
inline constexpr hipError_t kErrorLaunchTimeOut = 702;
inline constexpr hipError_t kErrorContextIsDestroyed = 709;
inline constexpr hipError_t kErrorAssert = 710;
inline constexpr hipError_t kErrorLaunchFailure = 719;
inline constexpr hipError_t kErrorNotSupported = 801;
inline constexpr hipError_t kErrorUnknown = 999;
inline constexpr hipError_t kErrorRuntimeMemory = 1052;
inline constexpr hipError_t kErrorRuntimeOther = 1053;

}  // namespace kiln::hip

#endif  // KILN_RHI_HIP_TYPES_H_
