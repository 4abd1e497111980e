// DeviceMemory's ledger view: per-category figures that add every thread cache's share, peaks
// that never fall below the truth, the counters and stats() (summary: memory_stats.cpp).
#include <algorithm>

#include <fmt/format.h>

#include "kiln/runtime/memory/device_memory.h"
#include "thread_cache.h"

namespace kiln::runtime {

using detail::index;
using detail::kPoolCache;
using detail::to_signed;

// --- the ledger view ---------------------------------------------------------------------------
// A category's figure = the budget's charge (by the category a block was grown for) + moves_ (the
// locked path's moves made without a cache) + for every cache, grant - headroom.

void DeviceMemory::move_locked(Cache *cache, MemoryCategory from, MemoryCategory to,
                               uint64_t size_bytes) {
  // `cache`: the calling thread's, when the block is (or comes from) its bins; else nullptr.
  if (cache != nullptr) {
    // Headroom first given up, so the raised peak counts only what is held.
    cache->reclaim_headroom(to);
    Cache::add(cache->headroom[index(from)], to_signed(size_bytes));
    Cache::add(cache->grant[index(to)], to_signed(size_bytes));
    cache->trim_headroom();
  } else {
    Cache::add(moves_[index(from)], -to_signed(size_bytes));
    Cache::add(moves_[index(to)], to_signed(size_bytes));
  }
  raise_peak_locked(to);
}

void DeviceMemory::raise_peak_locked(MemoryCategory category) {
  const std::size_t k = index(category);
  int64_t bound =
      to_signed(adaptor_.budget().in_use_by_category()[k]) + moves_[k].load(std::memory_order_relaxed);
  for (const auto &cache : caches_) bound += cache->grant[k].load(std::memory_order_relaxed);
  peaks_[k] = std::max(peaks_[k], static_cast<uint64_t>(std::max<int64_t>(bound, 0)));
}

bool DeviceMemory::view_bytes(CategoryBytes &out, bool quiesced) const {
  const CategoryBytes charged = adaptor_.budget().in_use_by_category();
  std::array<int64_t, kNumMemoryCategories> bytes{}, shares{};
  for (std::size_t k = 0; k < kNumMemoryCategories; ++k)
    bytes[k] = to_signed(charged[k]) + moves_[k].load(std::memory_order_relaxed);
  for (const Cache *cache = cache_list_.load(std::memory_order_acquire); cache != nullptr;
       cache = cache->next.load(std::memory_order_relaxed)) {
    if (quiesced)
      cache->read_quiesced_shares(shares);
    else if (!cache->read_shares(shares))
      return false;
    for (std::size_t k = 0; k < kNumMemoryCategories; ++k) bytes[k] += shares[k];
  }
  for (std::size_t k = 0; k < kNumMemoryCategories; ++k)
    out[k] = static_cast<uint64_t>(std::max<int64_t>(bytes[k], 0));
  return true;
}

CategoryBytes DeviceMemory::in_use_by_category_locked() const {
  CategoryBytes out{};
  if (view_bytes(out)) return out;
  // An owner kept passing through its fast path: stop every fast path for one reading.
  detail::quiesce_all(caches_);
  (void)view_bytes(out, true);
  detail::reopen_all(caches_);
  return out;
}

CategoryBytes DeviceMemory::in_use_by_category() const {
  // Lock-free while no locked operation is under way: a refusal's picture and stats pollers do
  // not wait for (or hold up) the allocating threads. A few tries, then the lock.
  CategoryBytes out{};
  for (int attempt = 0; attempt < 4; ++attempt) {
    const uint64_t seq = mutex_.read_begin();
    if (seq % 2 != 0) continue;
    if (view_bytes(out) && mutex_.read_valid(seq)) return out;
  }
  std::lock_guard lock(mutex_);
  return in_use_by_category_locked();
}

void DeviceMemory::reset_peaks() {
  Cache *cache = bind_cache();
  std::lock_guard lock(mutex_);
  for (std::size_t k = 0; cache != nullptr && k < kNumMemoryCategories; ++k)
    cache->reclaim_headroom(static_cast<MemoryCategory>(k));
  adaptor_.budget().reset_peaks();
  peaks_ = {};
  for (std::size_t k = 0; k < kNumMemoryCategories; ++k)
    raise_peak_locked(static_cast<MemoryCategory>(k));
}

// --- stats ---------------------------------------------------------------------------------------

uint64_t DeviceMemory::cache_request_count() const {
  std::lock_guard lock(mutex_);
  uint64_t n = retired_requests_;
  for (const auto &cache : caches_)
    n += cache->fast_allocations.load(std::memory_order_relaxed) +
         cache->requests.load(std::memory_order_relaxed);
  return n;
}

MemoryStats DeviceMemory::stats() const {
  MemoryStats s;
  s.ledger = adaptor_.budget().stats();
  s.reserve_bytes = adaptor_.reserve_bytes();
  uint64_t fast_allocations = 0, fast_frees = 0;
  std::array<uint64_t, kNumCounters> counters{};
  {
    std::lock_guard lock(
        mutex_);  // with the caches: an exiting thread moves its counts between them
    for (std::size_t c = 0; c < kNumCounters; ++c)
      counters[c] = counters_[c].load(std::memory_order_relaxed);
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
      for (std::size_t c = 0; c < kNumCounters; ++c)
        counters[c] += cache->counters[c].load(std::memory_order_relaxed);
    }
  }
  s.allocations = counters[kAllocations] + fast_allocations;
  s.frees = counters[kFrees] + fast_frees;
  s.cache_hits = counters[kCacheHits] + fast_allocations;
  s.lock_free_hits = counters[kLockFreeHits] + fast_allocations;
  s.evictions = evictions_.load();
  const GrowthCounters &growth = adaptor_.counters();
  s.live_checks = growth.live_checks.load();
  s.live_refusals = growth.live_refusals.load();
  s.driver_ooms = growth.driver_ooms.load();
  s.retries = growth.retries.load();
  s.ledger.refusals = growth.budget_refusals.load();  // not the budget's: those include cured ones
  return s;
}

std::string DeviceMemory::summary() const { return format_memory_summary(device_.name(), stats()); }

}  // namespace kiln::runtime
