// DeviceMemory: the budget as an adaptor around a device (RMM's resource-adaptor shape). Every
// allocation kiln makes on a device goes through here, so every kind is charged to one ledger.
#ifndef KILN_RUNTIME_MEMORY_DEVICE_MEMORY_H_
#define KILN_RUNTIME_MEMORY_DEVICE_MEMORY_H_

#include <atomic>
#include <functional>
#include <string>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kiln/rhi/device.h"
#include "kiln/runtime/memory/budget.h"
#include "kiln/runtime/memory/caching_pool.h"

namespace kiln::runtime {

/// How a device's budget is set. Sizes in bytes.
struct BudgetConfig {
  /// A fixed limit (deterministic tests). Unset: KILN_POOL_LIMIT_MB if set, else the ceiling
  /// (total - reserve).
  std::optional<uint64_t> limit_bytes;
  /// Headroom kept free on the device. Unset: default_reserve_bytes(total).
  std::optional<uint64_t> reserve_bytes;
  /// Ask the device for its live free memory whenever kiln must grow (sees other processes).
  bool live_check = true;
  /// Keep freed blocks for reuse (charged as pool_cache; evicted before any refusal).
  bool caching = true;
};

/// The default headroom: max(64 MiB, total / 20). 5 % leaves room for the driver's own context,
/// other libraries in the process and fragmentation; the floor matters on small devices.
[[nodiscard]] uint64_t default_reserve_bytes(uint64_t total_bytes);
/// KILN_POOL_LIMIT_MB from the environment, in bytes; nullopt when unset.
/// Errors: invalid_usage when set but not a non-negative integer.
[[nodiscard]] RhiExpected<std::optional<uint64_t>> pool_limit_from_env();

/// One member of an all-or-nothing group allocation.
struct AllocRequest {
  MemoryCategory category = MemoryCategory::ndarray;
  uint64_t size_bytes = 0;
  bool zero_fill = false;
};

/// Counters and bytes for one device (a snapshot). `get_*`-cheap: no device call.
struct MemoryStats {
  LedgerStats ledger;           ///< current/peak bytes per category, limit, budget refusals
  uint64_t reserve_bytes = 0;   ///< headroom kept free on the device
  uint64_t allocations = 0;     ///< successful allocations (cache hits included)
  uint64_t frees = 0;
  uint64_t cache_hits = 0;      ///< allocations served from the caching pool
  uint64_t cached_bytes = 0;    ///< bytes in the caching pool now
  uint64_t cached_blocks = 0;
  uint64_t evictions = 0;       ///< cached blocks given back to the device under pressure
  uint64_t live_checks = 0;     ///< live free-memory queries made
  uint64_t live_refusals = 0;   ///< refusals because live free memory was short
  uint64_t driver_ooms = 0;     ///< out_of_memory answers from the driver
  uint64_t retries = 0;         ///< allocations retried after evicting the cache or an observer
};

/// Called with the failure detail of an out-of-memory refusal before the error is returned. If it
/// frees kiln memory, the allocation is retried once. Must not allocate on the same device.
using OomObserver = std::function<void(const Failure &)>;

/// The budgeted allocator of one device. Owns the budget; does not own the device.
/// Thread-safe: every member may be called from any thread.
class DeviceMemory {
 public:
  /// Reads total memory from the device and sets the limit per `config`.
  /// Errors: what the device's memory_info answers; invalid_usage for a bad KILN_POOL_LIMIT_MB.
  [[nodiscard]] static RhiExpected<std::unique_ptr<DeviceMemory>> create(LlvmDevice &device,
                                                                         BudgetConfig config = {});
  ~DeviceMemory();

  /// Allocates `size_bytes` charged to `category`. On failure nothing is held.
  /// Errors: out_of_memory (oom_source budget: the limit or the live free memory refused;
  ///         oom_source driver: the driver refused), invalid_usage (size 0, bad alignment),
  ///         device_lost. Out-of-memory failures carry a MemorySnapshot.
  [[nodiscard]] RhiExpected<DeviceAllocation> allocate(MemoryCategory category, uint64_t size_bytes,
                                                       bool zero_fill = false);
  /// Allocates every request, or none: reserves the total in one step first, then allocates;
  /// any failure frees what the group already got. Same errors as allocate.
  [[nodiscard]] RhiExpected<std::vector<DeviceAllocation>> allocate_group(
      std::span<const AllocRequest> requests);
  /// Frees an allocation made here: with caching on, the block goes to the pool (its charge
  /// moves to pool_cache); otherwise back to the device. Errors: invalid_usage (not live).
  [[nodiscard]] RhiStatus free(DeviceAllocation alloc);
  /// Gives every cached block back to the device; returns the bytes released.
  uint64_t release_cached();

  /// Registers an OOM observer; returns its id. Thread-safe.
  uint64_t add_oom_observer(OomObserver observer);
  /// Removes an observer; false if the id is unknown.
  bool remove_oom_observer(uint64_t id);

  /// Charges bytes that live outside device allocations (e.g. JIT code objects) to `category`.
  /// Errors: as allocate, oom_source budget. Release with uncharge().
  [[nodiscard]] RhiStatus charge(MemoryCategory category, uint64_t size_bytes);
  void uncharge(MemoryCategory category, uint64_t size_bytes);

  /// Injected faults at this level: every allocation request counts (cache hits included), and
  /// a faulted one fails as if the driver had refused it (out_of_memory, oom_source driver).
  /// The device's own fault_plan() counts only the calls that reach the driver.
  [[nodiscard]] FaultPlan &fault_plan() { return fault_plan_; }
  [[nodiscard]] LlvmDevice &device() const { return device_; }
  [[nodiscard]] MemoryBudget &budget() { return budget_; }
  [[nodiscard]] MemoryStats stats() const;
  /// A readable table of current and peak bytes per category, the pool and the counters.
  [[nodiscard]] std::string summary() const;
  /// A picture for failure details: live free/total (asked now), limit, in-use per category.
  [[nodiscard]] MemorySnapshot snapshot();
  /// Fills the memory picture and device name of an out-of-memory failure.
  void annotate(Failure &failure);

 private:
  struct LiveEntry {
    MemoryCategory category;
    uint64_t class_bytes;  ///< bytes the device block has (and the ledger charges)
  };
  DeviceMemory(LlvmDevice &device, uint64_t limit_bytes, uint64_t reserve_bytes, bool live_check,
               bool caching);
  [[nodiscard]] RhiStatus admit(std::span<const AllocRequest> requests);
  [[nodiscard]] RhiExpected<std::vector<DeviceAllocation>> allocate_admitted(
      std::span<const AllocRequest> requests);
  [[nodiscard]] RhiStatus check_live_with_eviction(uint64_t growth_bytes, MemoryCategory category,
                                                   uint64_t requested_bytes);
  [[nodiscard]] RhiExpected<DeviceAllocation> grow_one(const AllocRequest &request);
  [[nodiscard]] RhiExpected<std::vector<DeviceAllocation>> try_allocate_group(
      std::span<const AllocRequest> requests);
  [[nodiscard]] RhiStatus check_fault_plan(std::span<const AllocRequest> requests);
  [[nodiscard]] RhiStatus validate(MemoryCategory category, uint64_t size_bytes) const;
  [[nodiscard]] uint64_t class_of(uint64_t size_bytes) const;
  [[nodiscard]] std::optional<DeviceAllocation> take_cached(MemoryCategory category, uint64_t class_bytes);
  [[nodiscard]] bool evicting_would_fit(uint64_t size_bytes, uint64_t limit_bytes) const;
  [[nodiscard]] RhiExpected<Reservation> reserve_growth(std::span<const CategoryRequest> growth);
  [[nodiscard]] RhiStatus check_live_free(uint64_t size_bytes, MemoryCategory category);
  [[nodiscard]] RhiExpected<DeviceAllocation> allocate_block(const AllocRequest &request,
                                                             uint64_t class_bytes);
  void give_back_unused(std::span<const DeviceAllocation> blocks,
                        std::span<const AllocRequest> requests);
  bool notify_observers(const Failure &failure);

  LlvmDevice &device_;
  MemoryBudget budget_;
  const uint64_t reserve_bytes_;
  const bool live_check_;
  const bool caching_;
  mutable std::mutex mutex_;  // guards live_ and pool_
  std::unordered_map<uint64_t, LiveEntry> live_;  // alloc_id -> charge, cached blocks included
  CachingPool pool_;
  FaultPlan fault_plan_;
  std::mutex observers_mutex_;
  std::vector<std::pair<uint64_t, OomObserver>> observers_;
  uint64_t next_observer_id_ = 1;
  std::atomic<uint64_t> allocations_{0}, frees_{0}, cache_hits_{0}, evictions_{0},
      live_checks_{0}, driver_ooms_{0}, live_refusals_{0}, retries_{0};
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_DEVICE_MEMORY_H_
