// RequestFaultPlan: fault injection over allocation requests, counted here (FaultPlan) and by
// the owner's thread caches (lock-free hits and disarmed requests).
#include "kiln/runtime/memory/request_fault_plan.h"

#include <algorithm>

namespace kiln::runtime {

void RequestFaultPlan::arm(const FaultSpec &spec) {
  std::lock_guard lock(settings_mutex_);
  set_plan(kNever, kNever);
  {
    std::lock_guard spec_lock(spec_mutex_);
    spec_ = ArmedSpec{.spec = spec, .selected_count = 0, .rng_state = spec.seed};
  }
  update_armed();
}

RequestFaultPlan::Setting RequestFaultPlan::setting() const {
  std::lock_guard spec_lock(spec_mutex_);
  return Setting{.fail_at = fail_at_.load(std::memory_order_relaxed),
                 .fail_size = fail_size_.load(std::memory_order_relaxed), .spec = spec_};
}

void RequestFaultPlan::restore(const Setting &setting) {
  std::lock_guard lock(settings_mutex_);
  set_plan(setting.fail_at, setting.fail_size);
  {
    std::lock_guard spec_lock(spec_mutex_);
    spec_ = setting.spec;
  }
  update_armed();
}

void RequestFaultPlan::set_plan(uint64_t fail_at, uint64_t fail_size) {
  plan_.fail_at_count(fail_at);
  plan_.fail_sizes_at_least(fail_size);
  fail_at_.store(fail_at, std::memory_order_relaxed);
  fail_size_.store(fail_size, std::memory_order_relaxed);
}

void RequestFaultPlan::drop_spec() {
  std::lock_guard spec_lock(spec_mutex_);
  spec_.reset();
}

void RequestFaultPlan::fail_nth_allocation(uint64_t n) {
  std::lock_guard lock(settings_mutex_);
  drop_spec();
  fast_baseline_.store(owner_.cache_request_count(), std::memory_order_relaxed);
  plan_.fail_nth_allocation(n);
  fail_at_.store(n, std::memory_order_relaxed);
  update_armed();
}

void RequestFaultPlan::fail_at_count(uint64_t count) {
  std::lock_guard lock(settings_mutex_);
  drop_spec();
  // allocation_count() = the plan's own count + the thread caches' requests since the baseline.
  const uint64_t cached =
      owner_.cache_request_count() - fast_baseline_.load(std::memory_order_relaxed);
  set_plan(count - std::min(count, cached), fail_size_.load(std::memory_order_relaxed));
  update_armed();
}

void RequestFaultPlan::fail_sizes_at_least(uint64_t size_bytes) {
  std::lock_guard lock(settings_mutex_);
  drop_spec();
  set_plan(fail_at_.load(std::memory_order_relaxed), size_bytes);
  update_armed();
}

void RequestFaultPlan::clear() {
  std::lock_guard lock(settings_mutex_);
  set_plan(kNever, kNever);
  drop_spec();
  update_armed();
}

void RequestFaultPlan::update_armed() {
  bool spec_armed = false;
  {
    std::lock_guard spec_lock(spec_mutex_);
    spec_armed = spec_.has_value();
  }
  armed_.store(plan_.armed() || spec_armed, std::memory_order_relaxed);
  owner_.fault_plan_changed();
}

uint64_t RequestFaultPlan::allocation_count() const {
  return plan_.allocation_count() + owner_.cache_request_count() -
         fast_baseline_.load(std::memory_order_relaxed);
}

bool RequestFaultPlan::spec_fails(const AllocRequest &request) {
  return spec_ && spec_->spec.selects(request) && spec_triggers();
}

bool RequestFaultPlan::spec_triggers() {
  const uint64_t n = ++spec_->selected_count;
  const FaultSpec &spec = spec_->spec;
  if (spec.probability) {
    // The top 53 bits as a double in [0, 1): p = 0 never fails, p = 1 always does.
    const double draw = static_cast<double>(splitmix64_next(spec_->rng_state) >> 11) * 0x1.0p-53;
    return draw < *spec.probability;
  }
  return spec.nth == 0 || n == spec.nth;
}

RequestFaultPlan::Refusal RequestFaultPlan::first_refused(std::span<const AllocRequest> requests) {
  std::lock_guard spec_lock(spec_mutex_);
  for (const AllocRequest &r : requests) {
    const bool counted_fail = plan_.should_fail(r.size_bytes);  // counts r for allocation_count
    if (counted_fail) return Refusal{&r, FaultKind::oom};
    if (spec_fails(r)) return Refusal{&r, spec_->spec.kind};
  }
  return {};
}

std::optional<FaultKind> RequestFaultPlan::launch_fault(std::string_view kernel) {
  if (!armed()) [[likely]]
    return std::nullopt;
  std::lock_guard spec_lock(spec_mutex_);
  if (!spec_ || !spec_->spec.selects_launch(kernel) || !spec_triggers()) return std::nullopt;
  return spec_->spec.kind;
}

void RequestFaultPlan::count(std::span<const AllocRequest> requests) {
  for (const AllocRequest &r : requests)
    ignore_result(plan_.should_fail(r.size_bytes), "counting only: the plan is disarmed");
}

}  // namespace kiln::runtime
