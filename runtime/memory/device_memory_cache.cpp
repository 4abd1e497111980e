// DeviceMemory's caches and ledger view: the lock-free fast path (thread_cache.h), binding each
// thread to its cache, eviction, and the per-category figures that add the caches' shares.
#include <algorithm>
#include <thread>

#include <fmt/format.h>

#include "kiln/runtime/memory/device_memory.h"
#include "thread_cache.h"

namespace kiln::runtime {

namespace {

// The DeviceMemory objects alive now, by id, so an exiting thread knows which of its caches it
// may still hand back. Never destroyed: threads may exit after static destructors ran.
struct LiveMemories {
  std::mutex mutex;
  std::unordered_map<uint64_t, DeviceMemory *> by_id;
  std::atomic<uint64_t> next_id{1};
};
LiveMemories &live_memories() {
  static auto *live = new LiveMemories;
  return *live;
}

// The fast path's binding: the cache this thread used last, and whose it is. Constant-initialized
// and trivially destructible, so reading it is one thread-pointer-relative load (initial-exec
// also inside the Python extension module).
struct FastBinding {
  uint64_t memory_id;
  detail::ThreadCache *cache;
};
constinit thread_local FastBinding t_fast __attribute__((tls_model("initial-exec"))) = {0, nullptr};
constinit thread_local bool t_exiting __attribute__((tls_model("initial-exec"))) = false;

int64_t to_signed(uint64_t bytes) { return static_cast<int64_t>(bytes); }
std::size_t index(MemoryCategory category) { return static_cast<std::size_t>(category); }
constexpr std::size_t kPoolCache = static_cast<std::size_t>(MemoryCategory::pool_cache);

constexpr std::array<uint32_t, detail::kCacheBins> kBinDepths = [] {
  std::array<uint32_t, detail::kCacheBins> depths{};
  for (uint32_t b = 0; b < detail::kCacheBins; ++b) depths[b] = detail::bin_depth(b);
  return depths;
}();

}  // namespace

// Every cache this thread has, for every DeviceMemory; hands them back when the thread exits.
struct ThreadBinding {
  std::vector<std::pair<uint64_t, detail::ThreadCache *>> caches;

  ~ThreadBinding() {
    t_exiting = true;
    t_fast = {0, nullptr};
    LiveMemories &live = live_memories();
    std::lock_guard lock(live.mutex);
    for (const auto &[memory_id, cache] : caches) {
      auto it = live.by_id.find(memory_id);
      if (it != live.by_id.end()) it->second->retire_cache(cache);
    }
  }

  // Drops the caches of DeviceMemory objects that are gone.
  void prune() {
    LiveMemories &live = live_memories();
    std::lock_guard lock(live.mutex);
    std::erase_if(caches, [&](const auto &entry) { return !live.by_id.contains(entry.first); });
  }
};
thread_local ThreadBinding t_binding;

DeviceMemory::DeviceMemory(LlvmDevice &device, uint64_t limit_bytes, uint64_t reserve_bytes,
                           bool live_check, bool caching)
    : device_(device),
      id_(live_memories().next_id.fetch_add(1)),
      budget_(limit_bytes),
      reserve_bytes_(reserve_bytes),
      live_check_(live_check),
      caching_(caching),
      asymmetric_barrier_(detail::init_asymmetric_barrier()),
      blocks_(std::make_unique<detail::BlockRegistry>()),
      fault_plan_(*this) {
  update_fast_path();
  LiveMemories &live = live_memories();
  std::lock_guard lock(live.mutex);
  live.by_id.emplace(id_, this);
}

void DeviceMemory::update_fast_path() {
  fast_path_.store(caching_ && asymmetric_barrier_ && !fault_plan_.armed(), std::memory_order_relaxed);
}

DeviceMemory::~DeviceMemory() {
  {
    LiveMemories &live = live_memories();
    std::lock_guard lock(live.mutex);  // an exiting thread no longer hands its cache back here
    live.by_id.erase(id_);
  }
  // Whatever is still live or cached goes back to the device: nothing outlives its allocator.
  std::vector<Record *> records;
  {
    std::lock_guard lock(mutex_);
    records = blocks_->all();
    caches_.clear();
  }
  for (Record *r : records)
    (void)device_.dealloc_memory(DeviceAllocation{&device_, r->alloc_id.load(std::memory_order_relaxed)});
}

// --- binding a thread to its cache -----------------------------------------------------------

DeviceMemory::Cache *DeviceMemory::my_cache() const {
  if (t_fast.memory_id == id_) return t_fast.cache;
  if (t_exiting) return nullptr;
  for (const auto &[memory_id, cache] : t_binding.caches)
    if (memory_id == id_) {
      t_fast = {id_, cache};
      return cache;
    }
  return nullptr;
}

DeviceMemory::Cache *DeviceMemory::bind_cache() {
  // Made with caching off too: the cache then only counts (its bins stay empty).
  if (Cache *cache = my_cache(); cache != nullptr || t_exiting) return cache;
  t_binding.prune();
  Cache *cache = nullptr;
  {
    std::lock_guard lock(mutex_);
    cache = caches_.emplace_back(std::make_unique<Cache>()).get();
  }
  t_binding.caches.emplace_back(id_, cache);
  t_fast = {id_, cache};
  return cache;
}

void DeviceMemory::retire_cache(Cache *cache) {
  // Called by the cache's own thread as it exits: nothing else uses the cache's fast path now.
  std::lock_guard lock(mutex_);
  auto it = std::find_if(caches_.begin(), caches_.end(), [&](const auto &c) { return c.get() == cache; });
  if (it == caches_.end()) return;
  for (Record *r : blocks_->all())
    if (r->owner.load(std::memory_order_relaxed) == cache) r->owner.store(nullptr, std::memory_order_relaxed);
  for (uint32_t b = 0; b < detail::kCacheBins; ++b) {
    auto &bin = cache->bins[b];
    for (uint32_t i = 0; i < bin.count.load(std::memory_order_relaxed); ++i) {
      Record *r = bin.blocks[i];
      pool_.put(DeviceAllocation{&device_, r->alloc_id.load(std::memory_order_relaxed)},
                r->class_bytes.load(std::memory_order_relaxed));
    }
    bin.count.store(0, std::memory_order_relaxed);
  }
  for (std::size_t k = 0; k < kNumMemoryCategories; ++k)
    moves_[k] += cache->grant[k].load(std::memory_order_relaxed) - cache->headroom[k].load(std::memory_order_relaxed);
  const uint64_t fast_allocations = cache->fast_allocations.load(std::memory_order_relaxed);
  retired_requests_ += fast_allocations + cache->requests.load(std::memory_order_relaxed);
  counters_[kAllocations].fetch_add(fast_allocations, std::memory_order_relaxed);
  counters_[kCacheHits].fetch_add(fast_allocations, std::memory_order_relaxed);
  counters_[kLockFreeHits].fetch_add(fast_allocations, std::memory_order_relaxed);
  counters_[kFrees].fetch_add(cache->fast_frees.load(std::memory_order_relaxed), std::memory_order_relaxed);
  for (std::size_t c = 0; c < kNumCounters; ++c)
    counters_[c].fetch_add(cache->counters[c].load(std::memory_order_relaxed), std::memory_order_relaxed);
  caches_.erase(it);
}

// --- the fast path: only this thread's cache, no lock, no read-modify-write ------------------
// allocate and free try it first; whatever it cannot serve (no cache yet, a miss, a drain
// request, a fault plan armed, zero_fill, not enough headroom) goes to the locked path, which
// keeps its stack frame and its calls out of the fast path's way.

[[gnu::always_inline]] inline DeviceMemory::Cache *DeviceMemory::fast_cache() const {
  return t_fast.memory_id == id_ ? t_fast.cache : nullptr;
}

[[gnu::always_inline]] inline bool DeviceMemory::fast_path_open(MemoryCategory category, uint64_t size_bytes) const {
  return fast_path_.load(std::memory_order_relaxed) && size_bytes != 0 &&
         category < MemoryCategory::pool_cache && !device_.is_lost();
}

[[gnu::always_inline]] inline DeviceMemory::Record *DeviceMemory::fast_allocate(Cache &cache, MemoryCategory category,
                                                  uint64_t size_bytes) {
  const auto [bin, class_bytes] = detail::bin_of_size(size_bytes);
  if (bin >= detail::kCacheBins) return nullptr;
  cache.busy.store(1, std::memory_order_relaxed);
  detail::light_barrier();
  Record *record = nullptr;
  auto &slot = cache.bins[bin];
  const uint32_t count = slot.count.load(std::memory_order_relaxed);
  auto &headroom = cache.headroom[index(category)];
  if (cache.drain_requested.load(std::memory_order_acquire) == 0 && count > 0 &&
      headroom.load(std::memory_order_relaxed) >= to_signed(class_bytes)) {
    record = slot.blocks[count - 1];
    slot.count.store(count - 1, std::memory_order_relaxed);
    record->category.store(category, std::memory_order_relaxed);
    Cache::add(headroom, -to_signed(class_bytes));
    Cache::add(cache.headroom[kPoolCache], to_signed(class_bytes));
    Cache::add(cache.fast_allocations, uint64_t{1});
  }
  cache.busy.store(0, std::memory_order_release);
  return record;
}

[[gnu::always_inline]] inline bool DeviceMemory::fast_free(Cache &cache, DeviceAllocation alloc) {
  if (alloc.device != &device_) return false;
  cache.busy.store(1, std::memory_order_relaxed);
  detail::light_barrier();
  bool freed = false;
  Record *record = blocks_->find_fast(alloc.alloc_id);
  // Only a live block this thread's cache owns: nobody else may change such a record.
  if (cache.drain_requested.load(std::memory_order_acquire) == 0 && record != nullptr &&
      record->owner.load(std::memory_order_relaxed) == &cache &&
      record->alloc_id.load(std::memory_order_relaxed) == alloc.alloc_id) {
    const MemoryCategory category = record->category.load(std::memory_order_relaxed);
    const uint32_t bin = record->bin.load(std::memory_order_relaxed);
    if (category != MemoryCategory::pool_cache && bin != detail::kNoBin) {
      auto &slot = cache.bins[bin];
      const uint32_t count = slot.count.load(std::memory_order_relaxed);
      const int64_t class_bytes = to_signed(record->class_bytes.load(std::memory_order_relaxed));
      if (count < kBinDepths[bin] && cache.headroom[kPoolCache].load(std::memory_order_relaxed) >= class_bytes) {
        record->category.store(MemoryCategory::pool_cache, std::memory_order_relaxed);
        slot.blocks[count] = record;
        slot.count.store(count + 1, std::memory_order_relaxed);
        Cache::add(cache.headroom[index(category)], class_bytes);
        Cache::add(cache.headroom[kPoolCache], -class_bytes);
        Cache::add(cache.fast_frees, uint64_t{1});
        freed = true;
      }
    }
  }
  cache.busy.store(0, std::memory_order_release);
  return freed;
}

RhiExpected<DeviceAllocation> DeviceMemory::allocate(MemoryCategory category, uint64_t size_bytes,
                                                     bool zero_fill) {
  if (!zero_fill && fast_path_open(category, size_bytes)) [[likely]] {
    if (Cache *cache = fast_cache(); cache != nullptr) [[likely]] {
      if (Record *record = fast_allocate(*cache, category, size_bytes); record != nullptr) [[likely]]
        return DeviceAllocation{&device_, record->alloc_id.load(std::memory_order_relaxed)};
    }
  }
  return allocate_locked_path(category, size_bytes, zero_fill);
}

RhiStatus DeviceMemory::free(DeviceAllocation alloc) {
  if (fast_path_.load(std::memory_order_relaxed)) [[likely]] {
    if (Cache *cache = fast_cache(); cache != nullptr && fast_free(*cache, alloc)) [[likely]]
      return {};
  }
  return free_locked_path(alloc);
}

// --- the locked path's cache operations (mutex_ held) -----------------------------------------

DeviceMemory::Record *DeviceMemory::take_cached_locked(Cache *cache, MemoryCategory category,
                                                       uint64_t class_bytes) {
  Record *record = nullptr;
  const uint32_t bin = detail::bin_of_class(class_bytes);
  if (cache != nullptr && bin < detail::kCacheBins && detail::class_of_bin(bin) == class_bytes) {
    auto &slot = cache->bins[bin];
    if (const uint32_t count = slot.count.load(std::memory_order_relaxed); count > 0) {
      record = slot.blocks[count - 1];
      slot.count.store(count - 1, std::memory_order_relaxed);
    }
  }
  if (record == nullptr) {
    const auto block = pool_.take(class_bytes);
    if (!block) return nullptr;
    record = blocks_->find(block->alloc_id);
  }
  record->category.store(category, std::memory_order_relaxed);
  record->owner.store(cache, std::memory_order_relaxed);
  move_locked(cache, MemoryCategory::pool_cache, category, class_bytes);
  return record;
}

void DeviceMemory::keep_cached_locked(Cache *cache, Record *record) {
  record->category.store(MemoryCategory::pool_cache, std::memory_order_relaxed);
  const uint32_t bin = record->bin.load(std::memory_order_relaxed);
  if (cache != nullptr && bin != detail::kNoBin) {
    auto &slot = cache->bins[bin];
    if (const uint32_t count = slot.count.load(std::memory_order_relaxed); count < kBinDepths[bin]) {
      slot.blocks[count] = record;
      slot.count.store(count + 1, std::memory_order_relaxed);
      record->owner.store(cache, std::memory_order_relaxed);
      return;
    }
  }
  record->owner.store(nullptr, std::memory_order_relaxed);
  pool_.put(DeviceAllocation{&device_, record->alloc_id.load(std::memory_order_relaxed)},
            record->class_bytes.load(std::memory_order_relaxed));
}

void DeviceMemory::register_block_locked(Cache *cache, DeviceAllocation block,
                                         MemoryCategory category, uint64_t class_bytes) {
  (void)blocks_->add(block.alloc_id, class_bytes, category, cache);
  reclaim_headroom_locked(cache, category);  // so the raised peak counts only what is held
  raise_peak_locked(category);
}

// --- the ledger view ---------------------------------------------------------------------------
// A category's figure = the budget's charge (by the category a block was grown for) + moves_ (the
// locked path's moves made without a cache) + for every cache, grant - headroom.

void DeviceMemory::reclaim_headroom_locked(Cache *cache, MemoryCategory category) {
  // Only the cache's own thread calls this (or the cache is quiesced). Only the category about
  // to be raised gives its headroom up: the others keep theirs for the fast path.
  if (cache == nullptr) return;
  auto &headroom = cache->headroom[index(category)];
  Cache::add(cache->grant[index(category)], -headroom.load(std::memory_order_relaxed));
  headroom.store(0, std::memory_order_relaxed);
}

void DeviceMemory::move_locked(Cache *cache, MemoryCategory from, MemoryCategory to,
                               uint64_t size_bytes) {
  if (cache != nullptr) {
    // Headroom first given up, so the raised peak counts only what is held.
    reclaim_headroom_locked(cache, to);
    Cache::add(cache->headroom[index(from)], to_signed(size_bytes));
    Cache::add(cache->grant[index(to)], to_signed(size_bytes));
  } else {
    moves_[index(from)] -= to_signed(size_bytes);
    moves_[index(to)] += to_signed(size_bytes);
  }
  raise_peak_locked(to);
}

void DeviceMemory::raise_peak_locked(MemoryCategory category) {
  const std::size_t k = index(category);
  int64_t bound = to_signed(budget_.in_use_by_category()[k]) + moves_[k];
  for (const auto &cache : caches_) bound += cache->grant[k].load(std::memory_order_relaxed);
  peaks_[k] = std::max(peaks_[k], static_cast<uint64_t>(std::max<int64_t>(bound, 0)));
}

CategoryBytes DeviceMemory::in_use_by_category_locked() const {
  const CategoryBytes charged = budget_.in_use_by_category();
  CategoryBytes out{};
  for (std::size_t k = 0; k < kNumMemoryCategories; ++k) {
    int64_t bytes = to_signed(charged[k]) + moves_[k];
    for (const auto &cache : caches_)
      bytes += cache->grant[k].load(std::memory_order_relaxed) - cache->headroom[k].load(std::memory_order_relaxed);
    out[k] = static_cast<uint64_t>(std::max<int64_t>(bytes, 0));
  }
  return out;
}

CategoryBytes DeviceMemory::in_use_by_category() const {
  std::lock_guard lock(mutex_);
  return in_use_by_category_locked();
}

void DeviceMemory::reset_peaks() {
  Cache *cache = bind_cache();
  std::lock_guard lock(mutex_);
  for (std::size_t k = 0; k < kNumMemoryCategories; ++k)
    reclaim_headroom_locked(cache, static_cast<MemoryCategory>(k));
  budget_.reset_peaks();
  peaks_ = {};
  for (std::size_t k = 0; k < kNumMemoryCategories; ++k) raise_peak_locked(static_cast<MemoryCategory>(k));
}

// --- eviction ----------------------------------------------------------------------------------

void DeviceMemory::quiesce_caches_locked() {
  if (caches_.empty()) return;
  for (const auto &cache : caches_) cache->drain_requested.store(1, std::memory_order_relaxed);
  detail::heavy_barrier();  // now every owner either sees the request or is seen busy
  for (const auto &cache : caches_)
    while (cache->busy.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

void DeviceMemory::reopen_caches_locked() {
  for (const auto &cache : caches_) cache->drain_requested.store(0, std::memory_order_release);
}

uint64_t DeviceMemory::release_cached() {
  std::vector<Record *> records;
  {
    std::lock_guard lock(mutex_);
    quiesce_caches_locked();
    for (const auto &cache : caches_)
      for (auto &slot : cache->bins) {
        const uint32_t count = slot.count.load(std::memory_order_relaxed);
        records.insert(records.end(), slot.blocks.begin(), slot.blocks.begin() + count);
        slot.count.store(0, std::memory_order_relaxed);
      }
    reopen_caches_locked();
    for (const CachingPool::Block &b : pool_.drain()) records.push_back(blocks_->find(b.alloc.alloc_id));
    for (Record *r : records) blocks_->remove(r);
  }
  // The device lets go first, then the ledger: the device never holds more than the ledger.
  // A block the device failed to free stays charged (the device's synchronize() reports it).
  std::vector<bool> freed(records.size());
  for (std::size_t i = 0; i < records.size(); ++i)
    freed[i] = device_.dealloc_memory(
                   DeviceAllocation{&device_, records[i]->alloc_id.load(std::memory_order_relaxed)})
                   .has_value();
  uint64_t released = 0;
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < records.size(); ++i) {
    Record *r = records[i];
    if (freed[i]) {
      const uint64_t class_bytes = r->class_bytes.load(std::memory_order_relaxed);
      moves_[kPoolCache] -= to_signed(class_bytes);
      moves_[index(r->charged)] += to_signed(class_bytes);
      budget_.release(r->charged, class_bytes);
      released += class_bytes;
    }
    blocks_->recycle(r);
  }
  evictions_.fetch_add(records.size(), std::memory_order_relaxed);
  return released;
}

void DeviceMemory::count(Counter counter, uint64_t n) {
  static_assert(std::tuple_size_v<decltype(Cache::counters)> == kNumCounters);
  if (Cache *cache = my_cache(); cache != nullptr)
    Cache::add(cache->counters[counter], n);  // only this thread writes its cache's counters
  else
    counters_[counter].fetch_add(n, std::memory_order_relaxed);
}

// --- stats ---------------------------------------------------------------------------------------

uint64_t DeviceMemory::cache_request_count() const {
  std::lock_guard lock(mutex_);
  uint64_t n = retired_requests_;
  for (const auto &cache : caches_)
    n += cache->fast_allocations.load(std::memory_order_relaxed) + cache->requests.load(std::memory_order_relaxed);
  return n;
}

MemoryStats DeviceMemory::stats() const {
  MemoryStats s;
  s.ledger = budget_.stats();
  s.reserve_bytes = reserve_bytes_;
  uint64_t fast_allocations = 0, fast_frees = 0;
  std::array<uint64_t, kNumCounters> counters{};
  for (std::size_t c = 0; c < kNumCounters; ++c) counters[c] = counters_[c].load(std::memory_order_relaxed);
  {
    std::lock_guard lock(mutex_);
    s.ledger.current_bytes = in_use_by_category_locked();
    for (std::size_t k = 0; k < kNumMemoryCategories; ++k)
      s.ledger.peak_bytes[k] = std::max(peaks_[k], s.ledger.current_bytes[k]);
    s.cached_bytes = pool_.cached_bytes();
    s.cached_blocks = pool_.cached_blocks();
    for (const auto &cache : caches_) {
      s.cached_bytes += cache->cached_bytes();
      s.cached_blocks += cache->cached_blocks();
      fast_allocations += cache->fast_allocations.load(std::memory_order_relaxed);
      fast_frees += cache->fast_frees.load(std::memory_order_relaxed);
      for (std::size_t c = 0; c < kNumCounters; ++c) counters[c] += cache->counters[c].load(std::memory_order_relaxed);
    }
  }
  s.allocations = counters[kAllocations] + fast_allocations;
  s.frees = counters[kFrees] + fast_frees;
  s.cache_hits = counters[kCacheHits] + fast_allocations;
  s.lock_free_hits = counters[kLockFreeHits] + fast_allocations;
  s.evictions = evictions_.load();
  s.live_checks = counters[kLiveChecks];
  s.live_refusals = live_refusals_.load();
  s.driver_ooms = driver_ooms_.load();
  s.retries = retries_.load();
  return s;
}

std::string DeviceMemory::summary() const {
  const MemoryStats s = stats();
  std::string out = fmt::format("kiln memory summary: {} (limit {}, reserve {})\n", device_.name(),
                                format_bytes(s.ledger.limit_bytes), format_bytes(s.reserve_bytes));
  out += fmt::format("  {:<16} {:>12} {:>12}\n", "category", "current", "peak");
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    out += fmt::format("  {:<16} {:>12} {:>12}\n", to_string(static_cast<MemoryCategory>(i)),
                       format_bytes(s.ledger.current_bytes[i]), format_bytes(s.ledger.peak_bytes[i]));
  out += fmt::format("  {:<16} {:>12} {:>12}\n", "total", format_bytes(s.ledger.current_total_bytes()),
                     format_bytes(s.ledger.peak_total_bytes));
  out += fmt::format("  pool: {} cached in {} blocks; {} hits ({} lock-free) of {} allocations; "
                     "{} evicted\n",
                     format_bytes(s.cached_bytes), s.cached_blocks, s.cache_hits, s.lock_free_hits,
                     s.allocations, s.evictions);
  out += fmt::format("  refusals: {} by budget, {} by live free memory; driver out-of-memory: {}; "
                     "retries: {}; frees: {}; live checks: {}\n",
                     s.ledger.refusals, s.live_refusals, s.driver_ooms, s.retries, s.frees,
                     s.live_checks);
  return out;
}

// --- RequestFaultPlan ----------------------------------------------------------------------------

void RequestFaultPlan::fail_nth_allocation(uint64_t n) {
  fast_baseline_.store(memory_.cache_request_count(), std::memory_order_relaxed);
  plan_.fail_nth_allocation(n);
  fail_at_.store(n, std::memory_order_relaxed);
  update_armed();
}

void RequestFaultPlan::fail_sizes_at_least(uint64_t size_bytes) {
  plan_.fail_sizes_at_least(size_bytes);
  fail_size_.store(size_bytes, std::memory_order_relaxed);
  update_armed();
}

void RequestFaultPlan::clear() {
  plan_.clear();
  fail_at_.store(kNever, std::memory_order_relaxed);
  fail_size_.store(kNever, std::memory_order_relaxed);
  update_armed();
}

void RequestFaultPlan::update_armed() {
  armed_.store(fail_at_.load(std::memory_order_relaxed) != kNever ||
                   fail_size_.load(std::memory_order_relaxed) != kNever,
               std::memory_order_relaxed);
  memory_.update_fast_path();
}

uint64_t RequestFaultPlan::allocation_count() const {
  return plan_.allocation_count() + memory_.cache_request_count() -
         fast_baseline_.load(std::memory_order_relaxed);
}

}  // namespace kiln::runtime
