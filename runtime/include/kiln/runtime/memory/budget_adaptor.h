// The budget adaptor: growth of a device's memory under kiln's budget (RMM's limiting resource
// adaptor, with the reclaim and the live free-memory check of a caching allocator). DeviceMemory
// hands it the misses of one allocation (the requests its caches could not serve) and gets back
// their blocks, reserved and allocated, or the finished failure. It is the one place that
// decides: the limit (MemoryBudget), reclaim-and-retry, the live free-memory check, the driver's
// answer and "rounding never refuses what fits unrounded".
#ifndef KILN_RUNTIME_MEMORY_BUDGET_ADAPTOR_H_
#define KILN_RUNTIME_MEMORY_BUDGET_ADAPTOR_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <span>

#include "kiln/rhi/device.h"
#include "kiln/runtime/memory/alloc_request.h"
#include "kiln/runtime/memory/budget.h"

namespace kiln::runtime {

namespace detail {
struct BlockRecord;
}  // namespace detail

/// One request's bookkeeping on the allocation path (the caller's storage, one per request).
struct AllocationSlot {
  uint64_t class_bytes = 0;  ///< its size class: the block size growth asks for first
  uint64_t block_bytes = 0;  ///< the block size grown for it (its class, or its exact size)
  detail::BlockRecord *hit = nullptr;  ///< the cached block that serves it, or null (a miss)
  DeviceAllocation block;              ///< what it is given
};

/// The cache hits of a group allocation, which a budget refusal reports with the misses: a group
/// is granted whole or not at all, so its refusal names the whole group, the blocks it would
/// have reused included (they go back to the cache, and the failure's snapshot shows them there).
struct ReusedBlocks {
  std::size_t count = 0;
  uint64_t size_bytes = 0;   ///< the requests they serve (saturating)
  uint64_t class_bytes = 0;  ///< the blocks' own sizes (saturating)
  /// The hits of `slots` (one per request).
  [[nodiscard]] static ReusedBlocks of(std::span<const AllocRequest> requests,
                                       std::span<const AllocationSlot> slots);
};

/// What the adaptor asks of the memory it grows (DeviceMemory): its bytes held and its caches.
class GrowthOwner {
 public:
  /// Bytes held now per category, cached blocks under pool_cache (the refusal's picture).
  [[nodiscard]] virtual CategoryBytes in_use_by_category() const = 0;
  /// Gives every cached block back to the device so that a refusal may be retried: true when
  /// that may have made room (bytes released here or by another thread's eviction meanwhile).
  virtual bool evict_for_retry() = 0;
  /// Fills an out-of-memory failure's picture (device, limit, in-use `held`, live figures).
  virtual void fill_picture(Failure &failure, const CategoryBytes &held) = 0;

 protected:
  ~GrowthOwner() = default;
};

/// Counters of the adaptor's decisions, read by DeviceMemory::stats(). Relaxed atomics.
struct GrowthCounters {
  std::atomic<uint64_t> live_checks{0};      ///< live free-memory checks made
  std::atomic<uint64_t> live_refusals{0};    ///< live-check refusals returned to the caller
  std::atomic<uint64_t> budget_refusals{0};  ///< limit refusals returned to the caller
  std::atomic<uint64_t> driver_ooms{0};      ///< the driver's (or an injected) out-of-memory
  std::atomic<uint64_t> retries{0};          ///< tries again after an eviction or an observer
};

/// Growth under one device's budget. Owns the budget; does not own the device or the owner.
/// Thread-safe: every member may be called from any thread.
class BudgetAdaptor : private ReclaimHook {
 public:
  /// `limit_bytes`: the budget's limit; `reserve_bytes`: headroom the live check keeps free on
  /// the device; `live_check`: ask the device for its free memory before growing.
  BudgetAdaptor(LlvmDevice &device, GrowthOwner &owner, uint64_t limit_bytes,
                uint64_t reserve_bytes, bool live_check);

  /// The misses of an allocation (the requests with no hit): their exact and class bytes
  /// (saturating) and the category of the first.
  struct Misses {
    uint64_t size_bytes = 0;
    uint64_t class_bytes = 0;
    MemoryCategory category = MemoryCategory::ndarray;
    [[nodiscard]] static Misses of(std::span<const AllocRequest> requests,
                                   std::span<const AllocationSlot> slots);
  };

  /// Grows a block for every miss of `slots` (those with no hit): at its size class and, if
  /// that was refused for want of what rounding added, at its exact size. All or nothing: on
  /// failure nothing is reserved or held. The budget reserves first (reclaiming, then asking
  /// again, while that could make room), then the live check, then the driver (once more after
  /// an eviction). A budget refusal names the whole group (`reused` counted in) and, when the
  /// exact sizes were refused too, the classes; a driver's names the block it refused.
  /// `growth` is scratch, one element per request. Errors: out_of_memory (oom_source budget or
  /// driver), invalid_usage, device_lost.
  [[nodiscard]] RhiStatus grow(std::span<const AllocRequest> requests,
                               std::span<AllocationSlot> slots, std::span<CategoryRequest> growth,
                               const Misses &misses, const ReusedBlocks &reused);
  /// Whether the budget refuses `misses` outright: even their exact sizes do not fit, no
  /// eviction could make room and `observers` is false (no OOM observer could free any). True
  /// with the bytes held per category in `held`. No lock, no device call.
  [[nodiscard]] bool refuses_outright(const Misses &misses, bool observers, CategoryBytes &held);
  /// That refusal, built where the caller returns it, annotated with `held` (the picture the
  /// decision took) and counted.
  [[nodiscard]] Failure refused_outright(const Misses &misses, const CategoryBytes &held);
  /// Charges `size_bytes` to `category` without a block (reclaiming as growth does).
  /// Errors: out_of_memory (oom_source budget), annotated and counted.
  [[nodiscard]] RhiStatus charge(MemoryCategory category, uint64_t size_bytes);
  /// Counts a refusal the caller returns (by the limit or by live free memory; a retry that
  /// cured one is no refusal).
  void count_refusal(const Failure &failure);
  /// The bytes of `held` that eviction cannot give back (every category but pool_cache).
  [[nodiscard]] static uint64_t unreclaimable_bytes(const CategoryBytes &held);

  [[nodiscard]] MemoryBudget &budget() { return budget_; }
  [[nodiscard]] const MemoryBudget &budget() const { return budget_; }
  [[nodiscard]] GrowthCounters &counters() { return counters_; }
  [[nodiscard]] const GrowthCounters &counters() const { return counters_; }
  [[nodiscard]] uint64_t reserve_bytes() const { return reserve_bytes_; }
  /// In a child after fork(): the growth lock as new (the parent's holder does not exist here).
  void reinit_after_fork();

 private:
  // ReclaimHook: the budget's "evict, then ask again"
  [[nodiscard]] uint64_t unreclaimable_bytes() const override;
  bool reclaim() override;
  /// What a budget refusal of one try reports: the whole group and, on the exact-size try, the
  /// classes that were refused before.
  [[nodiscard]] static AllocationFigures group_figures(const Misses &misses,
                                                       const ReusedBlocks &reused, bool exact_try);
  /// One try: reserve, live-check and allocate a block of slot.block_bytes for every miss.
  [[nodiscard]] RhiStatus grow_misses(std::span<const AllocRequest> requests,
                                      std::span<AllocationSlot> slots,
                                      std::span<CategoryRequest> growth, const Misses &misses,
                                      const ReusedBlocks &reused, bool exact_try);
  /// Whether `failure`, refusing the classes, was for want of what rounding added: the budget
  /// refused, or the driver did while the device's free memory lies between the exact sizes and
  /// the classes.
  [[nodiscard]] bool rounding_refused(const Failure &failure, const Misses &misses);
  [[nodiscard]] RhiExpected<DeviceAllocation> allocate_block(const AllocRequest &request,
                                                             uint64_t block_bytes,
                                                             uint64_t refused_class_bytes);
  [[nodiscard]] RhiStatus check_live_free(uint64_t growth_bytes, const RefusalReport &report);
  /// With the live check on, one growing thread at a time from the device's answer to the
  /// driver's (else two could both fit in the same free memory); an empty lock otherwise.
  [[nodiscard]] std::unique_lock<std::mutex> serialize_growth();
  /// Error path of a group: frees the blocks grown so far and releases their committed bytes.
  void free_grown(std::span<const AllocRequest> requests, std::span<const AllocationSlot> slots);

  LlvmDevice &device_;
  GrowthOwner &owner_;
  MemoryBudget budget_;
  const uint64_t reserve_bytes_;
  const bool live_check_;
  std::mutex growth_mutex_;  // serialize_growth; taken before the owner's locks
  GrowthCounters counters_;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_BUDGET_ADAPTOR_H_
