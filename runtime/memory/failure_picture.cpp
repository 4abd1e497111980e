#include "kiln/runtime/memory/failure_picture.h"

#include <algorithm>

#include "kiln/rhi/coarse_clock.h"

namespace kiln::runtime {

void FailurePicture::fill_live_figures(MemorySnapshot &memory, bool may_reuse, LlvmDevice &device) {
  const int64_t now_ns = coarse_now_ns();
  if (may_reuse) {
    const int64_t time_ns = time_ns_.load(std::memory_order_acquire);
    if (time_ns >= 0 && now_ns - time_ns < std::chrono::nanoseconds(kReuse).count()) {
      memory.free_bytes = free_bytes_.load(std::memory_order_relaxed);
      memory.total_bytes = total_bytes_.load(std::memory_order_relaxed);
      // The clock moves a tick at a time: the reading is younger than what it says plus a tick.
      const int64_t bound_ns = std::max<int64_t>(now_ns - time_ns, 0) + coarse_resolution_ns();
      memory.live_age_ms = static_cast<uint64_t>((bound_ns + 999'999) / 1'000'000);
      return;
    }
  }
  auto info = device.memory_info();
  if (!info) return;  // the picture goes without the device's figures
  memory.free_bytes = info->free_bytes;
  memory.total_bytes = info->total_bytes;
  memory.live_age_ms = 0;
  free_bytes_.store(info->free_bytes, std::memory_order_relaxed);
  total_bytes_.store(info->total_bytes, std::memory_order_relaxed);
  time_ns_.store(now_ns, std::memory_order_release);
}

}  // namespace kiln::runtime
