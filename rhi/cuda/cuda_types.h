// The few CUDA driver API types kiln uses, declared here so kiln builds without the CUDA toolkit.
// Values and signatures follow the CUDA Driver API reference (cuda.h); the fake driver in
// test/fake_cuda implements the same signatures.
#ifndef KILN_RHI_CUDA_TYPES_H_
#define KILN_RHI_CUDA_TYPES_H_

#include <cstddef>

extern "C" {

typedef int CUresult;  // an enum in cuda.h; an int has the same ABI
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;

}  // extern "C"

namespace kiln::cuda {

// CUdevice_attribute values kiln asks cuDeviceGetAttribute for (CUDA Driver API, enum
// CUdevice_attribute_enum; an int has the enum's ABI).
inline constexpr int kDeviceAttributeComputeCapabilityMajor = 75;
inline constexpr int kDeviceAttributeComputeCapabilityMinor = 76;

// CUresult values kiln names (CUDA Driver API, enum cudaError_enum).
inline constexpr CUresult kSuccess = 0;
inline constexpr CUresult kErrorInvalidValue = 1;
inline constexpr CUresult kErrorOutOfMemory = 2;
inline constexpr CUresult kErrorNotInitialized = 3;
inline constexpr CUresult kErrorDeinitialized = 4;
inline constexpr CUresult kErrorStubLibrary = 34;
inline constexpr CUresult kErrorInsufficientDriver = 35;
inline constexpr CUresult kErrorCallRequiresNewerDriver = 36;
inline constexpr CUresult kErrorDeviceUnavailable = 46;
inline constexpr CUresult kErrorNoDevice = 100;
inline constexpr CUresult kErrorInvalidDevice = 101;
inline constexpr CUresult kErrorInvalidImage = 200;
inline constexpr CUresult kErrorInvalidContext = 201;
inline constexpr CUresult kErrorNoBinaryForGpu = 209;
inline constexpr CUresult kErrorEccUncorrectable = 214;
inline constexpr CUresult kErrorInvalidPtx = 218;
inline constexpr CUresult kErrorUnsupportedPtxVersion = 222;
inline constexpr CUresult kErrorInvalidHandle = 400;
inline constexpr CUresult kErrorNotFound = 500;
inline constexpr CUresult kErrorIllegalAddress = 700;
inline constexpr CUresult kErrorLaunchOutOfResources = 701;
inline constexpr CUresult kErrorLaunchTimeout = 702;
inline constexpr CUresult kErrorContextIsDestroyed = 709;
inline constexpr CUresult kErrorAssert = 710;
inline constexpr CUresult kErrorHardwareStackError = 714;
inline constexpr CUresult kErrorIllegalInstruction = 715;
inline constexpr CUresult kErrorMisalignedAddress = 716;
inline constexpr CUresult kErrorInvalidAddressSpace = 717;
inline constexpr CUresult kErrorInvalidPc = 718;
inline constexpr CUresult kErrorLaunchFailed = 719;
inline constexpr CUresult kErrorNotPermitted = 800;
inline constexpr CUresult kErrorNotSupported = 801;
inline constexpr CUresult kErrorSystemNotReady = 802;
inline constexpr CUresult kErrorSystemDriverMismatch = 803;
inline constexpr CUresult kErrorCompatNotSupportedOnDevice = 804;
inline constexpr CUresult kErrorUnknown = 999;

}  // namespace kiln::cuda

#endif  // KILN_RHI_CUDA_TYPES_H_
