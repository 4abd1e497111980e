#ifndef KILN_RHI_CUDA_DEVICE_H_
#define KILN_RHI_CUDA_DEVICE_H_

#include <memory>

#include "kiln/rhi/gpu_device.h"

namespace kiln {

/// Opens CUDA device `ordinal` through the driver loaded at run time (KILN_CUDA_DRIVER, else
/// libcuda.so.1), with its primary context and the default stream. Memory info is
/// cuMemGetInfo_v2; allocations are cuMemAlloc_v2; launches wait for completion.
/// Errors: not_supported (no driver library, stub library, no device, driver too old: the
/// failure names the library and the driver's answer), device_lost, error.
[[nodiscard]] RhiExpected<std::unique_ptr<GpuDevice>> create_cuda_device(int ordinal = 0);

}  // namespace kiln

#endif  // KILN_RHI_CUDA_DEVICE_H_
