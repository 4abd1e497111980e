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
  /// The size class of a request: the bytes a block serving it has. Requests up to 512 B share
  /// one class; up to 4 MiB (the thread caches' classes), sizes round up to a quarter of their
  /// power of two (at most 25 % slack, at most 1 MiB above 1 MiB). Above 4 MiB the step is the
  /// smaller of that quarter and max(2 MiB, the power of two at most 1/64 of the size), so a
  /// block over 1 MiB wastes less than max(2 MiB, 1/64 of it) (PyTorch rounds large blocks to
  /// 2 MiB; the 1/64 keeps the number of classes of very large blocks small). Every class is
  /// its own class, and the function is monotone. Returns 0 when rounding would overflow.
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
