// DeviceMemory: the facade over a device's memory adaptors (RMM's resource-adaptor shape). Every
// allocation kiln makes on a device goes through here, so every kind is charged to one ledger.
// The parts, one file each under runtime/memory/: the budget adaptor, which decides every growth
// (budget_adaptor.h: the limit, reclaim-and-retry, the live free-memory check, rounding), the
// budget and ledger (budget.h),
// the caching pool's size classes (caching_pool.h), the thread-cache front (thread_cache.h,
// thread_cache_front.cpp, cache_eviction.cpp), the ledger view and stats (device_memory_ledger.cpp,
// memory_stats.h), OOM observers (oom_observers.h), request fault injection
// (request_fault_plan.h), the live free-memory check (live_free_check.cpp) and the failure
// picture (failure_picture.h). The inline fast path below is the pool hit.
#ifndef KILN_RUNTIME_MEMORY_DEVICE_MEMORY_H_
#define KILN_RUNTIME_MEMORY_DEVICE_MEMORY_H_

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "kiln/rhi/device.h"
#include "kiln/rhi/fork_hooks.h"
#include "kiln/runtime/memory/alloc_request.h"
#include "kiln/runtime/memory/budget.h"
#include "kiln/runtime/memory/budget_adaptor.h"
#include "kiln/runtime/memory/budget_config.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/failure_picture.h"
#include "kiln/runtime/memory/memory_stats.h"
#include "kiln/runtime/memory/oom_observers.h"
#include "kiln/runtime/memory/request_fault_plan.h"
#include "kiln/runtime/memory/seq_mutex.h"

namespace kiln::runtime {

namespace detail {
struct BlockRecord;
class BlockRegistry;
class ThreadCache;
}  // namespace detail

/// The budgeted allocator of one device. Owns the budget; does not own the device.
/// Thread-safe: every member may be called from any thread.
///
/// Pool hits take no lock: each thread that allocates here gets a cache of freed blocks (classes
/// up to 4 MiB, at most 65 MiB per thread) that it allocates from and frees into with plain
/// loads and stores. Cached blocks of every thread are evicted before any refusal (another thread
/// empties a cache with a membarrier(2) handshake, never waiting on a lock the owner holds). A
/// thread's cache goes back to the shared pool when the thread exits. A free from another thread
/// takes the lock (and, if the owner's thread is alive, one membarrier to stop its fast path).
/// Without membarrier(2), and in a child after fork(), every operation takes the lock. (As POSIX
/// warns for any library with locks, a child forked while another thread was inside a locked
/// operation may block on that lock; a child of an idle or single-threaded parent works.)
///
/// OOM observers may not allocate here: while one runs, its thread's allocations here are refused
/// with invalid_usage (frees are fine: that is what observers are for).
class DeviceMemory : private GrowthOwner, private RequestFaultPlan::Owner {
 public:
  /// Reads total memory from the device and sets the limit per `config`.
  /// Errors: what the device's memory_info answers; invalid_usage for a bad KILN_POOL_LIMIT_MB.
  [[nodiscard]] static RhiExpected<std::unique_ptr<DeviceMemory>> create(LlvmDevice &device,
                                                                         BudgetConfig config = {});
  /// Gives every live and cached block back to the device. No other thread may use this object
  /// while it is destroyed.
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory &) = delete;
  DeviceMemory &operator=(const DeviceMemory &) = delete;

  /// Allocates `size_bytes` charged to `category`. On failure nothing is held.
  /// Errors: out_of_memory (oom_source budget: the limit or the live free memory refused;
  ///         oom_source driver: the driver refused), invalid_usage (size 0, category pool_cache
  ///         or out of range, or called from an OOM observer of this memory), device_lost.
  ///         Out-of-memory failures carry a MemorySnapshot.
  [[nodiscard]] RhiExpected<DeviceAllocation> allocate(MemoryCategory category, uint64_t size_bytes,
                                                       bool zero_fill = false) {
    // A hit in this thread's cache is one call that returns the block's id (the result is built
    // here, in the caller); everything else takes the locked path.
    if (!zero_fill)
      if (const uint64_t alloc_id = try_allocate_lock_free(category, size_bytes); alloc_id != 0)
          [[likely]]
        return DeviceAllocation{&device_, alloc_id};
    return allocate_locked_path(category, size_bytes, zero_fill);
  }
  /// Allocates every request, or none: reserves the total in one step first, then allocates;
  /// any failure frees what the group already got. Same errors as allocate.
  [[nodiscard]] RhiExpected<std::vector<DeviceAllocation>> allocate_group(
      std::span<const AllocRequest> requests);
  /// Frees an allocation made here: with caching on, the block is kept for reuse (its charge
  /// moves to pool_cache); otherwise it goes back to the device. Errors: invalid_usage (not live
  /// here: freed twice, never allocated, or another device's).
  [[nodiscard]] RhiStatus free(DeviceAllocation alloc) {
    if (try_free_lock_free(alloc)) [[likely]]
      return {};
    return free_locked_path(alloc);
  }
  /// Gives every cached block (the shared pool and every thread's cache) back to the device;
  /// returns the bytes released.
  uint64_t release_cached();

  /// Registers an OOM observer; returns its id. Thread-safe.
  uint64_t add_oom_observer(OomObserver observer) { return observers_.add(std::move(observer)); }
  /// Removes an observer; false if the id is unknown.
  bool remove_oom_observer(uint64_t id) { return observers_.remove(id); }

  /// Charges bytes that live outside device allocations (e.g. JIT code objects) to `category`.
  /// Errors: out_of_memory (oom_source budget) as allocate; invalid_usage for pool_cache or a
  /// value that is no category, or when called from an OOM observer of this memory;
  /// device_lost when the device was lost. Release
  /// with uncharge() (which ignores such categories).
  [[nodiscard]] RhiStatus charge(MemoryCategory category, uint64_t size_bytes);
  void uncharge(MemoryCategory category, uint64_t size_bytes);

  /// Injected faults at this level: every allocation request counts (cache hits included).
  /// The device's own fault_plan() counts only the calls that reach the driver.
  [[nodiscard]] RequestFaultPlan &fault_plan() { return fault_plan_; }
  [[nodiscard]] LlvmDevice &device() const { return device_; }
  /// The budget itself, for tests that need its hooks (MemoryBudget::set_before_lock_hook_...).
  [[nodiscard]] MemoryBudget &budget_for_testing() { return adaptor_.budget(); }

  /// The budget's limit in bytes.
  [[nodiscard]] uint64_t limit_bytes() const { return adaptor_.budget().limit_bytes(); }
  /// Sets a new limit. Memory already held above it stays held; new growth is refused.
  void set_limit_bytes(uint64_t limit_bytes) { adaptor_.budget().set_limit_bytes(limit_bytes); }
  /// Bytes held on the device now (live and cached), as the budget counts them. O(1).
  [[nodiscard]] uint64_t in_use_bytes() const { return adaptor_.budget().in_use_bytes(); }
  /// Bytes held now per category (cached blocks under pool_cache); they add up to the held
  /// bytes. Read without a lock unless locked operations or a thread's fast path keep moving
  /// the figures for a few tries: then under the lock, stopping the fast paths if need be.
  [[nodiscard]] CategoryBytes in_use_by_category() const override;
  /// Sets every peak to the current figure.
  void reset_peaks();

  /// Counters and bytes. Per-category peaks count live blocks (a block is live from the moment
  /// its whole request is granted) and are never below the most live at once. They are exact
  /// while one thread allocates and frees here; with several, a peak may exceed the truth by up
  /// to the bytes the other threads' caches own (cached there or handed out from there; a cache
  /// owns at most what its thread reuses). peak_total_bytes is the most held at once by the
  /// ledger's account: a block counts from the moment the device gave it (each block of a group
  /// on its own, so also the blocks of a group refused part-way, which no category counts) until
  /// its free is accounted; a request refused before the device gave anything never counts.
  /// Exact while one thread allocates and frees. A snapshot taken while other threads allocate
  /// may be momentarily inconsistent between categories (each figure is read once, without
  /// stopping them), and its current bytes include their reservations under way.
  [[nodiscard]] MemoryStats stats() const;
  /// A readable table of current and peak bytes per category, the pool and the counters.
  [[nodiscard]] std::string summary() const;
  /// A picture for failure details: live free/total (asked now), limit, in-use per category.
  [[nodiscard]] MemorySnapshot snapshot();
  /// Fills the memory picture and device name of an out-of-memory failure: limit, in-use per
  /// category and, where the failure has none, the device's free/total. A budget refusal (the
  /// ledger's verdict, where those figures are only context) reuses a reading while
  /// CLOCK_MONOTONIC_COARSE has moved less than kLiveReadingReuse since it, i.e. within the same
  /// kernel tick (1 to 10 ms), and says how old it may be (MemorySnapshot::live_age_ms):
  /// refusing stays cheap, even in a loop. Every other failure asks the device now. Normally
  /// takes no lock (see in_use_by_category).
  void annotate(Failure &failure);
  static constexpr std::chrono::microseconds kLiveReadingReuse = FailurePicture::kReuse;

 private:
  using Record = detail::BlockRecord;
  using Cache = detail::ThreadCache;
  using Slot = AllocationSlot;

  DeviceMemory(LlvmDevice &device, uint64_t limit_bytes, uint64_t reserve_bytes, bool live_check,
               bool caching);

  // The lock-free fast path (thread_cache.h). The thread's own side of its bindings (which
  // cache it uses here; forgetting it while an OOM observer runs) is thread-local state keyed
  // by id_: bound_cache (thread_cache_front.cpp), detail::owned_cache, detail::forget_binding.
  [[nodiscard]] Cache *my_cache() const;  // this thread's cache here, or null (binds the fast path)
  [[nodiscard]] Cache *bind_cache();  // my_cache(), made on first use (takes the mutex)
  // RequestFaultPlan::Owner
  [[nodiscard]] uint64_t cache_request_count() const override;  // requests the caches counted
  /// Opens or closes the fast path: open while caching, membarrier(2) works, no fault plan is
  /// armed and this is no forked child. Called by the constructor too.
  void fault_plan_changed() override;
  static void install_fork_handler();
  /// The lock-free hit: the block's alloc id, or 0 (ids start at 1) when it cannot serve it.
  [[nodiscard, gnu::noinline]] uint64_t try_allocate_lock_free(MemoryCategory category,
                                                               uint64_t size_bytes);
  /// The lock-free free into this thread's cache; false when it cannot take it.
  [[nodiscard, gnu::noinline]] bool try_free_lock_free(DeviceAllocation alloc);

  // The locked path.
  [[nodiscard, gnu::noinline]] RhiExpected<DeviceAllocation> allocate_locked_path(
      MemoryCategory category, uint64_t size_bytes, bool zero_fill);
  [[nodiscard, gnu::noinline]] RhiStatus free_locked_path(DeviceAllocation alloc);
  [[nodiscard]] RhiStatus admit(std::span<const AllocRequest> requests);
  /// The one locked allocation path, for a single request and a group alike: admit (validate,
  /// the fault plan), then cache hits, then the misses grow together or are refused; an
  /// out-of-memory failure is annotated, told to the observers (and tried once more if they
  /// freed memory) and counted (BudgetAdaptor::count_refusal). `slots` and
  /// `growth` have one element per request (the caller's storage: the single allocate keeps it
  /// on the stack). On failure nothing is held: hits go back to the cache, grown blocks to the
  /// device.
  /// `Result` is the caller's result type (RhiExpected<DeviceAllocation> or RhiStatus), so that a
  /// refusal is built where it is returned.
  template <class Result>
  [[nodiscard]] Result allocate_requests(std::span<const AllocRequest> requests,
                                         std::span<Slot> slots, std::span<CategoryRequest> growth);
  /// allocate_requests after admit() let the requests in.
  template <class Result>
  [[nodiscard]] Result allocate_admitted(std::span<const AllocRequest> requests,
                                         std::span<Slot> slots, std::span<CategoryRequest> growth);
  /// What take_cached took: `count` hits, `live` already when nothing could hand them back (no
  /// growth to wait for, nothing to clear). Hits not yet live are pending: a free of one is
  /// refused as not live until the whole request is granted (go_live_locked), so a stale free racing
  /// the growth can neither free a block about to be handed out nor cache it twice.
  struct Hits {
    std::size_t count = 0;
    bool live = false;
  };
  /// Takes cached blocks for the requests it can (one lock for all). Defined, always inlined, in
  /// allocation_path.cpp, its only user.
  [[nodiscard]] inline Hits take_cached(Cache *cache, std::span<const AllocRequest> requests,
                                        std::span<Slot> slots);
  /// Once the whole request is granted: registers the grown blocks and makes the pending hits
  /// live. Mutex held.
  void go_live_locked(Cache *cache, std::span<const AllocRequest> requests, std::span<Slot> slots);
  /// Hands the hits back to the cache (a failure path: not a free).
  void give_back_hits(Cache *cache, std::span<const AllocRequest> requests,
                      std::span<Slot> slots);
  /// One try of allocate_requests (it calls this once more when OOM observers freed memory):
  /// sets `outright` when the misses were refused outright (annotated and counted already).
  template <class Result>
  [[nodiscard]] Result try_requests(Cache *cache, std::span<const AllocRequest> requests,
                                    std::span<Slot> slots, std::span<CategoryRequest> growth,
                                    bool &outright);
  [[nodiscard]] RhiStatus check_fault_plan(std::span<const AllocRequest> requests);
  /// invalid_usage when the calling thread is inside an OOM observer of this memory.
  [[nodiscard]] RhiStatus check_not_observing() const;
  [[nodiscard]] RhiStatus validate(MemoryCategory category, uint64_t size_bytes) const;
  [[nodiscard]] uint64_t class_of(uint64_t size_bytes) const;
  /// Evicts every cache so that a refused request may be retried: true when this call released
  /// bytes, or when another thread's eviction was under way (this call waited for it to finish).
  [[nodiscard]] bool evict_for_retry() override;
  [[nodiscard]] uint64_t release_cached_holding_evict_lock();
  /// Tells the observers (this thread may not allocate here meanwhile); true if they freed memory.
  bool notify_observers(const Failure &failure);

  // Under mutex_.
  /// A cached block of `class_bytes`, or one of an exact size in [size_bytes, class_bytes],
  /// charged to `category` and owned by `cache`; not yet live (its record still says pool_cache).
  [[nodiscard]] Record *take_cached_locked(Cache *cache, MemoryCategory category,
                                           uint64_t size_bytes, uint64_t class_bytes);
  /// Caches a freed block: in `cache`'s bin when it has room (true), else the shared pool.
  bool keep_cached_locked(Cache *cache, Record *record);
  /// Caches a block that was live in `category` (freed, or a hit handed back), charged as cache.
  void cache_freed_locked(Cache *cache, Record *record, MemoryCategory category);
  /// The ledger's side of a block the device let go of, last in `category`.
  void release_charge_locked(const Record &record, MemoryCategory category);
  void register_block_locked(Cache *cache, DeviceAllocation block, MemoryCategory category,
                             uint64_t class_bytes);
  void move_locked(Cache *cache, MemoryCategory from, MemoryCategory to, uint64_t size_bytes);
  void raise_peak_locked(MemoryCategory category);
  [[nodiscard]] CategoryBytes in_use_by_category_locked() const;
  /// The view's sum into `out`; false when a cache's share could not be read whole (its owner
  /// kept moving it). mutex_ held, or its sequence number checked after. `quiesced`: every
  /// cache is (mutex_ held), so shares are read as they are.
  [[nodiscard]] bool view_bytes(CategoryBytes &out, bool quiesced = false) const;
  class QuiescedCache;  // quiesces a cache for a scope (device_memory.cpp)
  void retire_cache(Cache *cache);  // a thread exits (thread_cache_front.cpp)
  friend struct ThreadBinding;

  LlvmDevice &device_;
  const uint64_t id_;  // never reused in the process: keys thread caches
  BudgetAdaptor adaptor_;  // every growth and charge: the budget, the live check, rounding
  const bool caching_;
  const bool asymmetric_barrier_;  // membarrier(2) works: the fast path may open
  // caching_ && asymmetric_barrier_ && no fault plan armed.
  std::atomic<bool> fast_path_{false};
  std::mutex evict_mutex_;    // one eviction at a time, from draining to the ledger's release
  // Guards everything below it up to the counters. The ledger view (moves_, the caches' grants
  // and headroom, the cache list) is also read without it, under its sequence number.
  mutable detail::SeqMutex mutex_;
  std::unique_ptr<detail::BlockRegistry> blocks_;  // every block held, live or cached
  CachingPool pool_;  // the shared pool
  // Every cache made here, bound to a thread or retired (then empty, its shares zero, and in
  // free_caches_ for the next thread). Never freed before this object, so cache_list_, the same
  // caches linked for lock-free readers, is always safe to walk.
  std::vector<std::unique_ptr<Cache>> caches_;
  std::vector<Cache *> free_caches_;
  std::atomic<Cache *> cache_list_{nullptr};
  // Category moves made outside caches. Written under mutex_, read by the lock-free view.
  std::array<std::atomic<int64_t>, kNumMemoryCategories> moves_{};
  CategoryBytes peaks_{};
  uint64_t retired_requests_ = 0;  // requests counted by caches whose thread exited
  RequestFaultPlan fault_plan_;
  FailurePicture picture_;
  /// annotate's work for an out-of-memory failure, with the bytes held per category given.
  void fill_picture(Failure &failure, const CategoryBytes &in_use) override;
  OomObservers observers_;
  // The locked path's busiest counters: kept per thread in its cache (a plain add), here for
  // threads without one and for caches whose thread exited.
  // kLockFreeHits: only the lock-free hits of caches whose thread exited (live caches keep theirs
  // in fast_allocations).
  enum Counter : std::size_t {
    kAllocations,
    kFrees,
    kCacheHits,
    kLockFreeHits,
    kNumCounters
  };
  void count(Counter counter, uint64_t n = 1);
  std::array<std::atomic<uint64_t>, kNumCounters> counters_{};
  std::atomic<uint64_t> evictions_{0};
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_DEVICE_MEMORY_H_
