#include "thread_cache.h"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <mutex>
#include <thread>

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

void ThreadCache::reclaim_headroom(MemoryCategory category) {
  // Only the category about to be raised gives its headroom up: the others keep theirs for the
  // fast path.
  auto &room = headroom[index(category)];
  add(grant[index(category)], -room.load(std::memory_order_relaxed));
  room.store(0, std::memory_order_relaxed);
}

void ThreadCache::trim_headroom() {
  const int64_t cap = to_signed(owned_bytes.load(std::memory_order_relaxed));
  for (std::size_t k = 0; k < kNumMemoryCategories; ++k) {
    const int64_t excess = headroom[k].load(std::memory_order_relaxed) - cap;
    if (excess <= 0) continue;
    add(grant[k], -excess);
    add(headroom[k], -excess);
  }
}

std::vector<BlockRecord *> ThreadCache::take_bins() {
  std::vector<BlockRecord *> records;
  for (auto &slot : bins) {
    const uint32_t count = slot.count.load(std::memory_order_relaxed);
    records.insert(records.end(), slot.blocks.begin(), slot.blocks.begin() + count);
    slot.count.store(0, std::memory_order_relaxed);
  }
  return records;
}

void ThreadCache::quiesce() {
  drain_requested.store(1, std::memory_order_relaxed);
  heavy_barrier();
  wait_not_busy();
}

void ThreadCache::wait_not_busy() const {
  // The owner leaves its fast path within a few instructions; after fork() it never will (it
  // is gone), and no fast path runs in the child.
  while (busy.load(std::memory_order_acquire) % 2 != 0) {
    if (in_forked_child()) return;
    std::this_thread::yield();
  }
}

void set_owner(BlockRecord &record, ThreadCache *owner) {
  ThreadCache *previous = record.owner.load(std::memory_order_relaxed);
  if (previous == owner) return;
  const uint64_t class_bytes = record.class_bytes.load(std::memory_order_relaxed);
  if (previous != nullptr) ThreadCache::add(previous->owned_bytes, -class_bytes);
  if (owner != nullptr) ThreadCache::add(owner->owned_bytes, class_bytes);
  record.owner.store(owner, std::memory_order_relaxed);
}

void quiesce_all(std::span<const std::unique_ptr<ThreadCache>> caches) {
  // Retired caches have no thread to stop: no barrier is needed for them alone.
  bool any_bound = false;
  for (const auto &cache : caches) {
    cache->drain_requested.store(1, std::memory_order_relaxed);
    any_bound |= cache->bound;
  }
  if (!any_bound) return;
  heavy_barrier();  // now every owner either sees the request or is seen busy
  for (const auto &cache : caches) cache->wait_not_busy();
}

void reopen_all(std::span<const std::unique_ptr<ThreadCache>> caches) {
  for (const auto &cache : caches) cache->reopen();
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
