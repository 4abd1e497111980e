// Cached bytes never cause a refusal on their own: the budget, the live check and the driver each
// make DeviceMemory's caching pool give its blocks back first (the thread caches' eviction:
// test_thread_cache_eviction.cpp).
#include <catch2/catch.hpp>

#include <cstdint>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

TEST_CASE("cached bytes never cause a budget refusal: the cache is evicted first",
          "[caching_pool]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(8_MiB));
  warm_pool(*memory, 2_MiB, 4);
  REQUIRE(cached_bytes(*memory) == 8_MiB);
  REQUIRE(memory->in_use_bytes() == memory->limit_bytes());

  // 4 MiB is another class: it fits only once the cache is gone.
  auto a = memory->allocate(MemoryCategory::ndarray, 4_MiB);
  REQUIRE(a);
  CHECK(memory->stats().evictions == 4);
  CHECK(memory->stats().retries == 1);
  CHECK(memory->stats().cache_hits == 0);
  CHECK(cached_bytes(*memory) == 0);
  CHECK(charged(*memory, MemoryCategory::ndarray) == 4_MiB);
  CHECK(mock.held_bytes() == 4_MiB);
  CHECK(mock.live_allocation_count() == 1);
  CHECK(memory->in_use_bytes() == mock.held_bytes());
  REQUIRE(memory->free(*a));
}

TEST_CASE("cached bytes never cause a live-check refusal: the cache is evicted first",
          "[caching_pool][live]") {
  // 64 MiB device, 8 MiB reserve, a limit that never binds: only the live check can refuse.
  MockDevice mock(mock_options(64_MiB));
  auto memory = make_memory(mock, cached(1_GiB, /*reserve_bytes=*/8_MiB));
  warm_pool(*memory, 8_MiB, 6);  // 48 MiB held, 16 MiB free, 8 MiB usable
  REQUIRE(mock.held_bytes() == 48_MiB);
  const uint64_t live_checks = memory->stats().live_checks;

  auto a = memory->allocate(MemoryCategory::ndarray, 16_MiB);
  REQUIRE(a);
  CHECK(memory->stats().live_checks == live_checks + 2);  // refused, evicted, asked again
  CHECK(memory->stats().live_refusals == 0);
  CHECK(memory->stats().evictions == 6);
  CHECK(memory->stats().retries == 1);
  CHECK(cached_bytes(*memory) == 0);
  CHECK(mock.held_bytes() == 16_MiB);
  CHECK(mock.driver_oom_count() == 0);
  CHECK(memory->in_use_bytes() == mock.held_bytes());
  REQUIRE(memory->free(*a));
}

TEST_CASE("cached bytes never cause a driver refusal: driver OOM evicts the cache and retries once",
          "[caching_pool]") {
  // The driver's capacity is below the budget and the live check is off: only the driver refuses.
  MockDevice mock(mock_options(16_MiB));
  auto memory = make_memory(mock, cached(64_MiB, /*reserve_bytes=*/0, /*live_check=*/false));
  warm_pool(*memory, 4_MiB, 4);  // the device is full of cached blocks
  REQUIRE(mock.held_bytes() == 16_MiB);

  auto a = memory->allocate(MemoryCategory::ndarray, 8_MiB);
  REQUIRE(a);
  CHECK(mock.driver_oom_count() == 1);
  CHECK(memory->stats().driver_ooms == 1);
  CHECK(memory->stats().retries == 1);
  CHECK(memory->stats().evictions == 4);
  CHECK(memory->stats().live_checks == 0);
  CHECK(cached_bytes(*memory) == 0);
  CHECK(charged(*memory, MemoryCategory::ndarray) == 8_MiB);
  CHECK(mock.held_bytes() == 8_MiB);
  CHECK(memory->in_use_bytes() == mock.held_bytes());

  SECTION("when the retry is refused too, the driver's refusal is returned and nothing is held") {
    auto big = memory->allocate(MemoryCategory::staging, 12_MiB);
    REQUIRE_FALSE(big);
    CHECK(big.error().result == RhiResult::out_of_memory);
    CHECK(big.error().oom_source == OomSource::driver);
    CHECK(big.error().requested_bytes == 12_MiB);
    CHECK(charged(*memory, MemoryCategory::staging) == 0);
    CHECK(mock.held_bytes() == 8_MiB);
  }
  REQUIRE(memory->free(*a));
}
