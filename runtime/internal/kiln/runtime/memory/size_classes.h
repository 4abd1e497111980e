// The caching pool's size classes, in one place: the class a request rounds up to, and the
// thread caches' bins (one per class up to 4 MiB) that the lock-free path indexes directly.
#ifndef KILN_RUNTIME_MEMORY_SIZE_CLASSES_H_
#define KILN_RUNTIME_MEMORY_SIZE_CLASSES_H_

#include <algorithm>
#include <bit>
#include <cstdint>

namespace kiln::runtime {

namespace detail {

/// The bin of a caching-pool size class (CachingPool::size_class): 0 for classes up to 512 B,
/// then four per power of two (the class's quarter steps).
[[nodiscard]] constexpr uint32_t bin_of_class(uint64_t class_bytes) {
  if (class_bytes <= 512) return 0;
  const uint32_t k = static_cast<uint32_t>(std::bit_width(class_bytes)) - 1;
  return (k - 9) * 4 + static_cast<uint32_t>((class_bytes - (1ull << k)) >> (k - 2));
}

/// Thread caches keep classes up to 4 MiB; larger blocks live in the shared pool only.
inline constexpr uint32_t kCacheBins = bin_of_class(4ull << 20) + 1;
inline constexpr uint32_t kNoBin = UINT32_MAX;
inline constexpr uint32_t kMaxBinDepth = 7;  // a bin is then one 64-byte cache line

/// The class bytes of bin `bin` (inverse of bin_of_class).
[[nodiscard]] constexpr uint64_t class_of_bin(uint32_t bin) {
  if (bin == 0) return 512;
  const uint32_t k = 9 + bin / 4;
  return (1ull << k) + static_cast<uint64_t>(bin % 4) * (1ull << (k - 2));
}

/// Blocks a thread cache keeps per bin: 7 for small classes, fewer as they grow, so that one
/// bin holds at most max(4 MiB, one block); all bins of one cache hold at most 65 MiB.
[[nodiscard]] constexpr uint32_t bin_depth(uint32_t bin) {
  const uint64_t by_bytes = (4ull << 20) / class_of_bin(bin);
  return by_bytes >= kMaxBinDepth ? kMaxBinDepth
                                  : (by_bytes == 0 ? 1 : static_cast<uint32_t>(by_bytes));
}

/// The bin and class bytes of a request, in one step (the fast path's version of size_class).
struct BinClass {
  uint32_t bin;
  uint64_t class_bytes;
};
[[nodiscard]] constexpr BinClass bin_of_size(uint64_t size_bytes) {
  if (size_bytes <= 512) return {0, 512};
  const uint32_t k = static_cast<uint32_t>(std::bit_width(size_bytes)) - 1;
  const uint32_t shift = k - 2;
  const uint64_t quarters = (size_bytes + (1ull << shift) - 1) >> shift;  // 4..8
  return {(k - 9) * 4 + static_cast<uint32_t>(quarters - 4), quarters << shift};
}

}  // namespace detail

/// The size class of a request: the bytes a block serving it has. Requests up to 512 B share one
/// class; up to 4 MiB (the thread caches' classes: detail::bin_of_size), sizes round up to a
/// quarter of their power of two (at most 25 % slack, at most 1 MiB above 1 MiB). Above 4 MiB the
/// step is the smaller of that quarter and max(2 MiB, the power of two at most 1/64 of the size),
/// so a block over 1 MiB wastes less than max(2 MiB, 1/64 of it) (PyTorch rounds large blocks to
/// 2 MiB; the 1/64 keeps the number of classes of very large blocks small). Every class is its
/// own class, and the function is monotone. Returns 0 when rounding would overflow.
[[nodiscard]] constexpr uint64_t size_class(uint64_t size_bytes) {
  constexpr uint64_t kThreadCacheClasses = 4ull << 20;
  if (size_bytes <= kThreadCacheClasses) return detail::bin_of_size(size_bytes).class_bytes;
  constexpr unsigned kLargeStepShift = 21;  // 2 MiB
  // Quarter steps of the power of two, or 1/64 of the size rounded down to a power of two, but
  // not below 2 MiB: shifts, not a division.
  const unsigned quarter = static_cast<unsigned>(std::bit_width(size_bytes)) - 3;
  const unsigned fine =
      std::max(kLargeStepShift, static_cast<unsigned>(std::bit_width(size_bytes >> 6)) - 1);
  const unsigned shift = std::min(quarter, fine);
  const uint64_t steps = (size_bytes >> shift) + ((size_bytes & ((1ull << shift) - 1)) != 0);
  const uint64_t rounded = steps << shift;  // 0 when it passes 2^64
  return rounded < size_bytes ? 0 : rounded;
}

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_SIZE_CLASSES_H_
