#include "thread_cache.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>

namespace kiln::runtime::detail {

namespace {

long membarrier(int command) { return syscall(__NR_membarrier, command, 0, 0); }

std::atomic<bool> g_membarrier_ready{false};

}  // namespace

uint64_t ThreadCache::cached_bytes() const {
  uint64_t bytes = 0;
  for (uint32_t b = 0; b < kCacheBins; ++b)
    bytes += bins[b].count.load(std::memory_order_relaxed) * class_of_bin(b);
  return bytes;
}

uint64_t ThreadCache::cached_blocks() const {
  uint64_t blocks = 0;
  for (const Bin &bin : bins) blocks += bin.count.load(std::memory_order_relaxed);
  return blocks;
}

bool ThreadCache::read_shares(std::array<int64_t, kNumMemoryCategories> &shares) const {
  // A fast-path pass takes a few ns: a reader that finds the owner inside waits a moment.
  constexpr int kTries = 64;
  for (int attempt = 0; attempt < kTries; ++attempt) {
    const uint32_t count = busy.load(std::memory_order_acquire);
    if (count % 2 != 0) {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      continue;
    }
    read_quiesced_shares(shares);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (busy.load(std::memory_order_relaxed) == count) return true;
  }
  return false;
}

void ThreadCache::read_quiesced_shares(std::array<int64_t, kNumMemoryCategories> &shares) const {
  for (std::size_t k = 0; k < kNumMemoryCategories; ++k)
    shares[k] =
        grant[k].load(std::memory_order_relaxed) - headroom[k].load(std::memory_order_relaxed);
}

bool init_asymmetric_barrier() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Linux >= 4.14. A seccomp filter or an older kernel answers -1: keep the fence fallback.
    const long supported = membarrier(MEMBARRIER_CMD_QUERY);
    if (supported < 0 || (supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0) return;
    if (membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED) != 0) return;
    g_membarrier_ready.store(true, std::memory_order_relaxed);
  });
  return g_membarrier_ready.load(std::memory_order_relaxed);
}

void heavy_barrier() {
  // Once registered, PRIVATE_EXPEDITED does not fail (membarrier(2)); owners rely on it.
  if (g_membarrier_ready.load(std::memory_order_relaxed))
    (void)membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED);
  else
    std::atomic_thread_fence(std::memory_order_seq_cst);
}

}  // namespace kiln::runtime::detail
