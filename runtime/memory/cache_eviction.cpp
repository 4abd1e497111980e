// DeviceMemory's cache operations under its mutex (taking a cached block, keeping a freed one,
// the ledger's side of both) and eviction: quiescing other threads' caches (thread_cache.h) and
// giving every cached block back to the device.
#include "kiln/runtime/memory/device_memory.h"
#include "thread_cache.h"

namespace kiln::runtime {

using detail::index;
using detail::to_signed;

// --- the locked path's cache operations (mutex_ held) -----------------------------------------

DeviceMemory::Record *DeviceMemory::take_cached_locked(Cache *cache, MemoryCategory category,
                                                       uint64_t size_bytes, uint64_t class_bytes) {
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
    // The class, or a block the pool allocated at an exact size between the two.
    const auto block = pool_.take_within(size_bytes, class_bytes);
    if (!block) return nullptr;
    record = blocks_->find(block->first.alloc_id);
  }
  detail::set_owner(*record, cache);
  move_locked(cache, MemoryCategory::pool_cache, category,
              record->class_bytes.load(std::memory_order_relaxed));
  return record;
}

bool DeviceMemory::keep_cached_locked(Cache *cache, Record *record) {
  record->category.store(MemoryCategory::pool_cache, std::memory_order_relaxed);
  const uint32_t bin = record->bin.load(std::memory_order_relaxed);
  if (cache != nullptr && bin != detail::kNoBin) {
    auto &slot = cache->bins[bin];
    if (const uint32_t count = slot.count.load(std::memory_order_relaxed);
        count < slot.depth) {
      slot.blocks[count] = record;
      slot.count.store(count + 1, std::memory_order_relaxed);
      detail::set_owner(*record, cache);
      return true;
    }
  }
  detail::set_owner(*record, nullptr);
  pool_.put(DeviceAllocation{&device_, record->alloc_id.load(std::memory_order_relaxed)},
            record->class_bytes.load(std::memory_order_relaxed));
  return false;
}

void DeviceMemory::cache_freed_locked(Cache *cache, Record *record, MemoryCategory category) {
  // pool_cache's peak is raised below wherever the block goes: first give up this thread's own
  // pool_cache headroom, else the bound counts it on top of what is held.
  if (cache != nullptr) cache->reclaim_headroom(MemoryCategory::pool_cache);
  const bool kept_here = keep_cached_locked(cache, record);
  // Headroom is credited only to the cache that now holds the block.
  move_locked(kept_here ? cache : nullptr, category, MemoryCategory::pool_cache,
              record->class_bytes.load(std::memory_order_relaxed));
}

void DeviceMemory::release_charge_locked(const Record &record, MemoryCategory category) {
  // Back to the category the budget charged at growth, then out of the budget.
  const uint64_t class_bytes = record.class_bytes.load(std::memory_order_relaxed);
  Cache::add(moves_[index(category)], -to_signed(class_bytes));
  Cache::add(moves_[index(record.charged)], to_signed(class_bytes));
  adaptor_.budget().release(record.charged, class_bytes);
}

void DeviceMemory::register_block_locked(Cache *cache, DeviceAllocation block,
                                         MemoryCategory category, uint64_t class_bytes) {
  Record *record = blocks_->add(block.alloc_id, class_bytes, category, nullptr);
  detail::set_owner(*record, cache);
  if (cache != nullptr) cache->reclaim_headroom(category);  // the raised peak: only what is held
  raise_peak_locked(category);
}

// --- eviction ----------------------------------------------------------------------------------

bool DeviceMemory::evict_for_retry() {
  // Another thread evicting right now: wait until its bytes are back with the device and the
  // ledger, and let the caller retry as if this thread had evicted them.
  std::unique_lock evicting(evict_mutex_, std::try_to_lock);
  if (!evicting.owns_lock()) {
    evicting.lock();
    return true;
  }
  return release_cached_holding_evict_lock() > 0;
}

uint64_t DeviceMemory::release_cached() {
  std::lock_guard evicting(evict_mutex_);
  return release_cached_holding_evict_lock();
}

uint64_t DeviceMemory::release_cached_holding_evict_lock() {
  std::vector<Record *> records;
  {
    std::lock_guard lock(mutex_);
    detail::quiesce_all(caches_);
    for (const auto &cache : caches_) {
      for (Record *r : cache->take_bins()) {
        detail::set_owner(*r, nullptr);
        records.push_back(r);
      }
      cache->trim_headroom();  // quiesced: its headroom may be written here
    }
    detail::reopen_all(caches_);
    for (const CachingPool::Block &b : pool_.drain())
      records.push_back(blocks_->find(b.alloc.alloc_id));
    for (Record *r : records) blocks_->remove(r);
  }
  // The device lets go first, then the ledger: the device never holds more than the ledger.
  // A block the device failed to free stays charged (the device's synchronize() reports it).
  std::vector<bool> freed(records.size());
  for (std::size_t i = 0; i < records.size(); ++i)
    freed[i] = device_
                   .dealloc_memory(DeviceAllocation{
                       &device_, records[i]->alloc_id.load(std::memory_order_relaxed)})
                   .has_value();
  uint64_t released = 0;
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < records.size(); ++i) {
    Record *r = records[i];
    if (freed[i]) {
      release_charge_locked(*r, MemoryCategory::pool_cache);
      released += r->class_bytes.load(std::memory_order_relaxed);
    }
    blocks_->recycle(r);
  }
  evictions_.fetch_add(records.size(), std::memory_order_relaxed);
  return released;
}

}  // namespace kiln::runtime
