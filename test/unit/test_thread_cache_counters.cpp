// The request fault plan and the stats counters with thread caches: lock-free hits are counted and
// can be failed (on the owner's and on another thread), counts survive the thread's exit, and
// refusals that eviction or an observer cured are not counted as refusals.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"
#include "thread_cache_test_support.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

TEST_CASE_METHOD(CachedMemoryOnMock<100_MiB>,
                 "the request fault plan counts and fails requests that would be lock-free hits",
                 "[thread_cache][fault]") {
  // Warm 1 MiB and 2 MiB: after a miss and a free, the next requests are lock-free hits.
  const std::array<Ask, 2> asks{{{MemoryCategory::ndarray, 1_MiB}, {MemoryCategory::ndarray, 2_MiB}}};
  REQUIRE(fill_and_free(*memory, asks, 2) == 0);
  const uint64_t driver_calls = mock.driver_allocation_count();
  REQUIRE(driver_calls == 2);
  auto round_trip = [&](uint64_t size_bytes) {
    auto a = memory->allocate(MemoryCategory::ndarray, size_bytes);
    REQUIRE(a);
    REQUIRE(memory->free(*a));
  };

  memory->fault_plan().fail_nth_allocation(FaultPlan::kNever);  // resets the count
  CHECK_FALSE(memory->fault_plan().armed());
  CHECK(memory->fault_plan().allocation_count() == 0);
  uint64_t hits = memory->stats().cache_hits;
  for (int i = 0; i < 5; ++i) round_trip(1_MiB);
  CHECK(memory->fault_plan().allocation_count() == 5);
  CHECK(memory->stats().cache_hits == hits + 5);
  CHECK(mock.driver_allocation_count() == driver_calls);

  SECTION("fail_nth_allocation fails the n-th request, a would-be hit, and nothing moves") {
    memory->fault_plan().fail_nth_allocation(2);
    CHECK(memory->fault_plan().allocation_count() == 0);
    round_trip(1_MiB);  // request 1
    hits = memory->stats().cache_hits;
    const auto ledger = memory->in_use_by_category();
    const uint64_t blocks = memory->stats().cached_blocks;
    auto faulted = memory->allocate(MemoryCategory::ndarray, 1_MiB);  // request 2
    REQUIRE_FALSE(faulted);
    CHECK(faulted.error().result == RhiResult::out_of_memory);
    CHECK(faulted.error().oom_source == OomSource::driver);
    CHECK(faulted.error().requested_bytes == 1_MiB);
    CHECK(memory->fault_plan().allocation_count() == 2);
    CHECK(memory->stats().cache_hits == hits);
    CHECK(memory->stats().cached_blocks == blocks);
    CHECK(memory->in_use_by_category() == ledger);
    round_trip(1_MiB);  // request 3 is served
    CHECK(memory->stats().cache_hits == hits + 1);
    CHECK(memory->fault_plan().allocation_count() == 3);

    // Cleared, the hits are lock-free again and still counted.
    memory->fault_plan().clear();
    for (int i = 0; i < 3; ++i) round_trip(1_MiB);
    CHECK(memory->fault_plan().allocation_count() == 6);
    CHECK(memory->stats().cache_hits == hits + 4);
  }
  SECTION("fail_sizes_at_least fails would-be hits from that size up only") {
    memory->fault_plan().fail_sizes_at_least(2_MiB);
    CHECK(memory->fault_plan().armed());
    round_trip(1_MiB);
    auto faulted = memory->allocate(MemoryCategory::ndarray, 2_MiB);
    REQUIRE_FALSE(faulted);
    CHECK(faulted.error().result == RhiResult::out_of_memory);
    CHECK(faulted.error().oom_source == OomSource::driver);
    CHECK(memory->fault_plan().allocation_count() == 7);
    memory->fault_plan().fail_sizes_at_least(FaultPlan::kNever);
    CHECK_FALSE(memory->fault_plan().armed());
    hits = memory->stats().cache_hits;
    round_trip(2_MiB);
    round_trip(2_MiB);
    CHECK(memory->stats().cache_hits == hits + 2);
    CHECK(memory->fault_plan().allocation_count() == 9);
  }
  CHECK(mock.driver_allocation_count() == driver_calls);
  check_ledger(*memory, mock, 0);
}

TEST_CASE_METHOD(CachedMemoryOnMock<100_MiB>,
                 "the request fault plan counts and fails another thread's lock-free hits",
                 "[thread_cache][fault][concurrency]") {
  Worker w;
  const std::array<Ask, 1> asks{{{MemoryCategory::ndarray, 1_MiB}}};
  std::vector<uint64_t> ids;
  REQUIRE(w.run([&] { return fill_and_free(*memory, asks, 3, &ids); }) == 0);
  const uint64_t driver_calls = mock.driver_allocation_count();
  const uint64_t hits = memory->stats().cache_hits;
  REQUIRE(hits == 2);

  // The first request on the worker, a would-be hit, fails; the second is served.
  memory->fault_plan().fail_nth_allocation(1);
  auto faulted = w.run([&] { return memory->allocate(MemoryCategory::ndarray, 1_MiB); });
  REQUIRE_FALSE(faulted);
  CHECK(faulted.error().result == RhiResult::out_of_memory);
  CHECK(faulted.error().oom_source == OomSource::driver);
  CHECK(memory->stats().cached_blocks == 1);
  CHECK(memory->stats().cache_hits == hits);
  auto served = w.run([&] { return memory->allocate(MemoryCategory::ndarray, 1_MiB); });
  REQUIRE(served);
  CHECK(served->alloc_id == ids.front());
  CHECK(memory->stats().cache_hits == hits + 1);
  CHECK(memory->fault_plan().allocation_count() == 2);
  REQUIRE(w.run([&] { return memory->free(*served); }));

  // Disarmed: the worker's 5 lock-free hits are counted, also after the worker exits.
  memory->fault_plan().fail_nth_allocation(FaultPlan::kNever);
  REQUIRE(w.run([&] { return fill_and_free(*memory, asks, 5); }) == 0);
  CHECK(memory->fault_plan().allocation_count() == 5);
  CHECK(memory->stats().cache_hits == hits + 6);
  w.stop();
  CHECK(memory->fault_plan().allocation_count() == 5);
  CHECK(memory->stats().cache_hits == hits + 6);
  auto on_main = memory->allocate(MemoryCategory::ndarray, 1_MiB);  // now from the shared pool
  REQUIRE(on_main);
  CHECK(memory->fault_plan().allocation_count() == 6);
  CHECK(mock.driver_allocation_count() == driver_calls);
  REQUIRE(memory->free(*on_main));
  check_ledger(*memory, mock, 0);
}

TEST_CASE_METHOD(CachedMemoryOnMock<100_MiB>,
                 "stats count lock-free allocations, frees and hits, also after the thread exits",
                 "[thread_cache][concurrency]") {
  // 1 MiB goes through thread caches; 8 MiB (no thread-cache bin) through the shared pool.
  const std::array<Ask, 2> asks{{{MemoryCategory::ndarray, 1_MiB}, {MemoryCategory::staging, 8_MiB}}};
  REQUIRE(fill_and_free(*memory, asks, 1) == 0);
  const uint64_t driver_calls = mock.driver_allocation_count();
  MemoryStats s0 = memory->stats();
  REQUIRE(s0.allocations == 2);
  REQUIRE(s0.frees == 2);
  REQUIRE(s0.cache_hits == 0);

  REQUIRE(fill_and_free(*memory, asks, 100) == 0);
  MemoryStats s1 = memory->stats();
  CHECK(s1.allocations == s0.allocations + 200);
  CHECK(s1.frees == s0.frees + 200);
  CHECK(s1.cache_hits == s0.cache_hits + 200);
  CHECK(s1.evictions == 0);
  CHECK(s1.cached_blocks == 2);
  CHECK(mock.driver_allocation_count() == driver_calls);

  // On another thread: its own 1 MiB misses once, then 99 hits; counted while it lives and after.
  Worker w;
  REQUIRE(w.run([&] { return fill_and_free(*memory, asks, 100); }) == 0);
  const MemoryStats s2 = memory->stats();
  CHECK(s2.allocations == s1.allocations + 200);
  CHECK(s2.frees == s1.frees + 200);
  CHECK(s2.cache_hits == s1.cache_hits + 199);
  CHECK(mock.driver_allocation_count() == driver_calls + 1);
  w.stop();
  const MemoryStats s3 = memory->stats();
  CHECK(s3.allocations == s2.allocations);
  CHECK(s3.frees == s2.frees);
  CHECK(s3.cache_hits == s2.cache_hits);
  CHECK(s3.cached_blocks == 3);
  check_ledger(*memory, mock, 0);
}

// stats() counts the refusals a caller gets, not the budget's answers that a retry cured.
TEST_CASE_METHOD(CachedMemoryOnMock<16_MiB>,
                 "refusals that eviction or an observer cured are not counted as refusals",
                 "[thread_cache]") {
  // 12 MiB cached (8 MiB blocks have no thread-cache bin: the shared pool keeps them).
  auto a = memory->allocate(MemoryCategory::ndarray, 12_MiB);
  REQUIRE(a);
  REQUIRE(memory->free(*a));
  REQUIRE(memory->stats().cached_bytes == 12_MiB);

  // 8 MiB fits once the cache is evicted: one retry, no refusal.
  auto cured = memory->allocate(MemoryCategory::staging, 8_MiB);
  REQUIRE(cured);
  MemoryStats s = memory->stats();
  CHECK(s.retries == 1);
  CHECK(s.ledger.refusals == 0);

  // An observer that frees the 8 MiB: the 12 MiB request then fits on its retry.
  std::optional<DeviceAllocation> held = *cured;
  const uint64_t id = memory->add_oom_observer([&](const kiln::Failure &) {
    if (held) CHECK(memory->free(*std::exchange(held, std::nullopt)));
  });
  auto blocked = memory->charge(MemoryCategory::code_object, 4_MiB);  // 12 MiB held now
  REQUIRE(blocked);
  auto after_observer = memory->allocate(MemoryCategory::ndarray, 12_MiB);
  REQUIRE(after_observer);
  s = memory->stats();
  CHECK(s.ledger.refusals == 0);

  // A refusal the caller gets is counted once.
  REQUIRE(memory->remove_oom_observer(id));
  auto refused = memory->allocate(MemoryCategory::ndarray, 8_MiB);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().oom_source == OomSource::budget);
  CHECK(memory->stats().ledger.refusals == 1);
  CHECK(memory->stats().live_refusals == 0);
  REQUIRE(memory->free(*after_observer));
  memory->uncharge(MemoryCategory::code_object, 4_MiB);
}
