// The request fault plan (DeviceMemory::fault_plan): the N-th request fails even when it would be a
// cache hit, the failure is annotated, seen by observers and counted once, and fail_at_count arms a
// count without resetting it.
#include <catch2/catch.hpp>

#include <cstdint>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

TEST_CASE("DeviceMemory::fault_plan fails the N-th request even when it would be a cache hit",
          "[caching_pool][fault]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  warm_pool(*memory, 2_MiB, 1);
  const uint64_t driver_calls = mock.driver_allocation_count();
  const auto ledger = memory->in_use_by_category();

  memory->fault_plan().fail_nth_allocation(2);
  auto first = memory->allocate(MemoryCategory::ndarray, 1_MiB);  // a miss, request 1
  REQUIRE(first);
  auto faulted = memory->allocate(MemoryCategory::ndarray, 2_MiB);  // would be a hit, request 2
  REQUIRE_FALSE(faulted);
  CHECK(faulted.error().result == RhiResult::out_of_memory);
  CHECK(faulted.error().oom_source == OomSource::driver);
  CHECK(faulted.error().requested_bytes == 2_MiB);
  CHECK(memory->fault_plan().allocation_count() == 2);
  CHECK(memory->stats().cached_blocks == 1);  // the block stayed in the pool
  CHECK(memory->stats().cache_hits == 0);
  CHECK(mock.driver_allocation_count() == driver_calls + 1);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == ledger[static_cast<std::size_t>(MemoryCategory::pool_cache)]);

  auto hit = memory->allocate(MemoryCategory::ndarray, 2_MiB);  // request 3: not faulted
  REQUIRE(hit);
  CHECK(memory->stats().cache_hits == 1);

  // The device's own fault plan counts only the calls that reach the driver: a hit is not one.
  REQUIRE(memory->free(*hit));
  mock.fault_plan().fail_nth_allocation(1);
  auto again = memory->allocate(MemoryCategory::ndarray, 2_MiB);
  REQUIRE(again);
  CHECK(mock.fault_plan().allocation_count() == 0);
  CHECK(memory->stats().cache_hits == 2);
  REQUIRE(memory->free(*again));
  REQUIRE(memory->free(*first));
}

TEST_CASE("an injected fault on a cache hit is annotated, seen by observers, and counted once",
          "[caching_pool][fault]") {
  MockDevice mock(mock_options(64_MiB));
  auto memory = make_memory(mock, cached(32_MiB));
  warm_pool(*memory, 1_MiB, 1);  // the next 1 MiB request would be a cache hit
  int observed = 0;
  OomSource seen = OomSource::none;
  (void)memory->add_oom_observer([&](const Failure &f) {
    ++observed;
    seen = f.oom_source;
  });
  memory->fault_plan().fail_nth_allocation(1);
  auto refused = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().result == RhiResult::out_of_memory);
  CHECK(refused.error().has_memory);
  CHECK(refused.error().memory.total_bytes == 64_MiB);
  CHECK(observed == 1);
  CHECK(seen == OomSource::driver);
  CHECK(memory->fault_plan().allocation_count() == 1);
  CHECK(memory->allocate(MemoryCategory::ndarray, 1_MiB));  // the next one is served
  CHECK(memory->fault_plan().allocation_count() == 2);
}

TEST_CASE("fail_at_count arms a count without resetting it, so nested plans count on",
          "[device_memory][fault]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(100_MiB));
  memory->fault_plan().fail_nth_allocation(3);  // the outer plan: its 3rd request fails
  auto first = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  REQUIRE(first);
  memory->fault_plan().fail_at_count(memory->fault_plan().allocation_count() + 1);  // inner: next
  auto second = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  REQUIRE_FALSE(second);
  CHECK(memory->fault_plan().allocation_count() == 2);  // not reset by the inner plan
  memory->fault_plan().fail_at_count(3);                // the outer plan again
  auto third = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  REQUIRE_FALSE(third);
  CHECK(memory->fault_plan().allocation_count() == 3);
  auto fourth = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  CHECK(fourth);
  memory->fault_plan().clear();
}
