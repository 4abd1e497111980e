// OOM observers (DeviceMemory::add_oom_observer): an observer sees a refusal first and, if it freed
// memory, the request is retried, served and counted as one retry; one that frees nothing is called
// once; a removed one is not called again.
#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

TEST_CASE("an OOM observer sees the failure first, if it frees memory the allocation is retried",
          "[caching_pool][observer]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(10_MiB));
  auto victim = memory->allocate(MemoryCategory::ndarray, 8_MiB);
  REQUIRE(victim);

  int calls = 0;
  Failure seen;
  uint64_t ndarray_when_called = 0;
  memory->add_oom_observer([&](const Failure &f) {
    ++calls;
    seen = f;
    ndarray_when_called = charged(*memory, MemoryCategory::ndarray);
    REQUIRE(memory->free(*victim));  // the observer gives memory back (into the pool)
  });

  auto a = memory->allocate(MemoryCategory::staging, 4_MiB);
  REQUIRE(a);
  CHECK(calls == 1);
  CHECK(seen.result == RhiResult::out_of_memory);
  CHECK(seen.oom_source == OomSource::budget);
  CHECK(seen.requested_bytes == 4_MiB);
  CHECK(seen.category == MemoryCategory::staging);
  CHECK(seen.device == "mock");
  REQUIRE(seen.has_memory);  // annotated before the observers are called
  CHECK(seen.memory.limit_bytes == 10_MiB);
  CHECK(ndarray_when_called == 8_MiB);  // called while the victim was still held
  // One retry after the observer, one more after the victim's cached block was evicted.
  CHECK(memory->stats().retries == 2);
  CHECK(charged(*memory, MemoryCategory::staging) == 4_MiB);
  CHECK(charged(*memory, MemoryCategory::ndarray) == 0);
  REQUIRE(memory->free(*a));
}

TEST_CASE("an OOM observer that frees nothing is called once and the error is returned",
          "[caching_pool][observer]") {
  const bool driver = GENERATE(false, true);
  CAPTURE(driver);
  // Either the budget refuses (limit 10 MiB) or the driver does (capacity 10 MiB, no live check).
  MockDevice mock(mock_options(driver ? 10_MiB : 1_GiB));
  auto memory =
      make_memory(mock, cached(driver ? 1_GiB : 10_MiB, /*reserve_bytes=*/0, /*live_check=*/!driver));
  auto held = memory->allocate(MemoryCategory::ndarray, 8_MiB);
  REQUIRE(held);

  std::vector<Failure> seen;
  memory->add_oom_observer([&](const Failure &f) { seen.push_back(f); });
  auto refused = memory->allocate(MemoryCategory::staging, 4_MiB);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().result == RhiResult::out_of_memory);
  CHECK(refused.error().oom_source == (driver ? OomSource::driver : OomSource::budget));
  REQUIRE(seen.size() == 1);
  CHECK(seen[0].oom_source == refused.error().oom_source);
  CHECK(seen[0].requested_bytes == 4_MiB);
  CHECK(seen[0].category == MemoryCategory::staging);
  CHECK(memory->stats().retries == 0);
  CHECK(charged(*memory, MemoryCategory::staging) == 0);
  CHECK(mock.held_bytes() == 8_MiB);
  REQUIRE(memory->free(*held));
}

TEST_CASE("a removed OOM observer is not called again", "[caching_pool][observer]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(10_MiB));
  int first_calls = 0, second_calls = 0;
  const uint64_t first = memory->add_oom_observer([&](const Failure &) { ++first_calls; });
  const uint64_t second = memory->add_oom_observer([&](const Failure &) { ++second_calls; });
  CHECK(first != second);

  CHECK_FALSE(memory->allocate(MemoryCategory::ndarray, 11_MiB));
  CHECK(first_calls == 1);
  CHECK(second_calls == 1);

  CHECK(memory->remove_oom_observer(first));
  CHECK_FALSE(memory->remove_oom_observer(first));
  CHECK_FALSE(memory->remove_oom_observer(second + 100));
  CHECK_FALSE(memory->allocate(MemoryCategory::ndarray, 11_MiB));
  CHECK(first_calls == 1);
  CHECK(second_calls == 2);
}

TEST_CASE("a refusal an OOM observer cures is retried, served and counted as one retry",
          "[device_memory][observer]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(10_MiB));
  auto first = memory->allocate(MemoryCategory::ndarray, 6_MiB);
  REQUIRE(first);
  std::optional<DeviceAllocation> spare = *first;
  int calls = 0;
  (void)memory->add_oom_observer([&](const kiln::Failure &) {
    ++calls;
    if (spare) {
      REQUIRE(memory->free(*spare));
      spare.reset();
    }
  });

  SECTION("a budget refusal") {
    auto a = memory->allocate(MemoryCategory::ndarray, 8_MiB);  // 6 + 8 > 10, then 8 fits
    REQUIRE(a);
    CHECK(calls == 1);
    CHECK(memory->stats().retries == 1);
    CHECK(memory->stats().ledger.refusals == 0);  // cured: not a refusal
    CHECK(memory->free(*a));
  }
  SECTION("an injected fault") {
    memory->fault_plan().fail_nth_allocation(1);
    auto a = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    REQUIRE(a);
    CHECK(calls == 1);
    CHECK(memory->stats().retries == 1);
    CHECK(memory->free(*a));
  }
  SECTION("an observer that frees nothing: refused, no retry") {
    REQUIRE(memory->free(*spare));
    spare.reset();
    auto held = memory->allocate(MemoryCategory::ndarray, 6_MiB);
    REQUIRE(held);
    CHECK_FALSE(memory->allocate(MemoryCategory::ndarray, 8_MiB));
    CHECK(calls == 1);
    CHECK(memory->stats().retries == 0);
    CHECK(memory->stats().ledger.refusals == 1);
    CHECK(memory->free(*held));
  }
}

TEST_CASE("the retry after an OOM observer freed memory reuses the cache first",
          "[caching_pool][observer]") {
  // The single allocation and a group take one path: after the observers, the whole request is
  // tried again, cache first, so a block the observer freed serves it without a driver call.
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(10_MiB));
  auto first = memory->allocate(MemoryCategory::ndarray, 8_MiB);
  REQUIRE(first);
  std::optional<DeviceAllocation> spare = *first;
  (void)memory->add_oom_observer([&](const kiln::Failure &) {
    if (spare) REQUIRE(memory->free(*spare));  // into the cache: 8 MiB of the 10 MiB limit
    spare.reset();
  });
  const uint64_t calls = mock.driver_allocation_count();
  const uint64_t hits = memory->stats().cache_hits;
  auto a = memory->allocate(MemoryCategory::staging, 8_MiB);  // 8 + 8 > 10, then a hit
  REQUIRE(a);
  CHECK(memory->stats().cache_hits == hits + 1);
  CHECK(mock.driver_allocation_count() == calls);
  CHECK(memory->stats().retries == 1);
  CHECK(charged(*memory, MemoryCategory::staging) == 8_MiB);
  REQUIRE(memory->free(*a));
}

TEST_CASE("a refusal is counted once when the retry after the observers is refused outright",
          "[caching_pool][observer]") {
  // The observer frees a little and removes itself: the retry finds no observer and is refused
  // outright (counted there), and the refusal is not counted again on the way out.
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(64_MiB));
  auto keep = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  REQUIRE(keep);
  uint64_t id = 0;
  id = memory->add_oom_observer([&](const kiln::Failure &) {
    REQUIRE(memory->free(*keep));
    CHECK(memory->remove_oom_observer(id));
  });
  auto refused = memory->allocate(MemoryCategory::ndarray, 100_MiB);
  REQUIRE_FALSE(refused);
  CHECK(std::string_view(refused.error().site) == "BudgetAdaptor::refused_outright");
  CHECK(memory->stats().retries == 1);
  CHECK(memory->stats().ledger.refusals == 1);
}
