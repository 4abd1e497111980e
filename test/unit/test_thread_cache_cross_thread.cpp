// DeviceMemory's per-thread caches (runtime/memory/thread_cache.h), across threads: a block freed
// on another thread than its owner's, two threads freeing one block at once, a second free refused
// even when a cache could take it lock-free, and bins' depth.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"
#include "thread_cache_test_support.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

TEST_CASE_METHOD(CachedMemoryOnMock<100_MiB>,
                 "a block allocated on one thread and freed on another is cached, reusable, freed once",
                 "[thread_cache][concurrency]") {
  Worker a;

  // On A: a miss, freed on A, then a hit from A's own cache (lock-free), and a second live block.
  struct Blocks {
    RhiExpected<DeviceAllocation> first, hit, other;
    RhiStatus freed;
  };
  Blocks on_a = a.run([&] {
    Blocks b;
    b.first = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    if (b.first) b.freed = memory->free(*b.first);
    b.hit = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    b.other = memory->allocate(MemoryCategory::staging, 64_KiB);
    return b;
  });
  REQUIRE(on_a.first);
  REQUIRE(on_a.freed);
  REQUIRE(on_a.hit);
  REQUIRE(on_a.other);
  REQUIRE(*on_a.hit == *on_a.first);
  const DeviceAllocation y = *on_a.hit;
  const DeviceAllocation z = *on_a.other;
  CHECK(memory->stats().cache_hits == 1);
  CHECK(charged(*memory, MemoryCategory::ndarray) == 1_MiB);
  CHECK(charged(*memory, MemoryCategory::staging) == 64_KiB);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == 0);
  check_ledger(*memory, mock, 2);

  // The main thread frees A's block: it is cached, charged as pool_cache, still held by the driver.
  REQUIRE(memory->free(y));
  CHECK(charged(*memory, MemoryCategory::ndarray) == 0);
  CHECK(charged(*memory, MemoryCategory::staging) == 64_KiB);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == 1_MiB);
  CHECK(memory->in_use_bytes() == 1_MiB + 64_KiB);
  CHECK(mock.held_bytes() == 1_MiB + 64_KiB);
  CHECK(mock.live_allocation_count() == 2);
  CHECK(memory->stats().cached_blocks == 1);
  CHECK(memory->stats().cached_bytes == 1_MiB);
  CHECK(memory->stats().frees == 2);
  check_ledger(*memory, mock, 1);

  // Freeing it again, on either thread, is invalid_usage and changes nothing.
  const auto ledger = memory->in_use_by_category();
  auto again_here = memory->free(y);
  REQUIRE_FALSE(again_here);
  CHECK(again_here.error().result == RhiResult::invalid_usage);
  auto again_on_a = a.run([&] { return memory->free(y); });
  REQUIRE_FALSE(again_on_a);
  CHECK(again_on_a.error().result == RhiResult::invalid_usage);
  CHECK(memory->in_use_by_category() == ledger);
  CHECK(memory->stats().cached_blocks == 1);
  CHECK(memory->stats().frees == 2);
  CHECK(mock.held_bytes() == 1_MiB + 64_KiB);

  // The main thread reuses it (another category, same class): a hit, no driver call.
  const uint64_t driver_calls = mock.driver_allocation_count();
  auto w = memory->allocate(MemoryCategory::staging, 1_MiB);
  REQUIRE(w);
  CHECK(*w == y);
  CHECK(mock.driver_allocation_count() == driver_calls);
  CHECK(memory->stats().cache_hits == 2);
  CHECK(charged(*memory, MemoryCategory::staging) == 1_MiB + 64_KiB);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == 0);
  check_ledger(*memory, mock, 2);

  // And the other way round: A frees its own block and the main thread's.
  auto freed_on_a = a.run([&] { return std::make_pair(memory->free(z), memory->free(*w)); });
  REQUIRE(freed_on_a.first);
  REQUIRE(freed_on_a.second);
  CHECK(charged(*memory, MemoryCategory::staging) == 0);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == 1_MiB + 64_KiB);
  CHECK(memory->stats().frees == 4);
  check_ledger(*memory, mock, 0);
  auto w_again_here = memory->free(*w);
  auto w_again_on_a = a.run([&] { return memory->free(*w); });
  REQUIRE_FALSE(w_again_here);
  REQUIRE_FALSE(w_again_on_a);
  CHECK(w_again_here.error().result == RhiResult::invalid_usage);
  CHECK(w_again_on_a.error().result == RhiResult::invalid_usage);
  CHECK(memory->stats().frees == 4);
  CHECK(memory->stats().cached_blocks == 2);

  // A's next 1 MiB request is served by the block it freed for the main thread.
  auto v = a.run([&] { return memory->allocate(MemoryCategory::ndarray, 1_MiB); });
  REQUIRE(v);
  CHECK(*v == y);
  CHECK(mock.driver_allocation_count() == driver_calls);
  CHECK(memory->stats().cache_hits == 3);
  REQUIRE(memory->free(*v));
  check_ledger(*memory, mock, 0);
  CHECK(memory->in_use_bytes() == charged(*memory, MemoryCategory::pool_cache));

  CHECK(memory->release_cached() == 1_MiB + 64_KiB);
  CHECK(mock.held_bytes() == 0);
  CHECK(mock.live_allocation_count() == 0);
  CHECK(memory->in_use_bytes() == 0);
}

TEST_CASE_METHOD(CachedMemoryOnMock<100_MiB>,
                 "a second free on the owning thread is refused even when its cache could take it lock-free",
                 "[thread_cache]") {
  auto a = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  auto big = memory->allocate(MemoryCategory::ndarray, 2_MiB);
  REQUIRE(a);
  REQUIRE(big);
  REQUIRE(memory->free(*big));
  auto big_again = memory->allocate(MemoryCategory::ndarray, 2_MiB);  // a hit: its cache now has
  REQUIRE(big_again);                                                 // room to free 2 MiB lock-free
  REQUIRE(*big_again == *big);
  REQUIRE(memory->free(*a));  // cached, with room left for another 1 MiB
  const auto ledger = memory->in_use_by_category();
  const MemoryStats before = memory->stats();
  REQUIRE(before.cached_blocks == 1);

  auto again = memory->free(*a);
  REQUIRE_FALSE(again);
  CHECK(again.error().result == RhiResult::invalid_usage);
  CHECK(memory->in_use_by_category() == ledger);
  CHECK(memory->stats().cached_blocks == 1);  // not kept twice
  CHECK(memory->stats().frees == before.frees);

  // The block is handed out once, not twice.
  auto x = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  auto y = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  REQUIRE(x);
  REQUIRE(y);
  CHECK(*x != *y);
  CHECK(memory->stats().cache_hits == before.cache_hits + 1);
  REQUIRE(memory->free(*x));
  REQUIRE(memory->free(*y));
  REQUIRE(memory->free(*big_again));
  check_ledger(*memory, mock, 0);
}

TEST_CASE_METHOD(CachedMemoryOnMock<256_MiB>,
                 "a thread cache keeps its bins' depth, the rest and large classes go to the shared pool",
                 "[thread_cache][concurrency]") {
  Worker a;
  // 6 x 1 MiB (bin depth 4), 8 x 64 KiB (depth 7), 6 MiB (above 4 MiB: no thread-cache bin).
  std::vector<Ask> asks;
  for (int i = 0; i < 6; ++i) asks.push_back({MemoryCategory::ndarray, 1_MiB});
  for (int i = 0; i < 8; ++i) asks.push_back({MemoryCategory::staging, 64_KiB});
  asks.push_back({MemoryCategory::ndarray, 6_MiB});
  REQUIRE(a.run([&] { return fill_and_free(*memory, asks, 1); }) == 0);
  CHECK(memory->stats().cached_blocks == 15);
  CHECK(memory->stats().cached_bytes == 12_MiB + 512_KiB);
  check_ledger(*memory, mock, 0);

  // The main thread hits only what overflowed into the shared pool: A's own cache is private.
  const uint64_t driver_calls = mock.driver_allocation_count();
  std::vector<DeviceAllocation> held;
  auto take = [&](MemoryCategory category, uint64_t size_bytes) {
    auto x = memory->allocate(category, size_bytes);
    REQUIRE(x);
    held.push_back(*x);
  };
  take(MemoryCategory::ndarray, 1_MiB);
  take(MemoryCategory::ndarray, 1_MiB);
  take(MemoryCategory::ndarray, 64_KiB);
  take(MemoryCategory::result_buffer, 6_MiB);
  CHECK(memory->stats().cache_hits == 4);
  CHECK(mock.driver_allocation_count() == driver_calls);
  take(MemoryCategory::ndarray, 1_MiB);   // A's four 1 MiB blocks stay A's
  take(MemoryCategory::ndarray, 64_KiB);  // and its seven 64 KiB blocks
  CHECK(memory->stats().cache_hits == 4);
  CHECK(mock.driver_allocation_count() == driver_calls + 2);
  CHECK(memory->stats().cached_blocks == 11);
  check_ledger(*memory, mock, held.size());

  // Once A exits they are the shared pool's: every one is a hit.
  a.stop();
  CHECK(memory->stats().cached_blocks == 11);
  for (int i = 0; i < 4; ++i) take(MemoryCategory::ndarray, 1_MiB);
  for (int i = 0; i < 7; ++i) take(MemoryCategory::staging, 64_KiB);
  CHECK(memory->stats().cache_hits == 15);
  CHECK(mock.driver_allocation_count() == driver_calls + 2);
  CHECK(memory->stats().cached_blocks == 0);
  check_ledger(*memory, mock, held.size());
  for (const DeviceAllocation &x : held) REQUIRE(memory->free(x));
  memory->release_cached();
  CHECK(mock.held_bytes() == 0);
  CHECK(memory->in_use_bytes() == 0);
}

TEST_CASE_METHOD(CachedMemoryOnMock<512_MiB>,
                 "two threads freeing the same block at the same moment: exactly one free succeeds",
                 "[thread_cache][concurrency]") {
  // The owner's free is lock-free; the other thread's takes the locked path, which must stop the
  // owner's fast path before it decides. Without that, both succeed and the block is cached twice.
  Worker owner;
  REQUIRE(owner.run([&] { return fill_and_free(*memory, std::array<Ask, 1>{{{MemoryCategory::ndarray, 4_KiB}}}, 2); }) == 0);
  constexpr int kRounds = 2000;
  int both = 0, neither = 0;
  for (int round = 0; round < kRounds; ++round) {
    const auto block = owner.run([&] { return memory->allocate(MemoryCategory::ndarray, 4_KiB); });
    REQUIRE(block);
    std::atomic<bool> go{false};
    auto owner_free = owner.post([&] {
      while (!go.load(std::memory_order_acquire)) {
      }
      return memory->free(*block).has_value();
    });
    go.store(true, std::memory_order_release);
    const bool main_freed = memory->free(*block).has_value();
    const bool owner_freed = owner_free.get();
    both += main_freed && owner_freed;
    neither += !main_freed && !owner_freed;
  }
  CHECK(both == 0);
  CHECK(neither == 0);
  check_ledger(*memory, mock, 0);
  const MemoryStats s = memory->stats();
  CHECK(s.cached_blocks == mock.live_allocation_count());
  CHECK(s.frees == s.allocations);
}
