#include <sys/sysinfo.h>
#include <time.h>

#include <cstring>

#include "kiln/rhi/backend_registry.h"
#include "kiln/rhi/cpu_device.h"
#include "kiln/rhi/coarse_clock.h"

#include <algorithm>

#include "cgroup_memory.h"
#include "meminfo.h"

namespace kiln {
namespace {

// A container's memory limit caps what the host reports.
LlvmDevice::MemoryInfo apply_cgroup_limit(LlvmDevice::MemoryInfo info) {
  cgroup::cap_by_limit(cgroup::own_memory_limit(), &info.total_bytes, &info.free_bytes);
  return info;
}

}  // namespace

namespace {
constexpr auto kRelaxed = std::memory_order_relaxed;
constexpr int64_t kReuseNs = std::chrono::nanoseconds(CpuDevice::kReadingReuse).count();
}  // namespace

[[gnu::always_inline]] inline bool CpuDevice::reuse_reading(int64_t now_ns,
                                                        MemoryInfo *info) const {
  // A sequence lock (the Linux kernel's seqlock_t, as in Boehm, "Can seqlocks get along with
  // programming language memory models?", MSPC 2012): read, then check nobody wrote meanwhile.
  const uint32_t seq = reading_seq_.load(std::memory_order_acquire);
  if (seq % 2 != 0) return false;
  const int64_t time_ns = reading_time_ns_.load(kRelaxed);
  const uint64_t free_bytes = reading_free_bytes_.load(kRelaxed);
  const uint64_t total_bytes = reading_total_bytes_.load(kRelaxed);
  const uint64_t live_at_reading = live_bytes_at_reading_.load(kRelaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (reading_seq_.load(kRelaxed) != seq || time_ns < 0 || now_ns - time_ns >= kReuseNs)
    return false;
  // Less what kiln itself allocated since the reading.
  const uint64_t live = live_allocation_bytes();
  const uint64_t grown = live > live_at_reading ? live - live_at_reading : 0;
  *info = MemoryInfo{free_bytes > grown ? free_bytes - grown : 0, total_bytes};
  return true;
}

RhiExpected<LlvmDevice::MemoryInfo> CpuDevice::refresh_reading(int64_t now_ns) {
  std::lock_guard lock(refresh_mutex_);
  MemoryInfo info;
  if (reuse_reading(now_ns, &info)) return info;  // another thread just refreshed it
  const uint64_t live = live_allocation_bytes();
  KILN_ASSIGN_OR_RETURN(info, read_memory_info());
  const uint32_t seq = reading_seq_.load(kRelaxed);
  reading_seq_.store(seq + 1, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  reading_time_ns_.store(now_ns, kRelaxed);
  reading_free_bytes_.store(info.free_bytes, kRelaxed);
  reading_total_bytes_.store(info.total_bytes, kRelaxed);
  live_bytes_at_reading_.store(live, kRelaxed);
  reading_seq_.store(seq + 2, std::memory_order_release);
  return info;
}

RhiExpected<LlvmDevice::MemoryInfo> CpuDevice::memory_info() {
  const int64_t now_ns = coarse_now_ns();
  MemoryInfo info;
  if (reuse_reading(now_ns, &info)) return info;
  return refresh_reading(now_ns);
}

RhiExpected<LlvmDevice::MemoryInfo> CpuDevice::read_memory_info() {
  MemoryInfo info;
  if (meminfo::read(&info.total_bytes, &info.free_bytes)) return apply_cgroup_limit(info);
  struct sysinfo si {};
  if (sysinfo(&si) != 0)
    return std::unexpected(failure(RhiResult::error, "sysinfo", std::strerror(errno)));
  info.total_bytes = static_cast<uint64_t>(si.totalram) * si.mem_unit;
  info.free_bytes = static_cast<uint64_t>(si.freeram + si.bufferram) * si.mem_unit;
  return apply_cgroup_limit(info);
}

/// The registry's factory for Backend::cpu (backends.inc): the one host CPU.
RhiExpected<std::unique_ptr<LlvmDevice>> make_cpu_device(const DeviceOptions &) {
  return std::make_unique<CpuDevice>();
}

}  // namespace kiln
