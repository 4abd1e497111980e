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
    // Marked for the calls only; an observer of another device's memory nests and restores.
    const OomObservers *outer = std::exchange(t_observing_, this);
    struct Restore {
      const OomObservers *outer;
      ~Restore() { t_observing_ = outer; }
    } restore{outer};
    for (const OomObserver &observer : observers) observer(failure);
  }
  return held_bytes() < before;
}

}  // namespace kiln::runtime
