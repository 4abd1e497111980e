#ifndef KILN_RHI_CPU_DEVICE_H_
#define KILN_RHI_CPU_DEVICE_H_

#include "kiln/rhi/host_device.h"

namespace kiln {

/// The host CPU as a device. Memory info is the system's: total = MemTotal, free = MemAvailable
/// from /proc/meminfo (sysinfo(2) where that cannot be read). Thread-safe.
class CpuDevice final : public HostMemoryDevice {
 public:
  CpuDevice() : HostMemoryDevice("cpu") {}
  [[nodiscard]] Backend backend() const override { return Backend::cpu; }
  RhiExpected<MemoryInfo> memory_info() override;
};

}  // namespace kiln

#endif  // KILN_RHI_CPU_DEVICE_H_
