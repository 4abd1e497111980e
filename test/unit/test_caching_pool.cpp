// DeviceMemory with its caching pool on (the default): a freed block kept for reuse and charged as
// pool_cache, a reuse that asks neither the driver nor the live free memory, zero-fill on a hit, and
// the limit under 8 threads. A second free refused: test_device_memory_contract.cpp; size classes:
// test_size_classes.cpp; cached bytes evicted before a refusal: test_eviction.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <latch>
#include <random>
#include <thread>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"
#include "seeded_threads.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

TEST_CASE("free keeps the block in the pool, charged as pool_cache, still held by the driver",
          "[caching_pool]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  constexpr uint64_t kSize = 1_MiB + 1;  // class 1.25 MiB: the ledger charges the class
  const uint64_t klass = CachingPool::size_class(kSize);
  REQUIRE(klass == 1_MiB + 256_KiB);

  auto a = memory->allocate(MemoryCategory::ndarray, kSize);
  REQUIRE(a);
  CHECK(charged(*memory, MemoryCategory::ndarray) == klass);
  CHECK(mock.held_bytes() == klass);
  CHECK(memory->in_use_bytes() == mock.held_bytes());

  REQUIRE(memory->free(*a));
  CHECK(charged(*memory, MemoryCategory::ndarray) == 0);
  CHECK(cached_bytes(*memory) == klass);
  CHECK(memory->in_use_bytes() == klass);
  CHECK(mock.held_bytes() == klass);  // nothing went back to the driver
  CHECK(mock.live_allocation_count() == 1);
  CHECK(memory->stats().cached_bytes == klass);
  CHECK(memory->stats().cached_blocks == 1);
  CHECK(memory->stats().frees == 1);

  SECTION("release_cached gives it back to the driver") {
    CHECK(memory->release_cached() == klass);
    CHECK(cached_bytes(*memory) == 0);
    CHECK(memory->in_use_bytes() == 0);
    CHECK(mock.held_bytes() == 0);
    CHECK(mock.live_allocation_count() == 0);
    CHECK(memory->stats().evictions == 1);
  }
}

TEST_CASE("an allocation of a cached class is a hit: no driver call and no live check",
          "[caching_pool]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  auto a = memory->allocate(MemoryCategory::ndarray, 1_MiB + 1);
  REQUIRE(a);
  REQUIRE(memory->free(*a));
  const uint64_t klass = CachingPool::size_class(1_MiB + 1);
  const uint64_t driver_calls = mock.driver_allocation_count();
  const uint64_t info_calls = mock.memory_info_count();
  const uint64_t live_checks = memory->stats().live_checks;
  REQUIRE(live_checks == 1);

  // Another size in the same class, another category: the same block serves it.
  auto b = memory->allocate(MemoryCategory::staging, 1_MiB + 200_KiB);
  REQUIRE(b);
  CHECK(*b == *a);
  CHECK(mock.driver_allocation_count() == driver_calls);
  CHECK(mock.memory_info_count() == info_calls);
  CHECK(memory->stats().live_checks == live_checks);
  CHECK(memory->stats().cache_hits == 1);
  CHECK(memory->stats().allocations == 2);
  CHECK(charged(*memory, MemoryCategory::staging) == klass);
  CHECK(cached_bytes(*memory) == 0);
  CHECK(memory->stats().cached_blocks == 0);
  CHECK(mock.held_bytes() == klass);

  SECTION("a size of another class is not a hit") {
    auto c = memory->allocate(MemoryCategory::ndarray, 2_MiB);
    REQUIRE(c);
    CHECK(mock.driver_allocation_count() == driver_calls + 1);
    CHECK(memory->stats().cache_hits == 1);
    REQUIRE(memory->free(*c));
  }
  REQUIRE(memory->free(*b));
}

TEST_CASE("zero_fill on a cache hit hands out zeros", "[caching_pool]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  constexpr uint64_t kSize = 64_KiB;
  auto a = memory->allocate(MemoryCategory::ndarray, kSize);
  REQUIRE(a);
  const std::vector<unsigned char> pattern(kSize, 0xAB);
  REQUIRE(mock.memcpy_host_to_device(*a, 0, pattern.data(), kSize));
  REQUIRE(memory->free(*a));

  auto b = memory->allocate(MemoryCategory::ndarray, kSize, /*zero_fill=*/true);
  REQUIRE(b);
  REQUIRE(*b == *a);  // the same block, which held 0xAB
  CHECK(memory->stats().cache_hits == 1);
  std::vector<unsigned char> back(kSize, 0xFF);
  REQUIRE(mock.memcpy_device_to_host(back.data(), *b, 0, kSize));
  CHECK(std::all_of(back.begin(), back.end(), [](unsigned char v) { return v == 0; }));
  REQUIRE(memory->free(*b));
}

// A race shows in some runs only, so the test runs several rounds, each with a fresh device.
// (Before 8befd36 a free released the ledger before the device let go; about half the rounds
// then saw the device hold more than the limit.)
TEST_CASE("8 threads allocating and freeing never make the device hold more than the limit",
          "[caching_pool][concurrency]") {
  constexpr uint64_t kLimit = 4_MiB;
  constexpr int kRounds = 5;
  constexpr int kThreads = 8;
  constexpr int kIterations = 2000;
  constexpr std::size_t kMaxHeldPerThread = 24;  // three threads together exceed the limit
  uint64_t refused_in_all_rounds = 0;
  for (int round = 0; round < kRounds; ++round) {
    CAPTURE(round);
    MockDevice mock(mock_options(64_MiB));
    auto memory = make_memory(mock, cached(kLimit, /*reserve_bytes=*/1_MiB));

    std::atomic<uint64_t> granted{0}, refused{0}, wrong_failures{0}, freed{0}, bad_frees{0};
    auto worker = [&](std::mt19937 &rng) {
      std::uniform_int_distribution<uint64_t> size(1_KiB, 256_KiB);
      std::vector<DeviceAllocation> held;
      for (int i = 0; i < kIterations; ++i) {
        if (held.size() < kMaxHeldPerThread && (held.empty() || rng() % 3 != 0)) {
          const auto category = static_cast<MemoryCategory>(rng() % 4);
          auto a = memory->allocate(category, size(rng), /*zero_fill=*/rng() % 8 == 0);
          tally(a, held, granted, refused, wrong_failures);
        } else {
          const std::size_t k = rng() % held.size();
          if (!memory->free(held[k])) bad_frees.fetch_add(1);
          freed.fetch_add(1);
          held[k] = held.back();
          held.pop_back();
        }
      }
      for (DeviceAllocation a : held) {
        if (!memory->free(a)) bad_frees.fetch_add(1);
        freed.fetch_add(1);
      }
    };
    kiln::test::run_seeded_threads(kThreads, 1234u + 100u * round, worker);

    CHECK(wrong_failures.load() == 0);
    CHECK(bad_frees.load() == 0);
    CHECK(granted.load() > 0);
    CHECK(mock.high_water_bytes() <= kLimit);
    CHECK(memory->stats().ledger.peak_total_bytes <= kLimit);
    CHECK(memory->in_use_bytes() == mock.held_bytes());
    CHECK(memory->in_use_bytes() == cached_bytes(*memory));  // all freed: all cached
    CHECK(memory->stats().allocations == granted.load());
    CHECK(memory->stats().frees == freed.load());
    memory->release_cached();
    CHECK(mock.held_bytes() == 0);
    CHECK(mock.live_allocation_count() == 0);
    CHECK(memory->in_use_bytes() == 0);
    refused_in_all_rounds += refused.load();
  }
  CHECK(refused_in_all_rounds > 0);  // the limit was reached: the refusal path ran concurrently
}
