// A device's last free/total memory reading, shared without a lock: the one reading cache that
// the cpu device (its memory_info) and DeviceMemory's failure pictures both use.
#ifndef KILN_RHI_MEMORY_READING_H_
#define KILN_RHI_MEMORY_READING_H_

#include <atomic>
#include <chrono>
#include <cstdint>

namespace kiln {

/// The last reading of a device's memory and when it was taken (CLOCK_MONOTONIC_COARSE, see
/// coarse_clock.h). A sequence lock (the Linux kernel's seqlock_t; Boehm, "Can seqlocks get along
/// with programming language memory models?", MSPC 2012): readers take no lock and see a reading
/// whole or not at all; a writer that finds another writer inside skips its store (a reader that
/// finds no young reading just reads the device again), and a reading never replaces a newer
/// one. Thread-safe.
class MemoryReadingCache {
 public:
  /// How long its owners reuse a reading: while CLOCK_MONOTONIC_COARSE has moved less than this,
  /// i.e. within one kernel tick (1 to 10 ms). The one value behind CpuDevice::kReadingReuse,
  /// FailurePicture::kReuse and DeviceMemory::kLiveReadingReuse.
  static constexpr std::chrono::microseconds kTickReuse{1000};

  struct Reading {
    uint64_t free_bytes = 0;
    uint64_t total_bytes = 0;
    /// What the owner wants to know about the moment of the reading (the cpu device: the bytes
    /// kiln itself held then, to correct a reused reading by what it allocated since).
    uint64_t tag = 0;
    int64_t time_ns = -1;  ///< when it was taken; -1: never
  };

  /// The reading, when one younger than `max_age_ns` at `now_ns` exists and was read whole.
  [[nodiscard]] bool get(int64_t now_ns, int64_t max_age_ns, Reading *out) const {
    const uint32_t seq = seq_.load(std::memory_order_acquire);
    if (seq % 2 != 0) return false;
    Reading r;
    r.time_ns = time_ns_.load(std::memory_order_relaxed);
    r.free_bytes = free_bytes_.load(std::memory_order_relaxed);
    r.total_bytes = total_bytes_.load(std::memory_order_relaxed);
    r.tag = tag_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (seq_.load(std::memory_order_relaxed) != seq || r.time_ns < 0 ||
        now_ns - r.time_ns >= max_age_ns)
      return false;
    *out = r;
    return true;
  }

  /// Stores `reading` unless another thread is storing one now or the stored one is newer.
  void put(const Reading &reading) {
    uint32_t seq = seq_.load(std::memory_order_relaxed);
    if (seq % 2 != 0 || !seq_.compare_exchange_strong(seq, seq + 1, std::memory_order_relaxed))
      return;
    if (reading.time_ns < time_ns_.load(std::memory_order_relaxed)) {
      seq_.store(seq, std::memory_order_release);  // nothing written: the same even number
      return;
    }
    std::atomic_thread_fence(std::memory_order_release);
    time_ns_.store(reading.time_ns, std::memory_order_relaxed);
    free_bytes_.store(reading.free_bytes, std::memory_order_relaxed);
    total_bytes_.store(reading.total_bytes, std::memory_order_relaxed);
    tag_.store(reading.tag, std::memory_order_relaxed);
    seq_.store(seq + 2, std::memory_order_release);
  }

 private:
  std::atomic<uint32_t> seq_{0};  // odd while a writer is inside
  std::atomic<int64_t> time_ns_{-1};
  std::atomic<uint64_t> free_bytes_{0}, total_bytes_{0}, tag_{0};
};

}  // namespace kiln

#endif  // KILN_RHI_MEMORY_READING_H_
