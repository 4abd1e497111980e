// Reservation (runtime/memory/budget.h): a dropped reservation gives its bytes back, a committed one
// keeps them, release_part gives part back now, a moved one is given back once by its new owner.
#include <catch2/catch.hpp>

#include <array>
#include <utility>

#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/budget.h"
#include "memory_test_support.h"

using namespace kiln::test::memory;

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
