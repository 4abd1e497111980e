// The budget's ledger: release gives committed bytes back without going below zero, and peaks record
// the most held until reset_peaks sets them to now (the thread caches' peaks:
// test_thread_cache_peaks.cpp).
#include <catch2/catch.hpp>

#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/budget.h"
#include "memory_test_support.h"

using namespace kiln::test::memory;

TEST_CASE("release gives committed bytes back without going below zero", "[budget]") {
  MemoryBudget budget(10_MiB);
  auto r = budget.reserve(MemoryCategory::pool_cache, 6_MiB);
  REQUIRE(r);
  r->commit();
  CHECK(budget.stats().peak_bytes[static_cast<std::size_t>(MemoryCategory::pool_cache)] == 6_MiB);

  budget.release(MemoryCategory::pool_cache, 1_MiB);
  CHECK(budget.in_use_bytes() == 5_MiB);
  // Releasing more than held (a caller's bug) clamps at zero for that category only.
  budget.release(MemoryCategory::staging, 1_MiB);
  CHECK(budget.in_use_bytes() == 5_MiB);
  budget.release(MemoryCategory::pool_cache, 100_MiB);
  CHECK(budget.in_use_bytes() == 0);
  CHECK(budget.stats().current_total_bytes() == 0);
  // And the whole limit is usable again.
  auto all = budget.reserve(MemoryCategory::ndarray, 10_MiB);
  CHECK(all);
}

TEST_CASE("peaks record the most held and reset_peaks sets them to now", "[budget]") {
  MemoryBudget budget(10_MiB);
  {
    auto a = budget.reserve(MemoryCategory::ndarray, 5_MiB);
    auto b = budget.reserve(MemoryCategory::staging, 3_MiB);
    REQUIRE(a);
    REQUIRE(b);
  }
  auto c = budget.reserve(MemoryCategory::ndarray, 2_MiB);
  REQUIRE(c);
  auto s = budget.stats();
  CHECK(s.peak_total_bytes == 8_MiB);
  CHECK(s.peak_bytes[static_cast<std::size_t>(MemoryCategory::ndarray)] == 5_MiB);
  CHECK(s.peak_bytes[static_cast<std::size_t>(MemoryCategory::staging)] == 3_MiB);
  CHECK(s.current_total_bytes() == 2_MiB);

  budget.reset_peaks();
  s = budget.stats();
  CHECK(s.peak_total_bytes == 2_MiB);
  CHECK(s.peak_bytes[static_cast<std::size_t>(MemoryCategory::ndarray)] == 2_MiB);
  CHECK(s.peak_bytes[static_cast<std::size_t>(MemoryCategory::staging)] == 0);

  auto d = budget.reserve(MemoryCategory::staging, 1_MiB);
  REQUIRE(d);
  s = budget.stats();
  CHECK(s.peak_total_bytes == 3_MiB);
  CHECK(s.peak_bytes[static_cast<std::size_t>(MemoryCategory::staging)] == 1_MiB);
}
