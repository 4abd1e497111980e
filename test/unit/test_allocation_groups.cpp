// DeviceMemory::allocate_group is all-or-nothing: when a member fails at the driver, and when the
// group mixes cache hits and growth (the hits go back to the pool).
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

TEST_CASE("a group mixing cache hits and growth is all-or-nothing, the hits go back to the pool",
          "[caching_pool][fault]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  warm_pool(*memory, 1_MiB, 1);
  warm_pool(*memory, 2_MiB, 1);
  auto existing = memory->allocate(MemoryCategory::ndarray, 5_MiB);
  REQUIRE(existing);
  const auto ledger_before = memory->in_use_by_category();
  const uint64_t held_before = mock.held_bytes();
  const uint64_t live_before = mock.live_allocation_count();
  REQUIRE(memory->stats().cached_blocks == 2);

  const std::array<AllocRequest, 4> group{{{MemoryCategory::staging, 1_MiB},          // hit
                                           {MemoryCategory::argument_buffer, 3_MiB},  // miss
                                           {MemoryCategory::result_buffer, 2_MiB},    // hit
                                           {MemoryCategory::runtime_heap, 6_MiB}}};   // miss

  auto check_unchanged = [&] {
    CHECK(memory->in_use_by_category() == ledger_before);
    CHECK(mock.held_bytes() == held_before);
    CHECK(mock.live_allocation_count() == live_before);
    CHECK(memory->stats().cached_blocks == 2);
    CHECK(memory->stats().cached_bytes == 3_MiB);
    CHECK(memory->stats().cache_hits == 0);
  };

  SECTION("the driver refuses the second growth member") {
    mock.fault_plan().fail_nth_allocation(2);
    auto failed = memory->allocate_group(group);
    REQUIRE_FALSE(failed);
    CHECK(failed.error().result == RhiResult::out_of_memory);
    CHECK(failed.error().oom_source == OomSource::driver);
    CHECK(failed.error().category == MemoryCategory::runtime_heap);
    // The driver refused one block: its figures, not the group's (only budget refusals widen).
    CHECK(failed.error().requested_bytes == 6_MiB);
    CHECK_THAT(failed.error().message(), !Catch::Contains("granted together"));
    CHECK(mock.fault_plan().allocation_count() == 2);
    check_unchanged();
  }
  SECTION("DeviceMemory's fault plan refuses the third member, a hit") {
    memory->fault_plan().fail_nth_allocation(3);
    auto failed = memory->allocate_group(group);
    REQUIRE_FALSE(failed);
    CHECK(failed.error().oom_source == OomSource::driver);
    CHECK(failed.error().category == MemoryCategory::result_buffer);
    check_unchanged();
  }
  SECTION("the budget refuses the growth") {
    memory->set_limit_bytes(memory->in_use_bytes() + 8_MiB);  // growth is 9 MiB
    auto failed = memory->allocate_group(group);
    REQUIRE_FALSE(failed);
    CHECK(failed.error().oom_source == OomSource::budget);
    // The whole group: 9 MiB of growth and the 3 MiB of hits, which went back to the cache.
    CHECK(failed.error().requested_bytes == 12_MiB);
    CHECK_THAT(failed.error().message(), Catch::Contains("4 buffers granted together, 2 of them, 3.00 MiB"));
    check_unchanged();
  }

  // With no fault the same group succeeds, reusing both cached blocks.
  mock.fault_plan().clear();
  memory->fault_plan().clear();
  memory->set_limit_bytes(100_MiB);
  auto ok = memory->allocate_group(group);
  REQUIRE(ok);
  REQUIRE(ok->size() == 4);
  CHECK(memory->stats().cache_hits == 2);
  CHECK(memory->stats().cached_blocks == 0);
  CHECK(charged(*memory, MemoryCategory::staging) == 1_MiB);
  CHECK(charged(*memory, MemoryCategory::result_buffer) == 2_MiB);
  CHECK(charged(*memory, MemoryCategory::argument_buffer) == 3_MiB);
  CHECK(charged(*memory, MemoryCategory::runtime_heap) == 6_MiB);
  CHECK(memory->in_use_bytes() == mock.held_bytes());
  for (DeviceAllocation a : *ok) REQUIRE(memory->free(a));
  REQUIRE(memory->free(*existing));
}

TEST_CASE("allocate_group is all-or-nothing when a member fails at the driver",
          "[device_memory]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(100_MiB));
  auto existing = memory->allocate(MemoryCategory::ndarray, 5_MiB);
  REQUIRE(existing);
  const auto ledger_before = memory->in_use_by_category();
  const uint64_t held_before = mock.held_bytes();
  const uint64_t live_before = mock.live_allocation_count();

  const std::array<AllocRequest, 3> group{{{MemoryCategory::staging, 2_MiB},
                                           {MemoryCategory::argument_buffer, 1_MiB},
                                           {MemoryCategory::result_buffer, 1_MiB}}};
  mock.fault_plan().fail_nth_allocation(2);
  auto failed = memory->allocate_group(group);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().result == RhiResult::out_of_memory);
  CHECK(failed.error().oom_source == OomSource::driver);
  CHECK(failed.error().category == MemoryCategory::argument_buffer);
  CHECK(failed.error().device == "mock");
  CHECK(failed.error().has_memory);
  CHECK(mock.fault_plan().allocation_count() == 2);  // the third member was never tried

  CHECK(memory->in_use_by_category() == ledger_before);
  CHECK(mock.held_bytes() == held_before);
  CHECK(mock.live_allocation_count() == live_before);
  CHECK(memory->stats().driver_ooms == 1);

  SECTION("the same group succeeds once the fault is gone and is freed member by member") {
    mock.fault_plan().clear();
    auto ok = memory->allocate_group(group);
    REQUIRE(ok);
    REQUIRE(ok->size() == 3);
    CHECK(charged(*memory, MemoryCategory::staging) == 2_MiB);
    CHECK(charged(*memory, MemoryCategory::argument_buffer) == 1_MiB);
    CHECK(charged(*memory, MemoryCategory::result_buffer) == 1_MiB);
    for (DeviceAllocation a : *ok) REQUIRE(memory->free(a));
    CHECK(memory->in_use_by_category() == ledger_before);
  }
  SECTION("a group over the budget is refused before any member is allocated") {
    const uint64_t calls = mock.driver_allocation_count();
    const std::array<AllocRequest, 2> big{{{MemoryCategory::staging, 50_MiB},
                                           {MemoryCategory::ndarray, 50_MiB}}};
    auto refused = memory->allocate_group(big);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().oom_source == OomSource::budget);
    CHECK(refused.error().requested_bytes == 100_MiB);
    CHECK(mock.driver_allocation_count() == calls);
    CHECK(memory->in_use_by_category() == ledger_before);
  }
  REQUIRE(memory->free(*existing));
}

TEST_CASE("a group no eviction could fit is refused outright, named as a whole, nothing asked",
          "[caching_pool][group][refusal]") {
  // The group takes the single allocation's path: no hit, and even the exact sizes exceed what
  // the limit leaves beside what eviction cannot give back.
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(64_MiB));
  warm_pool(*memory, 1_MiB, 1);  // 1 MiB cached: evictable, so not part of the refusal
  auto held = memory->allocate(MemoryCategory::ndarray, 40_MiB);
  REQUIRE(held);
  const uint64_t calls = mock.driver_allocation_count();
  const std::array<AllocRequest, 2> group{{{MemoryCategory::staging, 10_MiB + 1},
                                           {MemoryCategory::ndarray, 15_MiB}}};
  auto refused = memory->allocate_group(group);
  REQUIRE_FALSE(refused);
  const Failure &f = refused.error();
  INFO(f.message());
  CHECK(std::string_view(f.site) == "BudgetAdaptor::refused_outright");
  CHECK(f.budget_check == kiln::BudgetCheck::limit);
  CHECK(f.category == MemoryCategory::staging);  // the first miss names the refusal
  CHECK(f.requested_bytes == 25_MiB + 1);
  CHECK(f.class_bytes == CachingPool::size_class(10_MiB + 1) + CachingPool::size_class(15_MiB));
  CHECK(f.memory.in_use_bytes[static_cast<size_t>(MemoryCategory::ndarray)] == 40_MiB);
  CHECK(mock.driver_allocation_count() == calls);
  CHECK(memory->stats().cached_blocks == 1);  // nothing was evicted for it
  CHECK(memory->stats().ledger.refusals == 1);
  REQUIRE(memory->free(*held));
}

TEST_CASE("a stale free of a group's cache hit while the group grows is refused as not live",
          "[caching_pool][group][threads]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  auto first = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  REQUIRE(first);
  REQUIRE(memory->free(*first));  // cached; its caller keeps the handle by mistake
  // Another thread frees the stale handle while the group that reuses its block grows.
  std::optional<RhiStatus> stale_free;
  auto gap = std::make_unique<InTheBudgetGap>(*memory, [&] { stale_free = memory->free(*first); });
  const std::array<AllocRequest, 2> group{{{MemoryCategory::ndarray, 1_MiB},     // the hit
                                           {MemoryCategory::staging, 3_MiB}}};   // grows

  auto check_refused_stale_free = [&] {
    REQUIRE(stale_free.has_value());  // the other thread ran in the gap
    REQUIRE_FALSE(*stale_free);
    CHECK(stale_free->error().result == RhiResult::invalid_usage);
    CHECK_THAT(stale_free->error().message(), Catch::Contains("not live here"));
  };

  SECTION("the group is granted: the block is the group's, live, and freed once") {
    auto granted = memory->allocate_group(group);
    gap.reset();
    REQUIRE(granted);
    check_refused_stale_free();
    const DeviceAllocation hit = (*granted)[0];
    CHECK(hit.alloc_id == first->alloc_id);
    CHECK(charged(*memory, MemoryCategory::ndarray) == 1_MiB);
    CHECK(memory->stats().cached_blocks == 0);
    REQUIRE(memory->free(hit));
    CHECK_FALSE(memory->free(hit));
    REQUIRE(memory->free((*granted)[1]));
  }
  SECTION("the group is refused: the hit goes back to the cache once") {
    mock.fault_plan().fail_nth_allocation(1);  // the driver refuses the growth, after the budget
    auto refused = memory->allocate_group(group);
    gap.reset();
    REQUIRE_FALSE(refused);
    CHECK(refused.error().oom_source == OomSource::driver);
    check_refused_stale_free();
    CHECK(memory->stats().cached_blocks == 1);
    CHECK(cached_bytes(*memory) == 1_MiB);
    CHECK(charged(*memory, MemoryCategory::ndarray) == 0);
    // Handed out once: two allocations of its size get two blocks.
    auto a = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    auto b = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    REQUIRE(a);
    REQUIRE(b);
    CHECK(a->alloc_id != b->alloc_id);
    REQUIRE(memory->free(*a));
    REQUIRE(memory->free(*b));
  }
  CHECK(memory->in_use_bytes() == mock.held_bytes());
}

TEST_CASE("a group's driver refusal on the exact-size try names the refused block's own class",
          "[caching_pool][group][refusal]") {
  // Both members round up; the device has room for the exact sizes but not the classes, so the
  // exact try runs and the driver refuses its second block.
  const uint64_t a_bytes = 3_MiB + 1, b_bytes = 2_MiB + 1;
  const uint64_t a_class = CachingPool::size_class(a_bytes);
  const uint64_t b_class = CachingPool::size_class(b_bytes);
  REQUIRE(a_class > a_bytes);
  REQUIRE(b_class > b_bytes);
  const uint64_t capacity_bytes = (a_bytes + b_bytes + a_class + b_class) / 2;
  MockDevice mock(mock_options(capacity_bytes));
  auto memory = make_memory(mock, cached(1_GiB, 0, /*live_check=*/false));
  const std::array<AllocRequest, 2> group{{{MemoryCategory::staging, a_bytes},
                                           {MemoryCategory::ndarray, b_bytes}}};
  // Driver calls: the classes (the second does not fit), then the exact sizes (the second fails).
  mock.fault_plan().fail_nth_allocation(4);
  auto refused = memory->allocate_group(group);
  REQUIRE_FALSE(refused);
  const Failure &f = refused.error();
  INFO(f.message());
  CHECK(f.oom_source == OomSource::driver);
  CHECK(f.category == MemoryCategory::ndarray);
  CHECK(f.requested_bytes == b_bytes);
  CHECK(f.class_bytes == b_class);  // its own class, not the group's
  CHECK(mock.fault_plan().allocation_count() == 4);
  CHECK(memory->in_use_bytes() == 0);
  CHECK(mock.held_bytes() == 0);
}
