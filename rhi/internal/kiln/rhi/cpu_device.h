#ifndef KILN_RHI_CPU_DEVICE_H_
#define KILN_RHI_CPU_DEVICE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>

#include "kiln/rhi/host_device.h"
#include "kiln/rhi/memory_reading.h"

namespace kiln {

/// The host CPU as a device. Memory info is the system's: total = MemTotal, free = MemAvailable
/// from /proc/meminfo (sysinfo(2) where that cannot be read), both capped by the process's
/// cgroup limit. Reading them means opening and parsing files, so a reading younger than
/// kReadingReuse is reused, less what kiln itself allocated since: only other processes' growth
/// within that time goes unseen. The age is measured on CLOCK_MONOTONIC_COARSE (coarse_clock.h:
/// a load from the vDSO's page), which advances once per kernel tick: a reading is reused
/// until that clock has moved kReadingReuse past it, i.e. for at most one tick (1 to 10 ms,
/// depending on the kernel's HZ). A reused reading is
/// read without a lock (MemoryReadingCache); one thread at a time refreshes it.
/// Thread-safe.
class CpuDevice final : public HostMemoryDevice {
 public:
  static constexpr std::chrono::microseconds kReadingReuse = MemoryReadingCache::kTickReuse;
  CpuDevice() : HostMemoryDevice("cpu") {}
  [[nodiscard]] Backend backend() const override { return Backend::cpu; }
  RhiExpected<MemoryInfo> memory_info() override;

 private:
  [[nodiscard]] RhiExpected<MemoryInfo> read_memory_info();
  [[nodiscard]] bool reuse_reading(int64_t now_ns, MemoryInfo *info) const;
  [[nodiscard]] RhiExpected<MemoryInfo> refresh_reading(int64_t now_ns);
  std::mutex refresh_mutex_;  // one refresher at a time
  MemoryReadingCache reading_;  // tag: live_allocation_bytes() when it was read
};

}  // namespace kiln

#endif  // KILN_RHI_CPU_DEVICE_H_
