// The OOM observers of one device's memory (RMM's failure-callback adaptor): told of every
// out-of-memory refusal before it is returned, so that they may free memory and have the request
// retried once.
#ifndef KILN_RUNTIME_MEMORY_OOM_OBSERVERS_H_
#define KILN_RUNTIME_MEMORY_OOM_OBSERVERS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "kiln/rhi/fork_hooks.h"
#include "kiln/rhi/result.h"

namespace kiln::runtime {

/// Called with the failure detail of an out-of-memory refusal before the error is returned. If it
/// frees kiln memory, the allocation is retried once. Must not allocate on the same device: while
/// it runs, that thread's allocations there are refused with invalid_usage.
using OomObserver = std::function<void(const Failure &)>;

/// A list of observers. Thread-safe: add, remove and notify may be called from any thread; the
/// observers run on the refusing thread, outside every lock of this list (one may remove itself).
class OomObservers {
 public:
  /// Registers `observer`; returns its id (never 0, never reused).
  uint64_t add(OomObserver observer);
  /// Removes an observer; false if the id is unknown.
  bool remove(uint64_t id);
  /// Whether none is registered (one atomic load: a refusal skips everything else when true).
  [[nodiscard]] bool empty() const { return count_.load(std::memory_order_acquire) == 0; }

  /// Calls every observer with `failure`, in the order they were added, marking this thread as
  /// observing (observing_here()) while they run. Returns whether they freed memory: whether
  /// `held_bytes()` is lower afterwards than before. False without a call when none is registered.
  bool notify(const Failure &failure, const std::function<uint64_t()> &held_bytes);
  /// Whether the calling thread is inside one of this list's observers now, however deeply
  /// nested in other lists' observers (one TLS load when it is in none).
  [[nodiscard]] bool observing_here() const {
    for (const Frame *frame = t_frames_; frame != nullptr; frame = frame->outer)
      if (frame->list == this) return true;
    return false;
  }

 private:
  // Reset in a forked child, not held across fork(): dropping an observer under it may wait for
  // the Python GIL, which the forking thread may hold.
  ForkSafeMutex mutex_{ForkSafeMutex::Policy::reset_in_child};
  std::vector<std::pair<uint64_t, OomObserver>> observers_;
  std::atomic<std::size_t> count_{0};
  uint64_t next_id_ = 1;
  // The lists whose observers this thread is running, innermost first (frames on its stack).
  struct Frame {
    const OomObservers *list;
    const Frame *outer;
  };
  static constinit inline thread_local const Frame *t_frames_
      __attribute__((tls_model("initial-exec"))) = nullptr;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_OOM_OBSERVERS_H_
