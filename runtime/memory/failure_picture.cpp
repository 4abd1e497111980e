#include "kiln/runtime/memory/failure_picture.h"

#include <algorithm>

#include "kiln/rhi/coarse_clock.h"

namespace kiln::runtime {

void FailurePicture::fill_live_figures(MemorySnapshot &memory, bool may_reuse, LlvmDevice &device) {
  const int64_t now_ns = coarse_now_ns();
  MemoryReadingCache::Reading r;
  if (may_reuse && reading_.get(now_ns, std::chrono::nanoseconds(kReuse).count(), &r)) {
    memory.free_bytes = r.free_bytes;
    memory.total_bytes = r.total_bytes;
    memory.device_read = true;
    // The clock moves a tick at a time: the reading is younger than what it says plus a tick.
    const int64_t bound_ns = std::max<int64_t>(now_ns - r.time_ns, 0) + coarse_resolution_ns();
    memory.live_age_ms = static_cast<uint32_t>((bound_ns + 999'999) / 1'000'000);
    return;
  }
  auto info = device.memory_info();
  memory.device_read = info.has_value();
  if (!info) return;  // the picture goes without the device's figures
  memory.free_bytes = info->free_bytes;
  memory.total_bytes = info->total_bytes;
  memory.live_age_ms = 0;
  reading_.put({info->free_bytes, info->total_bytes, 0, now_ns});
}

}  // namespace kiln::runtime
