// MemoryBudget, its ledger and Reservation: refusals leave the ledger as it was, reservations
// give their bytes back unless committed, groups are all-or-nothing, and the limit holds under
// concurrent use.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <latch>
#include <optional>
#include <random>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/budget.h"

using kiln::MemoryCategory;
using kiln::OomSource;
using kiln::RhiResult;
using kiln::runtime::CategoryRequest;
using kiln::runtime::MemoryBudget;
using kiln::runtime::Reservation;

namespace {

constexpr uint64_t operator""_MiB(unsigned long long n) { return n << 20; }

uint64_t in_use(const MemoryBudget &budget, MemoryCategory category) {
  return budget.in_use_by_category()[static_cast<std::size_t>(category)];
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
  CHECK(budget.in_use_bytes() == 0);
  CHECK(budget.stats().refusals == 0);  // bad input, not a budget refusal
  budget.release(static_cast<MemoryCategory>(255), 1_MiB);  // ignored
  CHECK(budget.in_use_bytes() == 0);
}

TEST_CASE("a single request larger than the limit is refused", "[budget]") {
  MemoryBudget budget(4_MiB);
  auto r = budget.reserve(MemoryCategory::ndarray, 4_MiB + 1);
  REQUIRE_FALSE(r);
  CHECK(r.error().oom_source == OomSource::budget);
  CHECK(budget.in_use_bytes() == 0);
  CHECK(budget.stats().refusals == 1);
}

TEST_CASE("a dropped reservation gives its bytes back, a committed one keeps them", "[budget]") {
  MemoryBudget budget(10_MiB);
  {
    auto r = budget.reserve(MemoryCategory::staging, 6_MiB);
    REQUIRE(r);
    CHECK(r->total_bytes() == 6_MiB);
    CHECK(budget.in_use_bytes() == 6_MiB);
    CHECK(in_use(budget, MemoryCategory::staging) == 6_MiB);
  }
  CHECK(budget.in_use_bytes() == 0);
  CHECK(in_use(budget, MemoryCategory::staging) == 0);

  {
    auto r = budget.reserve(MemoryCategory::ndarray, 6_MiB);
    REQUIRE(r);
    r->commit();
    CHECK(r->total_bytes() == 0);
  }
  CHECK(budget.in_use_bytes() == 6_MiB);
  CHECK(in_use(budget, MemoryCategory::ndarray) == 6_MiB);
  // The committed charge is the caller's to release.
  budget.release(MemoryCategory::ndarray, 6_MiB);
  CHECK(budget.in_use_bytes() == 0);
}

TEST_CASE("release_part gives part of a reservation back now and the rest on drop", "[budget]") {
  MemoryBudget budget(10_MiB);
  {
    const std::array<CategoryRequest, 2> group{{{MemoryCategory::ndarray, 3_MiB},
                                                {MemoryCategory::staging, 2_MiB}}};
    auto r = budget.reserve(group);
    REQUIRE(r);
    r->release_part(MemoryCategory::staging, 1_MiB);
    CHECK(in_use(budget, MemoryCategory::staging) == 1_MiB);
    CHECK(r->total_bytes() == 4_MiB);
    // More than the reservation holds in that category: only what it holds goes back.
    r->release_part(MemoryCategory::staging, 5_MiB);
    CHECK(in_use(budget, MemoryCategory::staging) == 0);
    CHECK(budget.in_use_bytes() == 3_MiB);
  }
  CHECK(budget.in_use_bytes() == 0);
}

TEST_CASE("a moved reservation is given back once, by its new owner", "[budget]") {
  MemoryBudget budget(10_MiB);
  SECTION("move construction") {
    auto r = budget.reserve(MemoryCategory::ndarray, 4_MiB);
    REQUIRE(r);
    {
      Reservation moved(std::move(*r));
      CHECK(moved.total_bytes() == 4_MiB);
      CHECK(r->total_bytes() == 0);
      CHECK(budget.in_use_bytes() == 4_MiB);
    }
    CHECK(budget.in_use_bytes() == 0);
    // Dropping the moved-from reservation gives nothing back a second time.
    auto other = budget.reserve(MemoryCategory::ndarray, 2_MiB);
    REQUIRE(other);
    other->commit();
  }
  SECTION("move assignment gives back what the target held") {
    auto a = budget.reserve(MemoryCategory::ndarray, 4_MiB);
    auto b = budget.reserve(MemoryCategory::staging, 3_MiB);
    REQUIRE(a);
    REQUIRE(b);
    *a = std::move(*b);
    CHECK(in_use(budget, MemoryCategory::ndarray) == 0);
    CHECK(in_use(budget, MemoryCategory::staging) == 3_MiB);
    CHECK(a->total_bytes() == 3_MiB);
    CHECK(b->total_bytes() == 0);
    Reservation c;
    c = std::move(*a);
    CHECK(budget.in_use_bytes() == 3_MiB);
    c = Reservation{};
    CHECK(budget.in_use_bytes() == 0);
    auto other = budget.reserve(MemoryCategory::ndarray, 2_MiB);
    REQUIRE(other);
    other->commit();
  }
  // Whatever the sections did, the moved-from husks did not release the committed 2 MiB.
  CHECK(budget.in_use_bytes() == 2_MiB);
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
  CHECK(budget.in_use_bytes() == 0);
  CHECK(budget.stats().refusals == 2);
}

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

TEST_CASE("8 threads reserving and releasing never push in_use past the limit",
          "[budget][threads]") {
  constexpr uint64_t kLimit = 8_MiB;
  constexpr int kThreads = 8;
  constexpr int kIterations = 3000;
  MemoryBudget budget(kLimit);
  std::atomic<uint64_t> over_limit_seen{0};
  std::atomic<uint64_t> granted{0};
  std::atomic<uint64_t> refused{0};
  std::latch start(kThreads);

  auto worker = [&](unsigned seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<uint64_t> size(1, 1_MiB);
    std::uniform_int_distribution<int> category(0, kiln::kNumMemoryCategories - 1);
    std::vector<Reservation> held;
    std::vector<std::pair<MemoryCategory, uint64_t>> committed;
    start.arrive_and_wait();
    for (int i = 0; i < kIterations; ++i) {
      const auto cat = static_cast<MemoryCategory>(category(rng));
      switch (rng() % 4) {
        case 0:
        case 1: {
          const uint64_t n = size(rng);
          auto r = budget.reserve(cat, n);
          if (!r) {
            refused.fetch_add(1);
            break;
          }
          granted.fetch_add(1);
          if (rng() & 1u) {
            r->commit();
            committed.emplace_back(cat, n);
          } else {
            held.push_back(std::move(*r));
          }
          break;
        }
        case 2:
          if (!held.empty()) held.pop_back();
          break;
        default:
          if (!committed.empty()) {
            budget.release(committed.back().first, committed.back().second);
            committed.pop_back();
          }
      }
      if (budget.in_use_bytes() > kLimit) over_limit_seen.fetch_add(1);
      if (budget.stats().current_total_bytes() > kLimit) over_limit_seen.fetch_add(1);
    }
    held.clear();
    for (auto [cat, n] : committed) budget.release(cat, n);
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, 42u + t);
  for (auto &t : threads) t.join();

  CHECK(over_limit_seen.load() == 0);
  CHECK(budget.stats().peak_total_bytes <= kLimit);
  CHECK(granted.load() > 0);
  CHECK(refused.load() > 0);  // the limit was actually contended
  CHECK(budget.stats().refusals == refused.load());
  CHECK(budget.in_use_bytes() == 0);
  CHECK(budget.stats().current_total_bytes() == 0);
}

namespace {

// The race the re-check under the lock closes, made deterministic: when the first reservation
// has passed the lock-free check (8 MiB fit a 10 MiB budget), a second thread reserves 8 MiB
// before the first takes the lock. The hook runs once.
struct SecondReserverInTheGap {
  MemoryBudget *budget = nullptr;
  MemoryCategory category = MemoryCategory::ndarray;
  uint64_t size_bytes = 0;
  std::atomic<bool> fired{false};
  bool second_granted = false;
  std::optional<Reservation> second;

  static void run(void *self) {
    auto &gap = *static_cast<SecondReserverInTheGap *>(self);
    if (gap.fired.exchange(true)) return;  // the second thread's own reserve passes through
    std::thread other([&gap] {
      auto r = gap.budget->reserve(gap.category, gap.size_bytes);
      gap.second_granted = r.has_value();
      if (r) gap.second.emplace(std::move(*r));
    });
    other.join();
  }
};

}  // namespace

TEST_CASE("the re-check under the lock refuses what another thread took after the lock-free check",
          "[budget][threads][recheck]") {
  MemoryBudget budget(10_MiB);
  SecondReserverInTheGap gap;
  gap.budget = &budget;
  gap.size_bytes = 8_MiB;
  budget.set_before_lock_hook_for_testing(&SecondReserverInTheGap::run, &gap);

  auto first = budget.reserve(MemoryCategory::staging, 8_MiB);

  REQUIRE(gap.fired.load());
  CHECK(gap.second_granted);  // the second thread got in first
  REQUIRE_FALSE(first.has_value());  // and the first, re-checked under the lock, is refused
  CHECK(first.error().result == RhiResult::out_of_memory);
  CHECK(first.error().oom_source == OomSource::budget);
  CHECK(first.error().requested_bytes == 8_MiB);
  CHECK(first.error().memory.limit_bytes == 10_MiB);
  CHECK(budget.in_use_bytes() == 8_MiB);  // never past the limit
  CHECK(in_use(budget, MemoryCategory::staging) == 0);
  CHECK(budget.stats().refusals == 1);
  budget.set_before_lock_hook_for_testing(nullptr, nullptr);
  gap.second.reset();
  CHECK(budget.in_use_bytes() == 0);
  CHECK(budget.reserve(MemoryCategory::staging, 8_MiB).has_value());  // the gap closed: it fits
}

TEST_CASE("a group reservation is re-checked under the lock as one total",
          "[budget][threads][recheck]") {
  MemoryBudget budget(10_MiB);
  SecondReserverInTheGap gap;
  gap.budget = &budget;
  gap.size_bytes = 4_MiB;
  budget.set_before_lock_hook_for_testing(&SecondReserverInTheGap::run, &gap);
  const std::array<CategoryRequest, 2> group{{{MemoryCategory::argument_buffer, 3_MiB},
                                              {MemoryCategory::staging, 4_MiB}}};

  auto first = budget.reserve(group);  // 7 MiB fit 10 at the lock-free check, not after 4 more

  CHECK(gap.second_granted);
  REQUIRE_FALSE(first.has_value());
  CHECK(first.error().requested_bytes == 7_MiB);
  CHECK(budget.in_use_bytes() == 4_MiB);
  CHECK(in_use(budget, MemoryCategory::argument_buffer) == 0);
  budget.set_before_lock_hook_for_testing(nullptr, nullptr);
}
