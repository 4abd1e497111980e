// DeviceMemory over a MockDevice with the caching pool off: every allocation is charged to its
// category and every free released, charge and uncharge account bytes outside device allocations
// (0 bytes and a double free, in every configuration: test_device_memory_contract.cpp). The other behaviours have their own files: limit,
// live free memory, groups, refusal pictures, observers, fault plan, stats.
#include <catch2/catch.hpp>

#include <cstdint>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

TEST_CASE("allocate charges its category and free releases it", "[device_memory]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(100_MiB));
  auto a = memory->allocate(MemoryCategory::staging, 3_MiB);
  auto b = memory->allocate(MemoryCategory::argument_buffer, 1_MiB, /*zero_fill=*/true);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(charged(*memory, MemoryCategory::staging) == 3_MiB);
  CHECK(charged(*memory, MemoryCategory::argument_buffer) == 1_MiB);
  CHECK(memory->in_use_bytes() == 4_MiB);
  CHECK(mock.held_bytes() == 4_MiB);
  CHECK(memory->stats().allocations == 2);

  REQUIRE(memory->free(*a));
  CHECK(charged(*memory, MemoryCategory::staging) == 0);
  CHECK(memory->in_use_bytes() == 1_MiB);
  CHECK(mock.held_bytes() == 1_MiB);
  REQUIRE(memory->free(*b));
  CHECK(memory->in_use_bytes() == 0);
  CHECK(mock.held_bytes() == 0);
  CHECK(mock.live_allocation_count() == 0);
  CHECK(memory->stats().frees == 2);
  CHECK(memory->stats().ledger.peak_total_bytes == 4_MiB);
}

TEST_CASE("charge and uncharge account bytes outside device allocations", "[device_memory]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(10_MiB));
  REQUIRE(memory->charge(MemoryCategory::code_object, 6_MiB));
  CHECK(charged(*memory, MemoryCategory::code_object) == 6_MiB);
  CHECK(mock.held_bytes() == 0);  // nothing was allocated on the device

  // The charge takes room from allocations.
  auto refused = memory->allocate(MemoryCategory::ndarray, 5_MiB);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().oom_source == OomSource::budget);
  auto over = memory->charge(MemoryCategory::code_object, 5_MiB);
  REQUIRE_FALSE(over);
  CHECK(over.error().result == RhiResult::out_of_memory);
  CHECK(over.error().oom_source == OomSource::budget);
  CHECK(over.error().device == "mock");
  CHECK(charged(*memory, MemoryCategory::code_object) == 6_MiB);

  memory->uncharge(MemoryCategory::code_object, 6_MiB);
  CHECK(memory->in_use_bytes() == 0);
  auto fits = memory->allocate(MemoryCategory::ndarray, 5_MiB);
  REQUIRE(fits);
  REQUIRE(memory->free(*fits));
}
