// Compile-time check: the offset at which kiln reads gcnArchName (rhi/amdgpu/hip_device_properties.h)
// is the one in ROCm's hipDeviceProp_t, and kiln's buffer holds the whole struct. Built only where
// hip/hip_runtime_api.h is installed (libamdhip64-dev, which scripts/install-deps.sh installs);
// a mismatch fails the build.
#include <hip/hip_runtime_api.h>

#include <cstddef>

#include "hip_device_properties.h"

static_assert(offsetof(hipDeviceProp_t, gcnArchName) == kiln::hip::kDevicePropertiesGcnArchNameOffset,
              "gcnArchName moved in hipDeviceProp_t: update kDevicePropertiesGcnArchNameOffset");
static_assert(sizeof(hipDeviceProp_t::gcnArchName) == kiln::hip::kGcnArchNameBytes);
static_assert(sizeof(hipDeviceProp_t) <= kiln::hip::kDevicePropertiesBufferBytes,
              "hipDeviceProp_t outgrew the buffer kiln passes to hipGetDeviceProperties");
