// GpuDevice: what the CUDA and HIP backends share beyond LlvmDevice: code objects and launches.
#ifndef KILN_RHI_GPU_DEVICE_H_
#define KILN_RHI_GPU_DEVICE_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "kiln/rhi/device.h"

namespace kiln {

/// A device with its own memory and its own kernels, loaded as code objects (PTX, HSACO).
/// Thread-safe.
class GpuDevice : public LlvmDevice {
 public:
  [[nodiscard]] bool host_addressable() const final { return false; }

  /// The processor this device runs code for, read from the driver when the device was made:
  /// "sm_<major><minor>" from the CUDA compute capability ("sm_90" on an H100/H200), or the gfx
  /// processor of HIP's gcnArchName without its feature suffix ("gfx942" for
  /// "gfx942:sramecc+:xnack-"). The executor compiles or picks its code object for it.
  [[nodiscard]] virtual std::string_view code_target() const = 0;

  /// Loads a code object; returns a module id. Errors: invalid_usage (not an image of this
  /// backend's kind: PTX text for CUDA, an AMDGPU ELF for HIP), error (the driver rejected the
  /// image, e.g. CUDA_ERROR_INVALID_PTX), not_supported (no binary for this GPU),
  /// out_of_memory, device_lost.
  [[nodiscard]] virtual RhiExpected<uint64_t> load_module(std::span<const std::byte> image) = 0;
  /// Unloads a module. Errors: invalid_usage (unknown id).
  [[nodiscard]] virtual RhiStatus unload_module(uint64_t module) = 0;
  /// Launches `kernel` of `module` on grid_x blocks of block_x threads with `params` (pointers to
  /// each argument's value) and waits for it. A sticky fault marks the device lost and returns
  /// device_lost; every later call fails fast with it.
  [[nodiscard]] virtual RhiStatus launch_kernel(uint64_t module, const std::string &kernel,
                                                unsigned grid_x, unsigned block_x,
                                                std::span<void *> params) = 0;

 protected:
  using LlvmDevice::LlvmDevice;
};

}  // namespace kiln

#endif  // KILN_RHI_GPU_DEVICE_H_
