#include <sys/sysinfo.h>
#include <time.h>

#include <cstring>

#include "kiln/rhi/backend_registry.h"
#include "kiln/rhi/failures.h"
#include "kiln/rhi/cpu_device.h"
#include "kiln/rhi/coarse_clock.h"

#include <algorithm>

#include <fmt/format.h>

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
constexpr int64_t kReuseNs = std::chrono::nanoseconds(CpuDevice::kReadingReuse).count();
}  // namespace

[[gnu::always_inline]] inline bool CpuDevice::reuse_reading(int64_t now_ns,
                                                        MemoryInfo *info) const {
  MemoryReadingCache::Reading r;
  if (!reading_.get(now_ns, kReuseNs, &r)) return false;
  // Less what kiln itself allocated since the reading.
  const uint64_t live = live_allocation_bytes();
  const uint64_t grown = live > r.tag ? live - r.tag : 0;
  *info = MemoryInfo{r.free_bytes > grown ? r.free_bytes - grown : 0, r.total_bytes};
  return true;
}

RhiExpected<LlvmDevice::MemoryInfo> CpuDevice::refresh_reading(int64_t now_ns) {
  std::lock_guard lock(refresh_mutex_);
  MemoryInfo info;
  if (reuse_reading(now_ns, &info)) return info;  // another thread just refreshed it
  const uint64_t live = live_allocation_bytes();
  KILN_ASSIGN_OR_RETURN(info, read_memory_info());
  reading_.put({info.free_bytes, info.total_bytes, live, now_ns});
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
/// Errors: invalid_usage for an ordinal other than 0 (the host is one device).
RhiExpected<std::unique_ptr<LlvmDevice>> make_cpu_device(const DeviceOptions &options) {
  if (options.ordinal != 0)
    return std::unexpected(invalid_usage(
        fmt::format("cpu:{}", options.ordinal), "create_device",
        fmt::format("the cpu backend has one device, cpu:0; there is no ordinal {}", options.ordinal)));
  return std::make_unique<CpuDevice>();
}

}  // namespace kiln
