// DeviceMemory: the budget as an adaptor around a device (RMM's resource-adaptor shape). Every
// allocation kiln makes on a device goes through here, so every kind is charged to one ledger.
#ifndef KILN_RUNTIME_MEMORY_DEVICE_MEMORY_H_
#define KILN_RUNTIME_MEMORY_DEVICE_MEMORY_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kiln/rhi/device.h"
#include "kiln/runtime/memory/budget.h"

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

/// Counters and bytes for one device (a snapshot).
struct MemoryStats {
  LedgerStats ledger;
  uint64_t reserve_bytes = 0;
  uint64_t allocations = 0;  ///< successful device allocations
  uint64_t frees = 0;
  uint64_t live_checks = 0;    ///< live free-memory queries made
  uint64_t driver_ooms = 0;    ///< out_of_memory answers from the driver
  uint64_t live_refusals = 0;  ///< refusals because live free memory was short
};

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
  /// Frees an allocation made here and releases its charge. Errors: invalid_usage (not live).
  [[nodiscard]] RhiStatus free(DeviceAllocation alloc);

  /// Charges bytes that live outside device allocations (e.g. JIT code objects) to `category`.
  /// Errors: as allocate, oom_source budget. Release with uncharge().
  [[nodiscard]] RhiStatus charge(MemoryCategory category, uint64_t size_bytes);
  void uncharge(MemoryCategory category, uint64_t size_bytes);

  [[nodiscard]] LlvmDevice &device() const { return device_; }
  [[nodiscard]] MemoryBudget &budget() { return budget_; }
  [[nodiscard]] MemoryStats stats() const;
  /// A picture for failure details: live free/total (asked now), limit, in-use per category.
  [[nodiscard]] MemorySnapshot snapshot();
  /// Fills the memory picture and device name of an out-of-memory failure.
  void annotate(Failure &failure);

 private:
  DeviceMemory(LlvmDevice &device, uint64_t limit_bytes, uint64_t reserve_bytes, bool live_check);
  [[nodiscard]] RhiStatus check_live_free(uint64_t size_bytes, MemoryCategory category);
  [[nodiscard]] RhiExpected<DeviceAllocation> allocate_reserved(const AllocRequest &request);
  [[nodiscard]] RhiStatus free_unreserved(DeviceAllocation alloc);

  LlvmDevice &device_;
  MemoryBudget budget_;
  const uint64_t reserve_bytes_;
  const bool live_check_;
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, AllocRequest> live_;  // alloc_id -> what was charged
  std::atomic<uint64_t> allocations_{0}, frees_{0}, live_checks_{0}, driver_ooms_{0},
      live_refusals_{0};
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_DEVICE_MEMORY_H_
