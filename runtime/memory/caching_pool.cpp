#include "kiln/runtime/memory/caching_pool.h"

#include <algorithm>
#include <bit>

namespace kiln::runtime {

uint64_t CachingPool::size_class(uint64_t size_bytes) {
  constexpr uint64_t kMinClass = 512;
  if (size_bytes <= kMinClass) return kMinClass;
  constexpr uint64_t kThreadCacheClasses = 4ull << 20;  // quarter steps up to here
  constexpr unsigned kLargeStepShift = 21;                // 2 MiB
  // Quarter steps of the power of two: shifts, not a division.
  unsigned shift = static_cast<unsigned>(std::bit_width(size_bytes)) - 3;
  if (size_bytes > kThreadCacheClasses) {
    // 1/64 of the size, rounded down to a power of two, but not below 2 MiB.
    const unsigned fine = std::max(kLargeStepShift,
                                   static_cast<unsigned>(std::bit_width(size_bytes >> 6)) - 1);
    shift = std::min(shift, fine);
  }
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
