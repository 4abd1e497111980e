// The caching pool's size classes and what DeviceMemory promises about them: large blocks are
// rounded at a fine granularity (waste at most max(2 MiB, 1/64 of the block)), a request that
// fits unrounded is never refused because of rounding (budget limit, live free memory, driver;
// single and group allocations), and a refusal's figures agree with the decision.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using kiln::BudgetCheck;
using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

namespace {

// What the runtime holds before the user's first array in the example: a 16 MiB heap
// and its state, so that a 64 MiB budget has 47.97 MiB left.
constexpr uint64_t kHeldBefore = 16_MiB + 32_KiB;
// A request that fits in 47.97 MiB whose size class (48 MiB) does not.
constexpr uint64_t kFitsUnrounded = 47_MiB + 4_KiB;

// Holds kHeldBefore in runtime_heap, as the executor does: a 16 MiB heap and 32 KiB of state
// (both their own size classes).
struct Heap {
  DeviceMemory &memory;
  DeviceAllocation chunk, state;
  explicit Heap(DeviceMemory &m) : memory(m) {
    auto c = memory.allocate(MemoryCategory::runtime_heap, 16_MiB);
    auto s = memory.allocate(MemoryCategory::runtime_heap, 32_KiB);
    REQUIRE(c);
    REQUIRE(s);
    chunk = *c;
    state = *s;
    REQUIRE(memory.in_use_bytes() == kHeldBefore);
  }
  ~Heap() {
    CHECK(memory.free(chunk));
    CHECK(memory.free(state));
  }
};

// The room a limit refusal reports: the limit minus what kiln holds in its picture.
uint64_t limit_room(const Failure &f) {
  const uint64_t used = f.memory.in_use_total_bytes();
  return f.memory.limit_bytes > used ? f.memory.limit_bytes - used : 0;
}

// The room a live refusal reports: free minus the reserve.
uint64_t live_room(const Failure &f) {
  return f.memory.free_bytes > f.memory.reserve_bytes ? f.memory.free_bytes - f.memory.reserve_bytes
                                                      : 0;
}

}  // namespace

TEST_CASE("size_class: a block over 1 MiB wastes at most max(2 MiB, 1/64 of it)",
          "[caching_pool][rounding]") {
  REQUIRE(CachingPool::size_class(kFitsUnrounded) == 48_MiB);
  CHECK(CachingPool::size_class(45_MiB) == 46_MiB);  // the 45 MiB: 48 MiB before
  CHECK(CachingPool::size_class(8_GiB) == 8_GiB);
  CHECK(CachingPool::size_class(8_GiB + 1) == 8_GiB + 128_MiB);  // 10 GiB before
  // Up to 4 MiB the thread caches' quarter steps stay: the fast path's bins are unchanged.
  CHECK(CachingPool::size_class(3_MiB + 1) == 3_MiB + 512_KiB);
  CHECK(CachingPool::size_class(4_MiB) == 4_MiB);
  CHECK(CachingPool::size_class(4_MiB + 1) == 5_MiB);

  std::mt19937_64 rng(23);
  std::vector<uint64_t> sizes;
  for (int i = 0; i < 200000; ++i) sizes.push_back((rng() >> (rng() % 43)) + 1_MiB + 1);
  for (uint64_t s = 1_MiB + 1; s < 300_MiB; s += 1_MiB - 1) sizes.push_back(s);
  for (const uint64_t s : sizes) {
    const uint64_t c = CachingPool::size_class(s);
    if (c == 0) continue;  // rounding would overflow: the pool allocates the exact size
    if (c < s || c - s > std::max<uint64_t>(2_MiB, c / 64) || CachingPool::size_class(c) != c) {
      CAPTURE(s, c);
      FAIL("below the request, more waste than max(2 MiB, 1/64), or not its own class");
    }
  }
}

TEST_CASE("a request that fits unrounded is not refused by the budget because of rounding",
          "[caching_pool][rounding]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(64_MiB));
  const Heap heap(*memory);
  const uint64_t calls = mock.driver_allocation_count();

  auto a = memory->allocate(MemoryCategory::ndarray, kFitsUnrounded);
  REQUIRE(a);
  CHECK(charged(*memory, MemoryCategory::ndarray) == kFitsUnrounded);  // charged what it holds
  CHECK(mock.held_bytes() == kHeldBefore + kFitsUnrounded);
  // Freed, it is cached at its own size and serves the same request again without the driver.
  REQUIRE(memory->free(*a));
  const uint64_t hits = memory->stats().cache_hits;
  auto again = memory->allocate(MemoryCategory::ndarray, kFitsUnrounded);
  REQUIRE(again);
  CHECK(memory->stats().cache_hits == hits + 1);
  CHECK(mock.driver_allocation_count() == calls + 1);
  REQUIRE(memory->free(*again));
}

TEST_CASE("a request that fits unrounded is not refused by live free memory because of rounding",
          "[caching_pool][rounding][live]") {
  // 64 MiB device, 16 MiB + 32 KiB held by another process, no reserve: 47.97 MiB free.
  MockDevice mock(mock_options(64_MiB, {kHeldBefore}));
  auto memory = make_memory(mock, cached(1_GiB));
  auto a = memory->allocate(MemoryCategory::ndarray, kFitsUnrounded);
  REQUIRE(a);
  CHECK(mock.driver_oom_count() == 0);
  CHECK(memory->stats().live_refusals == 0);
  REQUIRE(memory->free(*a));
}

TEST_CASE("a request that fits unrounded is not refused by the driver because of rounding",
          "[caching_pool][rounding]") {
  MockDevice mock(mock_options(47_MiB + 512_KiB));
  auto memory = make_memory(mock, cached(1_GiB, 0, /*live_check=*/false));
  auto a = memory->allocate(MemoryCategory::ndarray, kFitsUnrounded);
  REQUIRE(a);
  CHECK(mock.driver_oom_count() >= 1);  // the 48 MiB class was refused first
  CHECK(mock.held_bytes() == kFitsUnrounded);
  CHECK(charged(*memory, MemoryCategory::ndarray) == kFitsUnrounded);
  REQUIRE(memory->free(*a));
}

TEST_CASE("a group whose sizes fit unrounded is not refused because of rounding",
          "[caching_pool][rounding]") {
  constexpr uint64_t kHalf = 23_MiB + 512_KiB + 4_KiB;  // class 24 MiB
  REQUIRE(CachingPool::size_class(kHalf) == 24_MiB);
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(47_MiB + 512_KiB));
  const AllocRequest requests[] = {{MemoryCategory::ndarray, kHalf}, {MemoryCategory::staging, kHalf}};
  auto group = memory->allocate_group(requests);
  REQUIRE(group);
  CHECK(memory->in_use_bytes() == 2 * kHalf);
  for (DeviceAllocation a : *group) REQUIRE(memory->free(a));
}

TEST_CASE("every refusal's figures agree with the decision: requested and class exceed the room",
          "[caching_pool][rounding]") {
  const bool live = GENERATE(false, true);
  CAPTURE(live);
  // By the limit: 64 MiB budget, 16 MiB + 32 KiB held. By live free memory: a 64 MiB device of
  // which another process holds 16 MiB + 32 KiB, the limit far away.
  MockDevice mock(live ? mock_options(64_MiB, {kHeldBefore}) : mock_options(1_GiB));
  auto memory = make_memory(mock, live ? cached(1_GiB) : cached(64_MiB));
  std::optional<Heap> heap;
  if (!live) heap.emplace(*memory);
  int refusals = 0;
  for (uint64_t size = 40_MiB + 1; size < 56_MiB; size += 64_KiB + 7) {
    CAPTURE(size);
    auto a = memory->allocate(MemoryCategory::ndarray, size);
    if (a) {
      REQUIRE(memory->free(*a));
      (void)memory->release_cached();  // the heap's blocks stay held
      continue;
    }
    ++refusals;
    const Failure &f = a.error();
    REQUIRE(f.result == RhiResult::out_of_memory);
    REQUIRE(f.oom_source == OomSource::budget);
    CHECK(f.budget_check == (live ? BudgetCheck::live_free : BudgetCheck::limit));
    CHECK(f.requested_bytes == size);
    const uint64_t room = live ? live_room(f) : limit_room(f);
    CHECK(f.requested_bytes > room);
    const uint64_t klass = CachingPool::size_class(size);
    CHECK(f.class_bytes == (klass > size ? klass : 0));
    if (f.class_bytes != 0) {
      CHECK(f.class_bytes > room);
      CHECK(f.message().find("pool size class, " + kiln::format_bytes(klass)) != std::string::npos);
    }
  }
  CHECK(refusals > 0);
}

TEST_CASE("on a 9.6 GiB device an 8 GiB array is held and charged as 8 GiB",
          "[caching_pool][rounding]") {
  if (kSanitized) return;  // 8 GiB of mock memory: too much for the sanitizers' shadow
  MockDevice mock(mock_options(9_GiB + 614_MiB));  // "9.60 GiB"; the default reserve, live on
  auto memory = make_memory(mock, kiln::runtime::BudgetConfig{});
  for (const uint64_t size : {8_GiB, 8_GiB + 1}) {
    CAPTURE(size);
    auto a = memory->allocate(MemoryCategory::ndarray, size);
    REQUIRE(a);
    CHECK(charged(*memory, MemoryCategory::ndarray) <= size + 128_MiB);
    REQUIRE(memory->free(*a));
    (void)memory->release_cached();
  }
}

TEST_CASE("a group's refusal reports the whole group, its blocks reused from the cache included",
          "[caching_pool][rounding][group]") {
  const bool live = GENERATE(false, true);
  CAPTURE(live);
  // By the limit: a 1 MiB budget. By live free memory: a 1 MiB device, the limit far away.
  MockDevice mock(mock_options(live ? 1_MiB : 1_GiB));
  auto memory = make_memory(mock, cached(live ? 1_GiB : 1_MiB, 0));
  auto reused = memory->allocate(MemoryCategory::ndarray, 600_KiB);
  REQUIRE(reused);
  REQUIRE(memory->free(*reused));  // now 600 KiB of cache, evictable, which the group reuses
  const AllocRequest requests[] = {{MemoryCategory::ndarray, 600_KiB},
                                   {MemoryCategory::staging, 500_KiB}};
  auto group = memory->allocate_group(requests);
  REQUIRE_FALSE(group);
  const Failure &f = group.error();
  INFO(f.message());
  REQUIRE(f.result == RhiResult::out_of_memory);
  CHECK(f.budget_check == (live ? BudgetCheck::live_free : BudgetCheck::limit));
  // The room a reader sees counts the cache as evictable; only the whole group exceeds it.
  const uint64_t cache = f.memory.in_use_bytes[static_cast<size_t>(MemoryCategory::pool_cache)];
  CHECK(cache >= 600_KiB);
  CHECK(f.requested_bytes == 1100_KiB);
  CHECK(f.requested_bytes > (live ? live_room(f) : limit_room(f)) + cache);
  CHECK(f.message().find("2 buffers granted together, 1 of them, 600.00 KiB, reusable") !=
        std::string::npos);
  // Nothing was lost: the cached block is still there and serves a request alone.
  CHECK(charged(*memory, MemoryCategory::ndarray) == 0);
  CHECK(charged(*memory, MemoryCategory::staging) == 0);
  auto again = memory->allocate(MemoryCategory::ndarray, 600_KiB);
  REQUIRE(again);
  REQUIRE(memory->free(*again));
}
