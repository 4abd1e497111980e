// A mutex that publishes a sequence number, so that readers may read what it guards without it.
#ifndef KILN_RUNTIME_MEMORY_SEQ_MUTEX_H_
#define KILN_RUNTIME_MEMORY_SEQ_MUTEX_H_

#include <atomic>
#include <cstdint>
#include <mutex>

namespace kiln::runtime::detail {

/// A mutex that also publishes a sequence number, odd while it is held, so that a reader may read
/// the atomics it guards without taking it: read, then check that the number is even and did not
/// move (a seqlock; Boehm, "Can seqlocks get along with programming language memory models?",
/// MSPC 2012). Lockable, for std::lock_guard.
class SeqMutex {
 public:
  void lock() {
    mutex_.lock();
    seq_.store(seq_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
  }
  void unlock() {
    seq_.store(seq_.load(std::memory_order_relaxed) + 1, std::memory_order_release);
    mutex_.unlock();
  }
  /// Starts a read: the number to give read_valid.
  [[nodiscard]] uint64_t read_begin() const { return seq_.load(std::memory_order_acquire); }
  /// Whether what was read since read_begin returned `seq` is whole: no holder came or went.
  [[nodiscard]] bool read_valid(uint64_t seq) const {
    std::atomic_thread_fence(std::memory_order_acquire);
    return seq % 2 == 0 && seq_.load(std::memory_order_relaxed) == seq;
  }

 private:
  std::mutex mutex_;
  std::atomic<uint64_t> seq_{0};
};

}  // namespace kiln::runtime::detail

#endif  // KILN_RUNTIME_MEMORY_SEQ_MUTEX_H_
