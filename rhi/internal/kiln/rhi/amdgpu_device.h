#ifndef KILN_RHI_AMDGPU_DEVICE_H_
#define KILN_RHI_AMDGPU_DEVICE_H_

#include <memory>

#include "kiln/rhi/gpu_device.h"

namespace kiln {

/// Opens AMD GPU `ordinal` through the HIP runtime loaded at run time (KILN_HIP_RUNTIME, else
/// libamdhip64.so, .so.6, .so.5), made current with hipSetDevice on every calling thread, on the
/// null stream. Memory info is hipMemGetInfo; allocations are hipMalloc; code objects (HSACO
/// ELF images) load with hipModuleLoadData; launches (hipModuleLaunchKernel) wait for completion.
/// Errors: not_supported (no runtime library, no device, runtime too old: the failure names the
/// library and the runtime's answer, e.g. hipErrorNoDevice), device_lost, error.
[[nodiscard]] RhiExpected<std::unique_ptr<GpuDevice>> create_amdgpu_device(int ordinal = 0);

}  // namespace kiln

#endif  // KILN_RHI_AMDGPU_DEVICE_H_
