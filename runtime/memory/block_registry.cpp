// BlockRegistry: every block a DeviceMemory holds, live or cached, found by its allocation id
// without a lock on the fast path (thread_cache.h).
#include "thread_cache.h"

namespace kiln::runtime::detail {

BlockRegistry::BlockRegistry() {
  for (auto &slot : lookup_) slot.store(&unused_slot_, std::memory_order_relaxed);
}

BlockRecord *BlockRegistry::add(uint64_t alloc_id, uint64_t class_bytes, MemoryCategory category,
                                ThreadCache *owner) {
  BlockRecord *record = nullptr;
  if (!free_records_.empty()) {
    record = free_records_.back();
    free_records_.pop_back();
  } else {
    record = &records_.emplace_back();
  }
  const uint32_t bin = bin_of_class(class_bytes);
  const bool cacheable = bin < kCacheBins && class_of_bin(bin) == class_bytes;
  record->alloc_id.store(alloc_id, std::memory_order_relaxed);
  record->class_bytes.store(class_bytes, std::memory_order_relaxed);
  record->bin.store(cacheable ? bin : kNoBin, std::memory_order_relaxed);
  record->category.store(category, std::memory_order_relaxed);
  record->charged = category;
  record->owner.store(owner, std::memory_order_relaxed);
  by_id_[alloc_id] = record;
  lookup_[slot(alloc_id)].store(record, std::memory_order_release);
  return record;
}

BlockRecord *BlockRegistry::find(uint64_t alloc_id) const {
  auto it = by_id_.find(alloc_id);
  return it == by_id_.end() ? nullptr : it->second;
}

void BlockRegistry::remove(BlockRecord *record) {
  by_id_.erase(record->alloc_id.load(std::memory_order_relaxed));
  record->owner.store(nullptr, std::memory_order_relaxed);
}

void BlockRegistry::recycle(BlockRecord *record) {
  record->alloc_id.store(0, std::memory_order_relaxed);
  free_records_.push_back(record);
}

std::vector<BlockRecord *> BlockRegistry::all() const {
  std::vector<BlockRecord *> out;
  out.reserve(by_id_.size());
  for (const auto &[id, record] : by_id_) out.push_back(record);
  return out;
}

}  // namespace kiln::runtime::detail
