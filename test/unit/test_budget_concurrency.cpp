// MemoryBudget under concurrent use: 8 threads never push in_use past the limit, and the re-check
// under the lock refuses what another thread took after the lock-free check (single requests and
// groups, made deterministic with the budget's test hook).
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <latch>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/budget.h"
#include "memory_test_support.h"
#include "seeded_threads.h"

using namespace kiln::test::memory;
using kiln::test::run_seeded_threads;

TEST_CASE("8 threads reserving and releasing never push in_use past the limit",
          "[budget][threads]") {
  constexpr uint64_t kLimit = 8_MiB;
  constexpr int kIterations = 3000;
  MemoryBudget budget(kLimit);
  std::atomic<uint64_t> over_limit_seen{0};
  std::atomic<uint64_t> granted{0};
  std::atomic<uint64_t> refused{0};

  auto worker = [&](std::mt19937 &rng) {
    std::uniform_int_distribution<uint64_t> size(1, 1_MiB);
    std::uniform_int_distribution<int> category(0, kiln::kNumMemoryCategories - 1);
    std::vector<Reservation> held;
    std::vector<std::pair<MemoryCategory, uint64_t>> committed;
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
  run_seeded_threads(/*num_threads=*/8, /*first_seed=*/42u, worker);

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

  /// Installs itself as `on`'s before-lock hook; a second thread will reserve `second_bytes`.
  SecondReserverInTheGap(MemoryBudget &on, uint64_t second_bytes) : budget(&on), size_bytes(second_bytes) {
    on.set_before_lock_hook_for_testing(&SecondReserverInTheGap::run, this);
  }

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
  SecondReserverInTheGap gap(budget, /*second_bytes=*/8_MiB);

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
  SecondReserverInTheGap gap(budget, /*second_bytes=*/4_MiB);
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
