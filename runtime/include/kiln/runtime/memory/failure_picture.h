// The memory picture of an out-of-memory failure: the device's free/total, read for the failure
// or reused from a reading of the same clock tick.
#ifndef KILN_RUNTIME_MEMORY_FAILURE_PICTURE_H_
#define KILN_RUNTIME_MEMORY_FAILURE_PICTURE_H_

#include <atomic>
#include <chrono>
#include <cstdint>

#include "kiln/rhi/device.h"
#include "kiln/rhi/memory_reading.h"

namespace kiln::runtime {

/// One device's last free/total reading for failure pictures (a MemoryReadingCache, as the cpu
/// device's own). Thread-safe, lock-free: stored by whoever reads the device, read whole.
class FailurePicture {
 public:
  /// How long a reading may be reused for a budget refusal (whose verdict does not depend on it):
  /// while CLOCK_MONOTONIC_COARSE has moved less than this, i.e. within one kernel tick (1 to
  /// 10 ms), so that refusing stays cheap even in a loop.
  static constexpr std::chrono::microseconds kReuse = MemoryReadingCache::kTickReuse;

  /// Sets `memory`'s free_bytes, total_bytes and live_age_ms: from a reading of this tick when
  /// `may_reuse` (live_age_ms then bounds its age, in whole ms rounded up), else from `device`
  /// now (live_age_ms 0); sets device_read to whether it had an answer (a device that cannot
  /// answer leaves the figures as they are).
  void fill_live_figures(MemorySnapshot &memory, bool may_reuse, LlvmDevice &device);

 private:
  MemoryReadingCache reading_;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_FAILURE_PICTURE_H_
