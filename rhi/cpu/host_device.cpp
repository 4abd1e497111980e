#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "kiln/rhi/host_device.h"

namespace kiln {

RhiExpected<uint64_t> HostMemoryDevice::driver_allocate(const LlvmRuntimeAllocParams &params) {
  const uint64_t alignment = params.alignment_bytes < 64 ? 64 : params.alignment_bytes;
  // aligned_alloc wants a size that is a multiple of the alignment.
  const uint64_t rounded = (params.size_bytes + alignment - 1) / alignment * alignment;
  void *ptr = rounded < params.size_bytes ? nullptr : std::aligned_alloc(alignment, rounded);
  if (ptr == nullptr) {
    return std::unexpected(
        driver_out_of_memory(name(), "aligned_alloc", "ENOMEM", params.figures()));
  }
  return reinterpret_cast<uint64_t>(ptr);
}

RhiStatus HostMemoryDevice::driver_free(uint64_t address, uint64_t /*size_bytes*/) {
  std::free(reinterpret_cast<void *>(address));
  return {};
}

RhiStatus HostMemoryDevice::driver_copy_to_device(uint64_t dst, const void *src, uint64_t size_bytes) {
  std::memcpy(reinterpret_cast<void *>(dst), src, size_bytes);
  return {};
}

RhiStatus HostMemoryDevice::driver_copy_to_host(void *dst, uint64_t src, uint64_t size_bytes) {
  std::memcpy(dst, reinterpret_cast<const void *>(src), size_bytes);
  return {};
}

RhiStatus HostMemoryDevice::driver_copy_device(uint64_t dst, uint64_t src, uint64_t size_bytes) {
  std::memmove(reinterpret_cast<void *>(dst), reinterpret_cast<const void *>(src), size_bytes);
  return {};
}

RhiStatus HostMemoryDevice::driver_memset_zero(uint64_t dst, uint64_t size_bytes) {
  std::memset(reinterpret_cast<void *>(dst), 0, size_bytes);
  return {};
}

}  // namespace kiln
