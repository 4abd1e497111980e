// The pieces of DeviceMemory's per-thread fast path (private to runtime/memory): the record of one
// device block, a thread's cache of freed blocks, the size bins they are kept in, and the
// asymmetric barrier that lets another thread empty a cache without the owner ever taking a lock.
//
// The scheme (tcmalloc's per-thread caches and jemalloc's tcache are the model): a thread frees a
// block it allocated into its own cache and allocates from it again with plain loads and stores,
// no lock and no atomic read-modify-write. Everything else takes DeviceMemory's mutex. A cache is
// emptied by another thread (eviction under memory pressure) with a Dekker handshake whose heavy
// side is membarrier(2): the owner marks itself busy and checks for a drain request with only a
// compiler barrier between; the drainer requests, issues membarrier, then waits for "not busy"
// (folly's asymmetric lightweight/heavyweight barrier, liburcu's sys_membarrier flavour). Where
// membarrier is unavailable (or in a child after fork()) the fast path stays closed: every
// operation takes the lock, and the caches' bins are used under it only.
#ifndef KILN_RUNTIME_MEMORY_THREAD_CACHE_H_
#define KILN_RUNTIME_MEMORY_THREAD_CACHE_H_

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/size_classes.h"

namespace kiln::runtime::detail {

class ThreadCache;

/// One device block DeviceMemory holds, live or cached. Records are recycled, never freed,
/// while their DeviceMemory lives, so a stale pointer to one is always safe to read; the fields
/// are atomics for that reason (relaxed: plain loads and stores on x86 and arm64).
struct alignas(64) BlockRecord {  // one cache line each: no straddling, no false sharing
  std::atomic<uint64_t> alloc_id{0};
  /// The cache whose thread may free this live block without the lock; set only by that thread
  /// (or cleared under the mutex). Null: every free takes the lock.
  std::atomic<ThreadCache *> owner{nullptr};
  /// The category the block is charged to now; pool_cache while it is not live: cached, or
  /// taken from the cache by a request not yet granted (charged to the request's category).
  std::atomic<MemoryCategory> category{MemoryCategory::pool_cache};
  std::atomic<uint64_t> class_bytes{0};
  std::atomic<uint32_t> bin{kNoBin};  ///< its thread-cache bin, kNoBin if too large for one
  MemoryCategory charged = MemoryCategory::pool_cache;  ///< the budget's category (mutex only)
};

/// Every block one DeviceMemory holds, by alloc id. Not thread-safe (DeviceMemory's mutex guards
/// it) except find_fast, which any thread may call at any time.
class BlockRegistry {
 public:
  BlockRegistry();
  /// Registers a new block (a recycled record or a new one) and returns its record.
  BlockRecord *add(uint64_t alloc_id, uint64_t class_bytes, MemoryCategory category,
                   ThreadCache *owner);
  /// The record of a held block, or nullptr.
  [[nodiscard]] BlockRecord *find(uint64_t alloc_id) const;
  /// Forgets a block on its way back to the device (later finds miss); the record stays intact.
  void remove(BlockRecord *record);
  /// Makes a removed record reusable, once the device has let go of its block.
  void recycle(BlockRecord *record);
  /// A lock-free guess: the record that last held `alloc_id`'s lookup slot, never null (an
  /// unused slot holds a dummy record that matches nothing: no owner, alloc id 0). The caller
  /// verifies alloc_id (and whatever else it relies on) after loading it.
  [[nodiscard]] BlockRecord *find_fast(uint64_t alloc_id) const {
    return lookup_[slot(alloc_id)].load(std::memory_order_acquire);
  }
  /// Every held block's record.
  [[nodiscard]] std::vector<BlockRecord *> all() const;

 private:
  static constexpr unsigned kLookupBits = 12;
  // Fibonacci hashing (Knuth, TAOCP vol. 3, 6.4): the top bits of id * 2^64/phi.
  static std::size_t slot(uint64_t alloc_id) {
    return static_cast<std::size_t>((alloc_id * 0x9E3779B97F4A7C15ull) >> (64 - kLookupBits));
  }
  std::array<std::atomic<BlockRecord *>, (1u << kLookupBits)> lookup_{};  // first: one load away
  std::deque<BlockRecord> records_;  // stable addresses
  std::vector<BlockRecord *> free_records_;
  std::unordered_map<uint64_t, BlockRecord *> by_id_;
  BlockRecord unused_slot_;  // what find_fast answers for a slot no block has used yet
};

/// A thread's cache of freed blocks for one DeviceMemory, plus its share of the ledger.
///
/// Who touches what: the owner thread, between enter_fast() and leave_fast() with no drain
/// requested, or while it holds DeviceMemory's mutex; any thread holding the mutex after
/// quiescing it (drain_requested set, busy seen even). Counters read by stats are atomics.
///
/// `busy` counts the owner's passes through its fast path, two per pass, so it is odd while the
/// owner is inside. The drainer waits for it to be even; a reader of the ledger share reads the
/// headroom between two equal even readings of it (a per-cache seqlock: read_shares), so every
/// cache's share is read whole although its owner takes no lock.
///
/// The ledger share: DeviceMemory's per-category figures add, for every cache, grant − headroom.
/// The owner moves bytes between categories on the fast path by changing only its headroom
/// (never below 0); grants change under the mutex only. So the sum of grants bounds what the
/// fast path can add to a category, and a category's peak is raised to that bound under the
/// mutex: peaks are never below the truth.
class ThreadCache {
 public:
  struct alignas(64) Bin {
    std::atomic<uint32_t> count{0};
    uint32_t depth = 0;  ///< bin_depth of this bin (in the line's padding: no table to load)
    std::array<BlockRecord *, kMaxBinDepth> blocks{};
  };
  static_assert(sizeof(Bin) == 64);

  ThreadCache() {
    for (uint32_t b = 0; b < kCacheBins; ++b) bins[b].depth = bin_depth(b);
  }

  // The fast path's fields first (busy, drain_requested, headroom: one cache line; its
  // counters start the next), the locked path's after.
  std::atomic<uint32_t> busy{0};
  std::atomic<uint32_t> drain_requested{0};
  std::array<std::atomic<int64_t>, kNumMemoryCategories> headroom{};
  std::atomic<uint64_t> fast_allocations{0};  ///< pool hits served without the lock
  std::atomic<uint64_t> fast_frees{0};
  std::array<std::atomic<int64_t>, kNumMemoryCategories> grant{};
  /// Bytes of the blocks this cache owns (in its bins or handed out by it); changed under the
  /// mutex only. Caps the headroom: the fast path never needs more.
  std::atomic<uint64_t> owned_bytes{0};
  /// Locked-path requests of this thread while the fault plan was disarmed (the plan counts
  /// them itself while armed).
  std::atomic<uint64_t> requests{0};
  /// The locked path's counters for this thread (DeviceMemory::Counter indexes them).
  std::array<std::atomic<uint64_t>, 4> counters{};
  std::array<Bin, kCacheBins> bins{};
  /// The next cache of the same DeviceMemory (its lock-free list); set once, before publication.
  std::atomic<ThreadCache *> next{nullptr};
  /// Bound to a live thread (false once retired, until the next thread takes it). Mutex only.
  bool bound = true;

  /// Plain add to an atomic only its owner writes (no read-modify-write instruction).
  /// The owner enters its fast path: returns the even count to hand to leave_fast.
  [[gnu::always_inline]] uint32_t enter_fast() {
    const uint32_t count = busy.load(std::memory_order_relaxed);
    busy.store(count + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);  // no instruction on x86
    return count;
  }
  [[gnu::always_inline]] void leave_fast(uint32_t count) {
    busy.store(count + 2, std::memory_order_release);
  }
  /// grant - headroom per category, read whole (no fast-path pass ran meanwhile). False when the
  /// owner kept passing through its fast path for all of a few tries.
  [[nodiscard]] bool read_shares(std::array<int64_t, kNumMemoryCategories> &shares) const;
  /// The same, when the cache is quiesced (nothing moves its share; `busy` may still tick).
  void read_quiesced_shares(std::array<int64_t, kNumMemoryCategories> &shares) const;

  [[gnu::always_inline]] static void add(std::atomic<int64_t> &counter, int64_t delta) {
    counter.store(counter.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
  }
  [[gnu::always_inline]] static void add(std::atomic<uint64_t> &counter, uint64_t delta) {
    counter.store(counter.load(std::memory_order_relaxed) + delta, std::memory_order_relaxed);
  }

  /// Bytes and blocks in the bins now (racy snapshot for stats).
  [[nodiscard]] uint64_t cached_bytes() const;
  [[nodiscard]] uint64_t cached_blocks() const;

  // The owner's fast path: no lock, no read-modify-write (defined below, always inlined).
  /// A block of `size_bytes`'s class from the bins, now live in `category`; null when the bins
  /// cannot serve it (a miss, a drain requested, too little headroom).
  [[gnu::always_inline]] inline BlockRecord *try_take(MemoryCategory category, uint64_t size_bytes);
  /// Keeps the live block `alloc_id` (`blocks` finds it) that this cache owns in its bins; false
  /// when it cannot (not this cache's, no room, a drain requested).
  [[gnu::always_inline]] inline bool try_keep(const BlockRegistry &blocks, uint64_t alloc_id);

  // Under DeviceMemory's mutex, by the owner or after quiesce().
  /// Gives `category`'s headroom up (so that the peak raised next counts only what is held).
  void reclaim_headroom(MemoryCategory category);
  /// Trims every category's headroom to the bytes this cache owns: the fast path needs no more,
  /// and more would only lift the peaks' bound.
  void trim_headroom();
  /// Empties the bins; returns their records.
  [[nodiscard]] std::vector<BlockRecord *> take_bins();
  /// Stops the owner's fast path: a drain request, the heavy barrier, then until it is out.
  void quiesce();
  /// Waits until the owner is outside its fast path (never, after fork(): it is gone).
  void wait_not_busy() const;
  /// Lets the owner's fast path go on.
  void reopen() { drain_requested.store(0, std::memory_order_release); }
};

/// Moves `record` to `owner` (null: no cache), keeping both caches' owned_bytes. Mutex held.
void set_owner(BlockRecord &record, ThreadCache *owner);
/// Stops the fast path of every cache in `caches` (one heavy barrier for all; none when no cache
/// is bound to a thread). Mutex held.
void quiesce_all(std::span<const std::unique_ptr<ThreadCache>> caches);
/// Lets them all go on. Mutex held.
void reopen_all(std::span<const std::unique_ptr<ThreadCache>> caches);

[[nodiscard]] inline int64_t to_signed(uint64_t bytes) { return static_cast<int64_t>(bytes); }
[[nodiscard]] inline std::size_t index(MemoryCategory category) {
  return static_cast<std::size_t>(category);
}
inline constexpr std::size_t kPoolCache = static_cast<std::size_t>(MemoryCategory::pool_cache);

/// Sets up the asymmetric barrier once per process (membarrier registration); idempotent.
/// Returns whether it is available. Without it DeviceMemory keeps its fast path closed.
bool init_asymmetric_barrier();
/// The owner's side: orders its `busy` store before its `drain_requested` load. Only the
/// compiler's part: the drainer's membarrier does the CPU's.
[[gnu::always_inline]] inline void light_barrier() {
  std::atomic_signal_fence(std::memory_order_seq_cst);
}
/// The drainer's side: after it returns, every thread has passed a full barrier.
void heavy_barrier();
/// Whether this process is a child forked from a kiln process: its fast paths stay closed and
/// nothing waits for a fast-path pass of a thread the child does not have.
[[nodiscard]] bool in_forked_child();
/// The calling thread's cache for the DeviceMemory `memory_id`, found without binding its fast
/// path to it (a free made inside an OOM observer); null when it has none or is exiting.
[[nodiscard]] ThreadCache *owned_cache(uint64_t memory_id);
/// The calling thread's fast path forgets `memory_id`'s cache until DeviceMemory::my_cache()
/// binds it again (while an OOM observer of that memory runs).
void forget_binding(uint64_t memory_id);

inline BlockRecord *ThreadCache::try_take(MemoryCategory category, uint64_t size_bytes) {
  const auto [bin, class_bytes] = bin_of_size(size_bytes);
  if (bin >= kCacheBins) return nullptr;
  const uint32_t pass = enter_fast();
  light_barrier();
  BlockRecord *record = nullptr;
  auto &slot = bins[bin];
  const uint32_t count = slot.count.load(std::memory_order_relaxed);
  auto &room = headroom[index(category)];
  if (drain_requested.load(std::memory_order_acquire) == 0 && count > 0 &&
      room.load(std::memory_order_relaxed) >= to_signed(class_bytes)) {
    record = slot.blocks[count - 1];
    slot.count.store(count - 1, std::memory_order_relaxed);
    record->category.store(category, std::memory_order_relaxed);
    add(room, -to_signed(class_bytes));
    add(headroom[kPoolCache], to_signed(class_bytes));
    add(fast_allocations, uint64_t{1});
  }
  leave_fast(pass);
  return record;
}

inline bool ThreadCache::try_keep(const BlockRegistry &blocks, uint64_t alloc_id) {
  const uint32_t pass = enter_fast();
  light_barrier();
  bool kept = false;
  BlockRecord *record = blocks.find_fast(alloc_id);  // never null: an empty slot has a dummy
  // Only a live block this cache owns: nobody else may change such a record.
  if (drain_requested.load(std::memory_order_acquire) == 0 &&
      record->owner.load(std::memory_order_relaxed) == this &&
      record->alloc_id.load(std::memory_order_relaxed) == alloc_id) {
    const MemoryCategory category = record->category.load(std::memory_order_relaxed);
    const uint32_t bin = record->bin.load(std::memory_order_relaxed);
    // Two branches, not one `&&`: g++ 12 compiles the conjunction into setcc/and and a hit
    // path that keeps two more registers (counted with bench/alloc_path_callgrind.sh).
    if (category != MemoryCategory::pool_cache) {
      if (bin != kNoBin) {
        auto &slot = bins[bin];
        const uint32_t count = slot.count.load(std::memory_order_relaxed);
        const int64_t class_bytes = to_signed(record->class_bytes.load(std::memory_order_relaxed));
        if (count < slot.depth && headroom[kPoolCache].load(std::memory_order_relaxed) >= class_bytes) {
          record->category.store(MemoryCategory::pool_cache, std::memory_order_relaxed);
          slot.blocks[count] = record;
          slot.count.store(count + 1, std::memory_order_relaxed);
          add(headroom[index(category)], class_bytes);
          add(headroom[kPoolCache], -class_bytes);
          add(fast_frees, uint64_t{1});
          kept = true;
        }
      }
    }
  }
  leave_fast(pass);
  return kept;
}

}  // namespace kiln::runtime::detail

#endif  // KILN_RUNTIME_MEMORY_THREAD_CACHE_H_
