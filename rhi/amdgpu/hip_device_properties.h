// Where kiln reads the processor name in the HIP runtime's device properties. Apart from
// hip_types.h so that test/unit/check_hip_device_properties.cpp can check it against ROCm's own
// header (whose hipError_t is an enum, not hip_types.h's int).
#ifndef KILN_RHI_HIP_DEVICE_PROPERTIES_H_
#define KILN_RHI_HIP_DEVICE_PROPERTIES_H_

#include <cstddef>

namespace kiln::hip {

// hipGetDeviceProperties fills a hipDeviceProp_t in the layout HIP 5 defined and HIP 6 keeps under
// that symbol (as hipDeviceProp_tR0000; HIP 6 headers map the name to a new
// hipGetDevicePropertiesR0600). kiln reads one field of it, the processor name gcnArchName
// ("gfx90a:sramecc+:xnack-"), at its offset in that layout; the struct is 792 bytes in HIP 5.2
// and kiln passes a larger zeroed buffer, so fields a runtime appends cannot overrun it. The
// offset is checked against hip_runtime_api.h by test/unit/check_hip_device_properties.cpp
// wherever the header is installed (libamdhip64-dev).
inline constexpr std::size_t kDevicePropertiesBufferBytes = 4096;
inline constexpr std::size_t kDevicePropertiesGcnArchNameOffset = 396;
inline constexpr std::size_t kGcnArchNameBytes = 256;

}  // namespace kiln::hip

#endif  // KILN_RHI_HIP_DEVICE_PROPERTIES_H_
