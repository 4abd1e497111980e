#include "kiln/runtime/memory/caching_pool.h"

#include <bit>

namespace kiln::runtime {

uint64_t CachingPool::size_class(uint64_t size_bytes) {
  constexpr uint64_t kMinClass = 512;
  if (size_bytes <= kMinClass) return kMinClass;
  // Quarter steps of the power of two: shifts, not a division.
  const unsigned shift = static_cast<unsigned>(std::bit_width(size_bytes)) - 3;
  const uint64_t quarters = (size_bytes >> shift) + ((size_bytes & ((1ull << shift) - 1)) != 0);
  const uint64_t rounded = quarters << shift;  // 0 when it passes 2^64
  return rounded < size_bytes ? 0 : rounded;
}

std::optional<DeviceAllocation> CachingPool::take(uint64_t class_bytes) {
  auto it = free_by_class_.find(class_bytes);
  if (it == free_by_class_.end() || it->second.empty()) return std::nullopt;
  const DeviceAllocation block = it->second.back();
  it->second.pop_back();
  cached_bytes_ -= class_bytes;
  --cached_blocks_;
  return block;
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
