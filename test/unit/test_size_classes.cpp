// The caching pool's size classes (runtime/memory/caching_pool.h) and the pool on its own: up to
// 512 B one class, above it at most 25 % slack, monotone, 0 where rounding would overflow, and a
// pool that gives back only a block of exactly the class asked for.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

TEST_CASE("size_class: up to 512 B is one class, above it at most 25 % slack", "[caching_pool]") {
  CHECK(CachingPool::size_class(1) == 512);
  CHECK(CachingPool::size_class(511) == 512);
  CHECK(CachingPool::size_class(512) == 512);
  CHECK(CachingPool::size_class(513) == 640);  // 512 + 512/4
  CHECK(CachingPool::size_class(1000) == 1024);
  CHECK(CachingPool::size_class(1025) == 1280);
  CHECK(CachingPool::size_class(3_MiB) == 3_MiB);
  CHECK(CachingPool::size_class(1_MiB + 1) == 1_MiB + 256_KiB);
  for (int shift = 9; shift < 64; ++shift) {
    CAPTURE(shift);
    const uint64_t power = uint64_t{1} << shift;
    CHECK(CachingPool::size_class(power) == power);  // a power of two is its own class
  }

  std::mt19937_64 rng(7);
  std::vector<uint64_t> sizes;
  for (uint64_t s = 1; s <= 70000; ++s) sizes.push_back(s);
  for (int i = 0; i < 20000; ++i) sizes.push_back(rng() >> (rng() % 62 + 2));
  for (const uint64_t s : sizes) {
    const uint64_t c = CachingPool::size_class(s);
    if (c < s || (s > 512 && (c - s) * 4 > s)) {
      CAPTURE(s, c);
      FAIL("class below the request or more than 25 % slack");
    }
  }
}

TEST_CASE("size_class is monotone and answers 0 when rounding would overflow", "[caching_pool]") {
  std::mt19937_64 rng(11);
  std::vector<uint64_t> sizes;
  for (uint64_t s = 1; s <= 70000; ++s) sizes.push_back(s);
  for (int i = 0; i < 20000; ++i) sizes.push_back(rng() >> (rng() % 62 + 2));
  std::sort(sizes.begin(), sizes.end());
  uint64_t previous = 0;
  for (const uint64_t s : sizes) {
    const uint64_t c = CachingPool::size_class(s);
    if (c < previous) {
      CAPTURE(s, c, previous);
      FAIL("size_class decreased");
    }
    previous = c;
  }

  constexpr uint64_t kMax = UINT64_MAX;
  constexpr uint64_t kTop = uint64_t{1} << 63;
  // Above 2^63 the step is 2^57 (1/64 of the size): the largest class is 2^64 - 2^57.
  // Anything above it overflows.
  constexpr uint64_t kLargestClass = kMax - (uint64_t{1} << 57) + 1;
  CHECK(CachingPool::size_class(kTop + 1) == kTop + (kTop >> 6));
  CHECK(CachingPool::size_class(kLargestClass) == kLargestClass);
  CHECK(CachingPool::size_class(kLargestClass - 1) == kLargestClass);
  CHECK(CachingPool::size_class(kLargestClass + 1) == 0);
  CHECK(CachingPool::size_class(kMax - 1) == 0);
  CHECK(CachingPool::size_class(kMax) == 0);
}

TEST_CASE("CachingPool gives back only a block of exactly the class asked for", "[caching_pool]") {
  CachingPool pool;
  CHECK_FALSE(pool.take(512));
  const DeviceAllocation a{nullptr, 1}, b{nullptr, 2}, c{nullptr, 3};
  pool.put(a, 1024);
  pool.put(b, 1024);
  pool.put(c, 4096);
  CHECK(pool.cached_bytes() == 6144);
  CHECK(pool.cached_blocks() == 3);
  CHECK_FALSE(pool.take(2048));  // no "best fit": a bigger cached block does not serve it
  auto got = pool.take(1024);
  REQUIRE(got);
  CHECK((*got == a || *got == b));
  CHECK(pool.cached_bytes() == 5120);
  CHECK(pool.cached_blocks() == 2);
  const auto drained = pool.drain();
  CHECK(drained.size() == 2);
  CHECK(pool.cached_bytes() == 0);
  CHECK(pool.cached_blocks() == 0);
  CHECK_FALSE(pool.take(4096));
}
