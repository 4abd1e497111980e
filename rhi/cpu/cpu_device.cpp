#include <sys/sysinfo.h>

#include <cstdio>
#include <cstring>

#include "kiln/rhi/cpu_device.h"

#include <algorithm>

#include "cgroup_memory.h"

namespace kiln {
namespace {

// MemTotal and MemAvailable from /proc/meminfo, in bytes; false if the file cannot be read.
bool read_meminfo(uint64_t *total_bytes, uint64_t *available_bytes) {
  std::FILE *file = std::fopen("/proc/meminfo", "r");
  if (file == nullptr) return false;
  char line[256];
  int found = 0;
  while (found < 2 && std::fgets(line, sizeof line, file) != nullptr) {
    unsigned long long kib = 0;
    if (std::sscanf(line, "MemTotal: %llu kB", &kib) == 1) {
      *total_bytes = kib * 1024;
      ++found;
    } else if (std::sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
      *available_bytes = kib * 1024;
      ++found;
    }
  }
  std::fclose(file);
  return found == 2;
}

// A container's memory limit caps what the host reports.
Device::MemoryInfo apply_cgroup_limit(Device::MemoryInfo info) {
  if (auto cg = cgroup::own_memory_limit()) {
    info.total_bytes = std::min(info.total_bytes, cg->limit_bytes);
    const uint64_t cg_free = cg->limit_bytes > cg->usage_bytes ? cg->limit_bytes - cg->usage_bytes : 0;
    info.free_bytes = std::min(info.free_bytes, cg_free);
  }
  return info;
}

}  // namespace

RhiExpected<Device::MemoryInfo> CpuDevice::memory_info() {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lock(reading_mutex_);
  const uint64_t live = live_allocation_bytes();
  if (reading_time_ == std::chrono::steady_clock::time_point{} || now - reading_time_ >= kReadingReuse) {
    KILN_ASSIGN_OR_RETURN(reading_, read_memory_info());
    reading_time_ = now;
    live_bytes_at_reading_ = live;
    return reading_;
  }
  MemoryInfo info = reading_;
  const uint64_t grown = live > live_bytes_at_reading_ ? live - live_bytes_at_reading_ : 0;
  info.free_bytes = info.free_bytes > grown ? info.free_bytes - grown : 0;
  return info;
}

RhiExpected<Device::MemoryInfo> CpuDevice::read_memory_info() {
  MemoryInfo info;
  if (read_meminfo(&info.total_bytes, &info.free_bytes)) return apply_cgroup_limit(info);
  struct sysinfo si {};
  if (sysinfo(&si) != 0)
    return std::unexpected(failure(RhiResult::error, "sysinfo", std::strerror(errno)));
  info.total_bytes = static_cast<uint64_t>(si.totalram) * si.mem_unit;
  info.free_bytes = static_cast<uint64_t>(si.freeram + si.bufferram) * si.mem_unit;
  return apply_cgroup_limit(info);
}

}  // namespace kiln
