// Compile-time check: the offset at which kiln reads gcnArchName (rhi/amdgpu/hip_device_properties.h)
// is the one in ROCm's hipDeviceProp_t, and kiln's buffer holds the whole struct. Built only where
// hip/hip_runtime_api.h is installed (libamdhip64-dev, which scripts/install-deps.sh installs);
// a mismatch fails the build.
#include <hip/hip_runtime_api.h>

#include <cstddef>

#include "hip_device_properties.h"

// kiln calls the unversioned hipGetDeviceProperties symbol, which fills the HIP 5 layout: HIP 5's
// hipDeviceProp_t, kept in HIP 6 as hipDeviceProp_tR0000 (HIP 6 headers map hipDeviceProp_t to
// the new R0600 layout, which kiln never reads). Checked here against Debian 12's HIP 5.2 only.
#if defined(HIP_VERSION_MAJOR) && HIP_VERSION_MAJOR >= 6
#include <hip/hip_deprecated.h>
using Hip5DeviceProperties = hipDeviceProp_tR0000;
#else
using Hip5DeviceProperties = hipDeviceProp_t;
#endif

static_assert(offsetof(Hip5DeviceProperties, gcnArchName) == kiln::hip::kDevicePropertiesGcnArchNameOffset,
              "gcnArchName moved in hipDeviceProp_t: update kDevicePropertiesGcnArchNameOffset");
static_assert(sizeof(Hip5DeviceProperties::gcnArchName) == kiln::hip::kGcnArchNameBytes);
static_assert(sizeof(Hip5DeviceProperties) <= kiln::hip::kDevicePropertiesBufferBytes,
              "hipDeviceProp_t outgrew the buffer kiln passes to hipGetDeviceProperties");
