#include "kiln/runtime/memory/oom_observers.h"

#include <mutex>

namespace kiln::runtime {

uint64_t OomObservers::add(OomObserver observer) {
  std::lock_guard lock(mutex_);
  observers_.emplace_back(next_id_, std::move(observer));
  count_.store(observers_.size(), std::memory_order_release);
  return next_id_++;
}

bool OomObservers::remove(uint64_t id) {
  std::lock_guard lock(mutex_);
  const bool removed =
      std::erase_if(observers_, [id](const auto &entry) { return entry.first == id; }) > 0;
  count_.store(observers_.size(), std::memory_order_release);
  return removed;
}

bool OomObservers::notify(const Failure &failure, const std::function<uint64_t()> &held_bytes) {
  if (empty()) return false;
  std::vector<OomObserver> observers;
  {
    std::lock_guard lock(mutex_);
    for (const auto &[id, observer] : observers_) observers.push_back(observer);
  }
  if (observers.empty()) return false;
  const uint64_t before = held_bytes();
  {
    // Marked for the calls only; observers of other memories nest (A's observer allocating on B,
    // whose observer allocates on A, is refused on A as surely as A's own allocation).
    const Frame frame{this, t_frames_};
    t_frames_ = &frame;
    struct Restore {
      const Frame *outer;
      ~Restore() { t_frames_ = outer; }
    } restore{frame.outer};
    for (const OomObserver &observer : observers) observer(failure);
  }
  return held_bytes() < before;
}

}  // namespace kiln::runtime
