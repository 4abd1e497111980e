#include "kiln/runtime/memory/caching_pool.h"

#include "kiln/runtime/memory/size_classes.h"

#include <algorithm>

namespace kiln::runtime {

uint64_t CachingPool::size_class(uint64_t size_bytes) { return runtime::size_class(size_bytes); }

std::optional<DeviceAllocation> CachingPool::take(uint64_t class_bytes) {
  auto it = free_by_class_.find(class_bytes);
  if (it == free_by_class_.end() || it->second.empty()) return std::nullopt;
  const DeviceAllocation block = it->second.back();
  it->second.pop_back();
  cached_bytes_ -= class_bytes;
  --cached_blocks_;
  return block;
}

std::optional<std::pair<DeviceAllocation, uint64_t>> CachingPool::take_within(uint64_t min_bytes,
                                                                            uint64_t max_bytes) {
  for (auto it = free_by_class_.lower_bound(min_bytes);
       it != free_by_class_.end() && it->first <= max_bytes; ++it) {
    if (it->second.empty()) continue;
    const uint64_t class_bytes = it->first;
    auto block = take(class_bytes);
    return std::pair{*block, class_bytes};
  }
  return std::nullopt;
}

void CachingPool::put(DeviceAllocation block, uint64_t class_bytes) {
  free_by_class_[class_bytes].push_back(block);
  cached_bytes_ += class_bytes;
  ++cached_blocks_;
}

std::vector<CachingPool::Block> CachingPool::drain() {
  std::vector<Block> blocks;
  blocks.reserve(cached_blocks_);
  for (auto &[class_bytes, list] : free_by_class_)
    for (DeviceAllocation a : list) blocks.push_back(Block{a, class_bytes});
  free_by_class_.clear();
  cached_bytes_ = 0;
  cached_blocks_ = 0;
  return blocks;
}

}  // namespace kiln::runtime
