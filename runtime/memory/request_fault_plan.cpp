// RequestFaultPlan: fault injection over allocation requests, counted here (FaultPlan) and by
// the owner's thread caches (lock-free hits and disarmed requests).
#include "kiln/runtime/memory/request_fault_plan.h"

#include <algorithm>

namespace kiln::runtime {

void RequestFaultPlan::fail_nth_allocation(uint64_t n) {
  std::lock_guard lock(settings_mutex_);
  fast_baseline_.store(owner_.cache_request_count(), std::memory_order_relaxed);
  plan_.fail_nth_allocation(n);
  update_armed();
}

void RequestFaultPlan::fail_at_count(uint64_t count) {
  std::lock_guard lock(settings_mutex_);
  // allocation_count() = the plan's own count + the thread caches' requests since the baseline.
  const uint64_t cached =
      owner_.cache_request_count() - fast_baseline_.load(std::memory_order_relaxed);
  plan_.fail_at_count(count - std::min(count, cached));
  update_armed();
}

void RequestFaultPlan::fail_sizes_at_least(uint64_t size_bytes) {
  std::lock_guard lock(settings_mutex_);
  plan_.fail_sizes_at_least(size_bytes);
  update_armed();
}

void RequestFaultPlan::clear() {
  std::lock_guard lock(settings_mutex_);
  plan_.clear();
  update_armed();
}

void RequestFaultPlan::update_armed() {
  armed_.store(plan_.armed(), std::memory_order_relaxed);
  owner_.fault_plan_changed();
}

uint64_t RequestFaultPlan::allocation_count() const {
  return plan_.allocation_count() + owner_.cache_request_count() -
         fast_baseline_.load(std::memory_order_relaxed);
}

const AllocRequest *RequestFaultPlan::first_refused(std::span<const AllocRequest> requests) {
  for (const AllocRequest &r : requests)
    if (plan_.should_fail(r.size_bytes)) return &r;
  return nullptr;
}

void RequestFaultPlan::count(std::span<const AllocRequest> requests) {
  for (const AllocRequest &r : requests)
    ignore_result(plan_.should_fail(r.size_bytes), "counting only: the plan is disarmed");
}

}  // namespace kiln::runtime
