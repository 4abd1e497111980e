// MemoryBudget's refusals (runtime/memory/budget.h): a refusal leaves the ledger as it was, a value
// that is no category is invalid_usage, a request over the limit or a lowered limit is refused,
// groups are all-or-nothing and a total that overflows is refused, and every refusal is counted.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <string_view>

#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/budget.h"
#include "memory_test_support.h"

using namespace kiln::test::memory;

namespace {

/// What refusals leave behind: nothing charged, and `refusals` refusals counted.
void check_charges_nothing(const MemoryBudget &budget, uint64_t refusals) {
  CHECK(budget.in_use_bytes() == 0);
  CHECK(budget.stats().refusals == refusals);
}

}  // namespace

TEST_CASE("reserve beyond the budget refuses and leaves the ledger unchanged", "[budget]") {
  MemoryBudget budget(/*limit_bytes=*/10_MiB);
  auto first = budget.reserve(MemoryCategory::ndarray, 8_MiB);
  REQUIRE(first);
  auto staging = budget.reserve(MemoryCategory::staging, 1_MiB);
  REQUIRE(staging);
  const auto before = budget.stats();

  auto refused = budget.reserve(MemoryCategory::argument_buffer, 2_MiB);
  REQUIRE_FALSE(refused);
  const kiln::Failure &f = refused.error();
  CHECK(f.result == RhiResult::out_of_memory);
  CHECK(f.oom_source == OomSource::budget);
  CHECK(f.category == MemoryCategory::argument_buffer);
  CHECK(f.requested_bytes == 2_MiB);
  CHECK(std::string_view(f.site) == "MemoryBudget::reserve");
  REQUIRE(f.has_memory);
  CHECK(f.memory.limit_bytes == 10_MiB);
  CHECK(f.memory.in_use_bytes[static_cast<std::size_t>(MemoryCategory::ndarray)] == 8_MiB);
  CHECK(f.memory.in_use_bytes[static_cast<std::size_t>(MemoryCategory::staging)] == 1_MiB);
  CHECK(f.memory.in_use_total_bytes() == 9_MiB);

  const auto after = budget.stats();
  CHECK(budget.in_use_bytes() == 9_MiB);
  CHECK(after.current_bytes == before.current_bytes);
  CHECK(after.peak_bytes == before.peak_bytes);
  CHECK(after.peak_total_bytes == before.peak_total_bytes);
  CHECK(after.refusals == before.refusals + 1);

  // Exactly what is left still fits.
  auto exact = budget.reserve(MemoryCategory::argument_buffer, 1_MiB);
  REQUIRE(exact);
  CHECK(budget.in_use_bytes() == 10_MiB);
  CHECK_FALSE(budget.reserve(MemoryCategory::ndarray, 1));
}

TEST_CASE("a value that is no category is invalid_usage and charges nothing", "[budget]") {
  MemoryBudget budget(10_MiB);
  auto r = budget.reserve(static_cast<MemoryCategory>(kiln::kNumMemoryCategories), 1_MiB);
  REQUIRE_FALSE(r);
  CHECK(r.error().result == RhiResult::invalid_usage);
  check_charges_nothing(budget, /*refusals=*/0);  // bad input, not a budget refusal
  budget.release(static_cast<MemoryCategory>(255), 1_MiB);  // ignored
  CHECK(budget.in_use_bytes() == 0);
}

TEST_CASE("a single request larger than the limit is refused", "[budget]") {
  MemoryBudget budget(4_MiB);
  auto r = budget.reserve(MemoryCategory::ndarray, 4_MiB + 1);
  REQUIRE_FALSE(r);
  CHECK(r.error().oom_source == OomSource::budget);
  check_charges_nothing(budget, /*refusals=*/1);
}

TEST_CASE("a group reservation is all-or-nothing", "[budget]") {
  MemoryBudget budget(10_MiB);
  auto held = budget.reserve(MemoryCategory::ndarray, 4_MiB);
  REQUIRE(held);

  const std::array<CategoryRequest, 3> too_much{{{MemoryCategory::staging, 2_MiB},
                                                 {MemoryCategory::argument_buffer, 2_MiB},
                                                 {MemoryCategory::result_buffer, 3_MiB}}};
  auto refused = budget.reserve(too_much);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().result == RhiResult::out_of_memory);
  CHECK(refused.error().oom_source == OomSource::budget);
  CHECK(refused.error().requested_bytes == 7_MiB);  // the failure names the total
  CHECK(budget.in_use_bytes() == 4_MiB);
  CHECK(in_use(budget, MemoryCategory::staging) == 0);
  CHECK(in_use(budget, MemoryCategory::argument_buffer) == 0);
  CHECK(in_use(budget, MemoryCategory::result_buffer) == 0);

  const std::array<CategoryRequest, 3> fits{{{MemoryCategory::staging, 2_MiB},
                                             {MemoryCategory::argument_buffer, 2_MiB},
                                             {MemoryCategory::staging, 2_MiB}}};
  {
    auto ok = budget.reserve(fits);
    REQUIRE(ok);
    CHECK(ok->total_bytes() == 6_MiB);
    CHECK(in_use(budget, MemoryCategory::staging) == 4_MiB);
    CHECK(in_use(budget, MemoryCategory::argument_buffer) == 2_MiB);
    CHECK(budget.in_use_bytes() == 10_MiB);
  }
  CHECK(budget.in_use_bytes() == 4_MiB);
}

TEST_CASE("a group whose total overflows 64 bits is refused, not wrapped", "[budget]") {
  MemoryBudget budget(10_MiB);
  // Each alone is huge; together they wrap to 1 MiB if the sum is not checked.
  const uint64_t huge = UINT64_MAX - 1_MiB + 1;
  const std::array<CategoryRequest, 2> requests{{{MemoryCategory::ndarray, huge},
                                                 {MemoryCategory::staging, 2_MiB}}};
  REQUIRE(huge + 2_MiB == 1_MiB);  // the wrap the budget must not fall for
  auto r = budget.reserve(requests);
  REQUIRE_FALSE(r);
  CHECK(r.error().result == RhiResult::out_of_memory);
  CHECK(r.error().oom_source == OomSource::budget);
  CHECK(budget.in_use_bytes() == 0);
  CHECK(budget.stats().current_total_bytes() == 0);

  const std::array<CategoryRequest, 2> same_category{{{MemoryCategory::ndarray, huge},
                                                      {MemoryCategory::ndarray, 2_MiB}}};
  CHECK_FALSE(budget.reserve(same_category));
  check_charges_nothing(budget, /*refusals=*/2);
}

TEST_CASE("a group whose total overflows 64 bits reclaims nothing, even with no limit", "[budget]") {
  // No limit holds a sum past 2^64, so evicting the cache for it would only lose the cache.
  struct CountingHook final : kiln::runtime::ReclaimHook {
    int reclaims = 0;
    uint64_t unreclaimable_bytes() const override { return 0; }
    bool reclaim() override {
      ++reclaims;
      return true;
    }
  } hook;
  MemoryBudget budget(UINT64_MAX);
  auto held = budget.reserve(MemoryCategory::pool_cache, 1_MiB);  // a cached block
  REQUIRE(held);
  held->commit();
  const std::array<CategoryRequest, 2> wraps{{{MemoryCategory::ndarray, UINT64_MAX / 2 + 1},
                                              {MemoryCategory::ndarray, UINT64_MAX / 2 + 1}}};
  auto refused = budget.reserve(wraps, hook);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().result == RhiResult::out_of_memory);
  CHECK(hook.reclaims == 0);
  // A total that fits only once the cache is gone does reclaim.
  const std::array<CategoryRequest, 1> all{{{MemoryCategory::ndarray, UINT64_MAX}}};
  CHECK_FALSE(budget.reserve(all, hook));
  CHECK(hook.reclaims == MemoryBudget::kReclaimRounds);
}

TEST_CASE("a lowered limit refuses new reservations and keeps what is held", "[budget]") {
  MemoryBudget budget(10_MiB);
  auto r = budget.reserve(MemoryCategory::ndarray, 6_MiB);
  REQUIRE(r);
  budget.set_limit_bytes(4_MiB);
  CHECK(budget.limit_bytes() == 4_MiB);
  CHECK(budget.in_use_bytes() == 6_MiB);
  auto refused = budget.reserve(MemoryCategory::ndarray, 1);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().memory.limit_bytes == 4_MiB);
  CHECK(budget.stats().limit_bytes == 4_MiB);
}

TEST_CASE("the refusals counter counts every refused reservation and nothing else", "[budget]") {
  MemoryBudget budget(1_MiB);
  CHECK(budget.stats().refusals == 0);
  auto ok = budget.reserve(MemoryCategory::ndarray, 1_MiB);
  REQUIRE(ok);
  CHECK(budget.stats().refusals == 0);
  for (int i = 0; i < 3; ++i) CHECK_FALSE(budget.reserve(MemoryCategory::ndarray, 1));
  CHECK(budget.stats().refusals == 3);
  budget.reset_peaks();
  CHECK(budget.stats().refusals == 3);
}
