// DeviceMemory's per-thread caches when their thread exits: the cached blocks go to the shared pool,
// live blocks are freed by another thread with an exact ledger, and threads that come and go take
// over retired caches with nothing counted twice.
#include <catch2/catch.hpp>

#include <array>
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
                 "when a thread exits its cached blocks go to the shared pool: hits for others, released",
                 "[thread_cache][concurrency]") {
  std::vector<Ask> asks;
  for (int i = 0; i < 4; ++i) asks.push_back({MemoryCategory::ndarray, 1_MiB});
  asks.push_back({MemoryCategory::staging, 64_KiB});
  asks.push_back({MemoryCategory::staging, 64_KiB});
  constexpr uint64_t kCached = 4_MiB + 128_KiB;

  Worker t;
  std::vector<uint64_t> ids;
  REQUIRE(t.run([&] { return fill_and_free(*memory, asks, 3, &ids); }) == 0);  // 6 misses, 12 hits
  REQUIRE(ids.size() == 6);
  const MemoryStats before = memory->stats();
  const auto ledger_before = memory->in_use_by_category();
  const uint64_t requests_before = memory->fault_plan().allocation_count();
  CHECK(before.allocations == 18);
  CHECK(before.frees == 18);
  CHECK(before.cache_hits == 12);
  CHECK(before.cached_blocks == 6);
  CHECK(before.cached_bytes == kCached);
  CHECK(requests_before == 18);
  CHECK(ledger_before[kPool] == kCached);
  check_ledger(*memory, mock, 0);

  t.stop();  // joined: the thread's cache has been handed back

  const MemoryStats after = memory->stats();
  CHECK(after.cached_blocks == before.cached_blocks);
  CHECK(after.cached_bytes == before.cached_bytes);
  CHECK(after.allocations == before.allocations);
  CHECK(after.frees == before.frees);
  CHECK(after.cache_hits == before.cache_hits);
  CHECK(after.evictions == 0);
  CHECK(memory->in_use_by_category() == ledger_before);
  CHECK(memory->fault_plan().allocation_count() == requests_before);
  CHECK(mock.held_bytes() == kCached);
  check_ledger(*memory, mock, 0);

  // The main thread allocates the same classes (other categories): all hits, no driver call.
  const uint64_t driver_calls = mock.driver_allocation_count();
  std::vector<DeviceAllocation> held;
  for (int i = 0; i < 4; ++i) {
    auto x = memory->allocate(MemoryCategory::staging, 1_MiB);
    REQUIRE(x);
    CHECK(contains(ids, x->alloc_id));
    held.push_back(*x);
  }
  for (int i = 0; i < 2; ++i) {
    auto x = memory->allocate(MemoryCategory::result_buffer, 64_KiB);
    REQUIRE(x);
    CHECK(contains(ids, x->alloc_id));
    held.push_back(*x);
  }
  CHECK(memory->stats().cache_hits == before.cache_hits + 6);
  CHECK(mock.driver_allocation_count() == driver_calls);
  CHECK(memory->stats().cached_blocks == 0);
  CHECK(charged(*memory, MemoryCategory::staging) == 4_MiB);
  CHECK(charged(*memory, MemoryCategory::result_buffer) == 128_KiB);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == 0);
  auto miss = memory->allocate(MemoryCategory::ndarray, 1_MiB);  // the pool is empty now
  REQUIRE(miss);
  held.push_back(*miss);
  CHECK(mock.driver_allocation_count() == driver_calls + 1);
  check_ledger(*memory, mock, held.size());

  for (const DeviceAllocation &x : held) REQUIRE(memory->free(x));
  CHECK(memory->stats().cached_bytes == kCached + 1_MiB);
  check_ledger(*memory, mock, 0);
  CHECK(memory->release_cached() == kCached + 1_MiB);
  CHECK(mock.held_bytes() == 0);
  CHECK(mock.live_allocation_count() == 0);
  CHECK(memory->in_use_bytes() == 0);
  CHECK(memory->stats().cached_bytes == 0);
  CHECK(memory->stats().evictions == 7);
  for (std::size_t k = 0; k < kiln::kNumMemoryCategories; ++k) CHECK(memory->in_use_by_category()[k] == 0);
}

TEST_CASE_METHOD(CachedMemoryOnMock<100_MiB>,
                 "a thread that exits holding live blocks: another thread frees them, the ledger is exact",
                 "[thread_cache][concurrency]") {
  Worker t;
  struct Left {
    RhiExpected<DeviceAllocation> hit, grown;
    int failures = 0;
  };
  // The thread leaves a block it got from its own cache (lock-free), one it grew, and a cached one.
  Left left = t.run([&] {
    Left l;
    auto first = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    if (!first || !memory->free(*first)) ++l.failures;
    l.hit = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    l.grown = memory->allocate(MemoryCategory::staging, 2_MiB);
    auto spare = memory->allocate(MemoryCategory::argument_buffer, 64_KiB);
    if (!spare || !memory->free(*spare)) ++l.failures;
    return l;
  });
  REQUIRE(left.failures == 0);
  REQUIRE(left.hit);
  REQUIRE(left.grown);
  CHECK(memory->stats().cache_hits == 1);
  const auto ledger_before = memory->in_use_by_category();
  CHECK(ledger_before[idx(MemoryCategory::ndarray)] == 1_MiB);
  CHECK(ledger_before[idx(MemoryCategory::staging)] == 2_MiB);
  CHECK(ledger_before[kPool] == 64_KiB);
  check_ledger(*memory, mock, 2);

  t.stop();
  CHECK(memory->in_use_by_category() == ledger_before);
  check_ledger(*memory, mock, 2);

  REQUIRE(memory->free(*left.hit));
  REQUIRE(memory->free(*left.grown));
  CHECK(charged(*memory, MemoryCategory::ndarray) == 0);
  CHECK(charged(*memory, MemoryCategory::staging) == 0);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == 3_MiB + 64_KiB);
  check_ledger(*memory, mock, 0);
  auto again = memory->free(*left.hit);
  REQUIRE_FALSE(again);
  CHECK(again.error().result == RhiResult::invalid_usage);

  // Both are reusable from the main thread.
  const uint64_t driver_calls = mock.driver_allocation_count();
  auto x = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  auto y = memory->allocate(MemoryCategory::ndarray, 2_MiB);
  REQUIRE(x);
  REQUIRE(y);
  CHECK(*x == *left.hit);
  CHECK(*y == *left.grown);
  CHECK(mock.driver_allocation_count() == driver_calls);
  REQUIRE(memory->free(*x));
  REQUIRE(memory->free(*y));
  check_ledger(*memory, mock, 0);
  CHECK(memory->release_cached() == 3_MiB + 64_KiB);
  CHECK(mock.held_bytes() == 0);
  CHECK(memory->in_use_bytes() == 0);
}

// A thread's cache outlives the thread: it is emptied, its ledger share and counts are folded
// into the allocator's, and the next new thread takes it. Nothing may be counted twice.
TEST_CASE_METHOD(CachedMemoryOnMock<100_MiB>,
                 "threads that come and go take over retired caches with nothing counted twice",
                 "[thread_cache][concurrency]") {
  const std::array<Ask, 3> asks{{{MemoryCategory::ndarray, 4_KiB},
                                 {MemoryCategory::staging, 4_KiB},
                                 {MemoryCategory::ndarray, 4_KiB}}};
  constexpr int kThreads = 20;
  for (int t = 0; t < kThreads; ++t) {
    // Round 1 grows (first thread) or takes the shared pool's blocks; round 2 hits lock-free.
    Worker w;
    REQUIRE(w.run([&] { return fill_and_free(*memory, asks, 2); }) == 0);
    w.stop();
    const MemoryStats s = memory->stats();
    CAPTURE(t);
    const uint64_t done = static_cast<uint64_t>(t + 1);
    CHECK(s.allocations == done * 2 * asks.size());
    CHECK(s.frees == done * 2 * asks.size());
    CHECK(s.cache_hits == done * 2 * asks.size() - asks.size());
    CHECK(s.lock_free_hits == done * asks.size());
    CHECK(s.cached_blocks == asks.size());
    CHECK(mock.driver_allocation_count() == asks.size());
    check_ledger(*memory, mock, 0);
  }
  const MemoryStats s = memory->stats();
  CHECK(s.ledger.peak_bytes[idx(MemoryCategory::ndarray)] == 8_KiB);
  CHECK(s.ledger.peak_bytes[idx(MemoryCategory::staging)] == 4_KiB);
  CHECK(s.ledger.peak_total_bytes == 12_KiB);
}
