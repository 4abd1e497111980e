// The budget's ledger: release gives committed bytes back without going below zero, and peaks record
// the most held (committed, not only reserved) until reset_peaks sets them to now (the thread
// caches' peaks: test_thread_cache_peaks.cpp).
#include <catch2/catch.hpp>

#include <array>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/budget.h"
#include "kiln/runtime/memory/device_memory.h"
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
    a->commit();
    b->commit();
  }
  budget.release(MemoryCategory::ndarray, 5_MiB);
  budget.release(MemoryCategory::staging, 3_MiB);
  auto c = budget.reserve(MemoryCategory::ndarray, 2_MiB);
  REQUIRE(c);
  c->commit();
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
  d->commit();
  s = budget.stats();
  CHECK(s.peak_total_bytes == 3_MiB);
  CHECK(s.peak_bytes[static_cast<std::size_t>(MemoryCategory::staging)] == 1_MiB);
}

TEST_CASE("a reservation given back never raises the peaks; its commit does", "[budget]") {
  MemoryBudget budget(10_MiB);
  {
    auto given_back = budget.reserve(MemoryCategory::ndarray, 6_MiB);
    REQUIRE(given_back);
    CHECK(budget.stats().current_total_bytes() == 6_MiB);  // charged while it is under way
  }
  auto part = budget.reserve(MemoryCategory::staging, 4_MiB);
  REQUIRE(part);
  part->release_part(MemoryCategory::staging, 3_MiB);  // a group member that hit the cache
  CHECK(budget.stats().peak_total_bytes == 0);
  CHECK(budget.stats().peak_bytes[static_cast<std::size_t>(MemoryCategory::ndarray)] == 0);
  part->commit();
  const auto s = budget.stats();
  CHECK(s.peak_total_bytes == 1_MiB);
  CHECK(s.peak_bytes[static_cast<std::size_t>(MemoryCategory::staging)] == 1_MiB);
  // Released bytes leave the held figure: a later commit's peak counts only what is held.
  budget.release(MemoryCategory::staging, 1_MiB);
  auto next = budget.reserve(MemoryCategory::staging, 512_KiB);
  REQUIRE(next);
  next->commit();
  CHECK(budget.stats().peak_bytes[static_cast<std::size_t>(MemoryCategory::staging)] == 1_MiB);
  CHECK(budget.stats().peak_total_bytes == 1_MiB);
}

TEST_CASE("commit_part counts a part as held now and leaves the rest reserved", "[budget]") {
  MemoryBudget budget(10_MiB);
  {
    auto r = budget.reserve(std::array<CategoryRequest, 2>{{{MemoryCategory::ndarray, 4_MiB},
                                                            {MemoryCategory::ndarray, 2_MiB}}});
    REQUIRE(r);
    r->commit_part(MemoryCategory::ndarray, 4_MiB);
    CHECK(budget.stats().peak_total_bytes == 4_MiB);
    CHECK(r->total_bytes() == 2_MiB);
  }  // the uncommitted 2 MiB go back; the committed 4 MiB stay charged
  CHECK(budget.in_use_bytes() == 4_MiB);
  CHECK(budget.stats().peak_total_bytes == 4_MiB);
}

TEST_CASE("an over-release gives back only what is held, not another request's reservation",
          "[budget]") {
  MemoryBudget budget(10_MiB);
  auto held = budget.reserve(MemoryCategory::ndarray, 2_MiB);
  REQUIRE(held);
  held->commit();
  auto under_way = budget.reserve(MemoryCategory::ndarray, 3_MiB);  // not committed yet
  REQUIRE(under_way);
  budget.release(MemoryCategory::ndarray, 5_MiB);  // a caller's bug: more than it holds
  CHECK(budget.in_use_bytes() == 3_MiB);           // the reservation under way is still charged
  under_way->commit();
  CHECK(budget.stats().peak_total_bytes == 3_MiB);
}

TEST_CASE("a group's block counts in the peak from its allocation, before a later block evicts",
          "[budget]") {
  // 8 MiB cached; a group of 4 MiB and 6 MiB on a 14 MiB device: the 4 MiB block is allocated
  // beside the cache (12 MiB held), the 6 MiB one is refused by the driver, the cache is evicted
  // and the retry succeeds (10 MiB held). The most held at once was 12 MiB.
  MockDevice mock(mock_options(14_MiB));
  auto memory = make_memory(mock, cached(1_GiB, 0, /*live_check=*/false));
  auto cached_block = memory->allocate(MemoryCategory::staging, 8_MiB);
  REQUIRE(cached_block);
  REQUIRE(memory->free(*cached_block));
  const std::array<AllocRequest, 2> group{{{MemoryCategory::ndarray, 4_MiB},
                                           {MemoryCategory::ndarray, 6_MiB}}};
  auto grown = memory->allocate_group(group);
  REQUIRE(grown);
  CHECK(memory->stats().ledger.peak_total_bytes == 12_MiB);
  CHECK(mock.high_water_bytes() == 12_MiB);  // the device's own account agrees
  CHECK(memory->stats().evictions == 1);
  CHECK(memory->stats().driver_ooms == 1);
  CHECK(mock.held_bytes() == 10_MiB);
  for (DeviceAllocation a : *grown) REQUIRE(memory->free(a));
}

TEST_CASE("a refusal after the limit check leaves the device's peaks as they were", "[budget]") {
  // The budget reserves before the live check and the driver; a refusal there gives it back.
  const bool live_check = GENERATE(true, false);
  CAPTURE(live_check);
  MockDevice mock(mock_options(256_MiB, {100_MiB}));  // another process holds 100 MiB
  auto memory = make_memory(mock, cached(1_GiB, 0, live_check));
  auto held = memory->allocate(MemoryCategory::ndarray, 8_MiB);
  REQUIRE(held);
  const auto before = memory->stats().ledger;
  auto refused = memory->allocate(MemoryCategory::ndarray, 200_MiB);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().oom_source == (live_check ? OomSource::budget : OomSource::driver));
  const auto after = memory->stats().ledger;
  CHECK(after.peak_total_bytes == before.peak_total_bytes);
  CHECK(after.peak_total_bytes == 8_MiB);
  CHECK(after.peak_bytes == before.peak_bytes);
  REQUIRE(memory->free(*held));
}
