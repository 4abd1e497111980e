// Fault injection over a device memory's allocation *requests* (cache hits included), as
// FaultPlan is over the calls that reach a driver.
#ifndef KILN_RUNTIME_MEMORY_REQUEST_FAULT_PLAN_H_
#define KILN_RUNTIME_MEMORY_REQUEST_FAULT_PLAN_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string_view>

#include "kiln/rhi/fault_plan.h"
#include "kiln/runtime/memory/alloc_request.h"
#include "kiln/runtime/memory/fault_spec.h"

namespace kiln::runtime {

/// FaultPlan's interface over allocation requests, and a FaultSpec's decisions (arm()). A faulted
/// request fails as if the driver had refused it (out_of_memory, oom_source driver, injected), or,
/// for a spec of kind lost, as a lost device. While armed, every request is decided by
/// first_refused() (DeviceMemory then keeps its lock-free path closed); disarmed, requests are
/// counted by the owner's thread caches, which the plan adds in (Owner). A spec of kind launch or
/// heap decides launches instead (launch_fault(), asked by the executor's launcher). Thread-safe.
class RequestFaultPlan {
 public:
  static constexpr uint64_t kNever = FaultPlan::kNever;

  /// What the plan needs from the memory it belongs to.
  class Owner {
   public:
    /// Requests counted outside the plan so far (by thread caches, while disarmed).
    [[nodiscard]] virtual uint64_t cache_request_count() const = 0;
    /// The plan was armed or disarmed.
    virtual void fault_plan_changed() = 0;

   protected:
    ~Owner() = default;
  };
  explicit RequestFaultPlan(Owner &owner) : owner_(owner) {}

  /// A spec armed by arm(), with what it has seen so far.
  struct ArmedSpec {
    FaultSpec spec;
    uint64_t selected_count = 0;  ///< requests the spec selected since it was armed
    uint64_t rng_state = 0;       ///< splitmix64 state for spec.probability
  };
  /// The whole setting: the count/size plan, or an armed spec (one at a time).
  struct Setting {
    uint64_t fail_at = kNever;    ///< the plan's own count to fail at (opaque: for restore())
    uint64_t fail_size = kNever;  ///< as fail_sizes_at_least takes it
    std::optional<ArmedSpec> spec;
  };

  /// Decides every request by `spec` from now on (its nth and its draws count from here),
  /// replacing the previous setting (the count/size plan is disarmed). allocation_count() goes
  /// on (no reset), so an enclosing fail_at_count plan can be restored afterwards.
  void arm(const FaultSpec &spec);
  /// The current setting, for restore() (kiln.testing blocks restore the one they replaced).
  [[nodiscard]] Setting setting() const;
  /// Makes `setting` current again; a spec goes on from what it had seen. No count reset.
  void restore(const Setting &setting);

  /// The `n`-th request from now (1-based) fails; kNever disarms. Resets the count. Like the
  /// two setters below, it disarms an armed spec.
  void fail_nth_allocation(uint64_t n);
  /// The request that brings allocation_count() to `count` fails; the count goes on (no reset),
  /// so nested plans (kiln.testing.fail_allocation blocks) count consistently.
  void fail_at_count(uint64_t count);
  /// Every request of at least `size_bytes` fails; kNever disarms.
  void fail_sizes_at_least(uint64_t size_bytes);
  /// Disarms everything (count, size and spec); the count goes on.
  void clear();
  /// Requests counted since the last fail_nth_allocation (or construction).
  [[nodiscard]] uint64_t allocation_count() const;
  [[nodiscard]] bool armed() const { return armed_.load(std::memory_order_relaxed); }

  /// A refused request and the failure to give it.
  struct Refusal {
    const AllocRequest *request = nullptr;  ///< null: none refused
    FaultKind kind = FaultKind::oom;        ///< oom (the count/size plan's too) or lost
    explicit operator bool() const { return request != nullptr; }
  };
  /// Counts `requests` and decides them in order: the first that the plan fails (the caller
  /// fails it with injected_fault, or as a lost device for kind lost), or none.
  [[nodiscard]] Refusal first_refused(std::span<const AllocRequest> requests);
  /// Decides a launch of `kernel` ("kiln_axpy_f32") by an armed spec of kind launch or heap:
  /// the kind when this launch fails (counting it when selected), nullopt otherwise. One relaxed
  /// load when disarmed. Called by the launcher once per launch, after its buffers were allocated.
  [[nodiscard]] std::optional<FaultKind> launch_fault(std::string_view kernel);
  /// Counts `requests` without deciding (disarmed, on a thread without a cache).
  void count(std::span<const AllocRequest> requests);

 private:
  void update_armed();
  /// Whether the armed spec fails `request` (counting it when selected). Needs spec_mutex_.
  [[nodiscard]] bool spec_fails(const AllocRequest &request);
  /// Counts one selected event of the armed spec and says whether its trigger fires. Needs
  /// spec_mutex_ and an armed spec.
  [[nodiscard]] bool spec_triggers();
  /// Disarms the spec. Needs settings_mutex_.
  void drop_spec();
  /// Sets plan_'s count and size (and their copies for setting()). Needs settings_mutex_.
  void set_plan(uint64_t fail_at, uint64_t fail_size);
  Owner &owner_;
  std::mutex settings_mutex_;  // one setter at a time: armed_ and the fast path follow the settings
  FaultPlan plan_;  // counts the requests check() and count() see
  std::atomic<uint64_t> fail_at_{kNever};    // plan_'s count to fail at, as last set
  std::atomic<uint64_t> fail_size_{kNever};  // plan_'s size to fail from, as last set
  std::atomic<uint64_t> fast_baseline_{0};  // the owner's cached requests at the last reset
  mutable std::mutex spec_mutex_;  // guards spec_: requests may be decided on several threads
  std::optional<ArmedSpec> spec_;
  std::atomic<bool> armed_{false};
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_REQUEST_FAULT_PLAN_H_
