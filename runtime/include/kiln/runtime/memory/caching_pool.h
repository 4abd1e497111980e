// The caching pool: freed device blocks kept by size class for reuse without a driver call.
#ifndef KILN_RUNTIME_MEMORY_CACHING_POOL_H_
#define KILN_RUNTIME_MEMORY_CACHING_POOL_H_

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "kiln/rhi/device.h"

namespace kiln::runtime {

/// Free lists of device blocks, one per size class. Not thread-safe: DeviceMemory guards it.
class CachingPool {
 public:
  /// The size class of a request (size_classes.h: runtime::size_class, documented there).
  [[nodiscard]] static uint64_t size_class(uint64_t size_bytes);

  /// A cached block of exactly `class_bytes`, removed from the pool, or nullopt.
  [[nodiscard]] std::optional<DeviceAllocation> take(uint64_t class_bytes);
  /// The smallest cached block of `min_bytes` to `max_bytes` (a request's exact size and its
  /// class: blocks the pool allocated at the exact size when the class did not fit), removed
  /// from the pool with its bytes, or nullopt.
  [[nodiscard]] std::optional<std::pair<DeviceAllocation, uint64_t>> take_within(
      uint64_t min_bytes, uint64_t max_bytes);
  /// Keeps a block of `class_bytes` for reuse.
  void put(DeviceAllocation block, uint64_t class_bytes);

  struct Block {
    DeviceAllocation alloc;
    uint64_t class_bytes;
  };
  /// Removes and returns every cached block (to be freed to the device).
  [[nodiscard]] std::vector<Block> drain();

  [[nodiscard]] uint64_t cached_bytes() const { return cached_bytes_; }
  [[nodiscard]] uint64_t cached_blocks() const { return cached_blocks_; }

 private:
  std::map<uint64_t, std::vector<DeviceAllocation>> free_by_class_;
  uint64_t cached_bytes_ = 0;
  uint64_t cached_blocks_ = 0;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_CACHING_POOL_H_
