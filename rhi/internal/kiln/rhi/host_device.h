// The part of the cpu and mock backends that is the same: device memory is host memory.
#ifndef KILN_RHI_HOST_DEVICE_H_
#define KILN_RHI_HOST_DEVICE_H_

#include "kiln/rhi/device.h"

namespace kiln {

/// An LLVM device whose memory is host memory (aligned_alloc); kernels are JIT-compiled for the
/// host and read and write that memory directly. Thread-safe.
class HostMemoryDevice : public LlvmDevice {
 public:
  [[nodiscard]] bool host_addressable() const final { return true; }
  RhiStatus synchronize() override { return take_deferred_failure(); }

 protected:
  using LlvmDevice::LlvmDevice;
  RhiExpected<uint64_t> driver_allocate(const LlvmRuntimeAllocParams &params) override;
  RhiStatus driver_free(uint64_t address, uint64_t size_bytes) override;
  RhiStatus driver_copy_to_device(uint64_t dst, const void *src, uint64_t size_bytes) override;
  RhiStatus driver_copy_to_host(void *dst, uint64_t src, uint64_t size_bytes) override;
  RhiStatus driver_copy_device(uint64_t dst, uint64_t src, uint64_t size_bytes) override;
  RhiStatus driver_memset_zero(uint64_t dst, uint64_t size_bytes) override;
};

}  // namespace kiln

#endif  // KILN_RHI_HOST_DEVICE_H_
