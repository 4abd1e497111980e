#ifndef KILN_RHI_CPU_DEVICE_H_
#define KILN_RHI_CPU_DEVICE_H_

#include <chrono>
#include <mutex>

#include "kiln/rhi/host_device.h"

namespace kiln {

/// The host CPU as a device. Memory info is the system's: total = MemTotal, free = MemAvailable
/// from /proc/meminfo (sysinfo(2) where that cannot be read), both capped by the process's
/// cgroup limit. Reading them costs about 10 us, so a reading younger than kReadingReuse is
/// reused, less what kiln itself allocated since: only other processes' growth within that
/// millisecond goes unseen. Thread-safe.
class CpuDevice final : public HostMemoryDevice {
 public:
  static constexpr std::chrono::microseconds kReadingReuse{1000};
  CpuDevice() : HostMemoryDevice("cpu") {}
  [[nodiscard]] Backend backend() const override { return Backend::cpu; }
  RhiExpected<MemoryInfo> memory_info() override;

 private:
  [[nodiscard]] RhiExpected<MemoryInfo> read_memory_info();
  std::mutex reading_mutex_;
  std::chrono::steady_clock::time_point reading_time_{};
  MemoryInfo reading_{};
  uint64_t live_bytes_at_reading_ = 0;
};

}  // namespace kiln

#endif  // KILN_RHI_CPU_DEVICE_H_
