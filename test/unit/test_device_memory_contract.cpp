// The DeviceMemory contract: what every configuration must keep, one suite instantiated over the
// configurations DeviceMemory offers (as RMM runs one suite for every memory resource). Caching
// off: every free goes back to the device. Caching on: a freed block is kept for reuse, and a
// thread's own reuse takes the lock-free fast path. Fast path closed: caching on with a request
// fault plan armed far away, so every request takes the locked path (device_memory.h: the fast
// path is open only with caching on and no fault plan armed). Behaviours a configuration adds
// have their own files (test_caching_pool.cpp, test_thread_cache_*.cpp).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using namespace kiln::test::memory;

namespace {

struct CachingOff {
  static constexpr bool kCaching = false;
  static BudgetConfig config(uint64_t limit_bytes) { return fixed_limit(limit_bytes); }
  static void set_up(DeviceMemory &) {}
};

struct CachingOn {
  static constexpr bool kCaching = true;
  static BudgetConfig config(uint64_t limit_bytes) { return cached(limit_bytes); }
  static void set_up(DeviceMemory &) {}
};

struct FastPathClosed {
  static constexpr bool kCaching = true;
  static BudgetConfig config(uint64_t limit_bytes) { return cached(limit_bytes); }
  // Armed, so every request is counted under the lock; far away, so none fails.
  static void set_up(DeviceMemory &memory) { memory.fault_plan().fail_nth_allocation(1'000'000); }
};

/// A DeviceMemory of configuration `Config` with `limit_bytes` over a 1 GiB mock.
template <class Config>
struct Contract {
  MockDevice mock{mock_options(1_GiB)};
  std::unique_ptr<DeviceMemory> memory;

  explicit Contract(uint64_t limit_bytes = 100_MiB) {
    auto made = DeviceMemory::create(mock, Config::config(limit_bytes));
    REQUIRE(made);
    memory = std::move(*made);
    Config::set_up(*memory);
  }

  /// A block of `size_bytes` for `category`; fails the test if it is refused.
  DeviceAllocation allocate(MemoryCategory category, uint64_t size_bytes) {
    auto block = memory->allocate(category, size_bytes);
    REQUIRE(block);
    return *block;
  }

  /// The categories add up to the held bytes, which the device holds, and the pool's bytes are
  /// what stats() says is cached.
  void check_ledger_adds_up() {
    const auto by_category = memory->in_use_by_category();
    uint64_t sum = 0;
    for (const uint64_t bytes : by_category) sum += bytes;
    CHECK(sum == memory->in_use_bytes());
    CHECK(memory->in_use_bytes() == mock.held_bytes());
    CHECK(memory->stats().cached_bytes == cached_bytes(*memory));
  }
};

}  // namespace

#define KILN_DEVICE_MEMORY_CONFIGS CachingOff, CachingOn, FastPathClosed

TEMPLATE_TEST_CASE("contract: allocate charges its category, free releases it, release_cached empties",
                   "[device_memory][caching_pool][contract]", KILN_DEVICE_MEMORY_CONFIGS) {
  Contract<TestType> c;
  const DeviceAllocation a = c.allocate(MemoryCategory::ndarray, 1_MiB);
  const DeviceAllocation s = c.allocate(MemoryCategory::staging, 2_MiB);
  CHECK(charged(*c.memory, MemoryCategory::ndarray) == 1_MiB);
  CHECK(charged(*c.memory, MemoryCategory::staging) == 2_MiB);
  c.check_ledger_adds_up();
  REQUIRE(c.memory->free(a));
  REQUIRE(c.memory->free(s));
  CHECK(charged(*c.memory, MemoryCategory::ndarray) == 0);
  CHECK(charged(*c.memory, MemoryCategory::staging) == 0);
  CHECK(cached_bytes(*c.memory) == (TestType::kCaching ? 3_MiB : 0));
  c.check_ledger_adds_up();
  CHECK(c.memory->release_cached() == (TestType::kCaching ? 3_MiB : 0));
  CHECK(c.memory->in_use_bytes() == 0);
  CHECK(c.mock.held_bytes() == 0);
  CHECK(c.mock.live_allocation_count() == 0);
}

TEMPLATE_TEST_CASE("contract: zero_fill hands out zeros, also for a block that held data",
                   "[device_memory][caching_pool][contract]", KILN_DEVICE_MEMORY_CONFIGS) {
  Contract<TestType> c;
  constexpr uint64_t kSize = 64_KiB;
  for (int round = 0; round < 2; ++round) {  // round 1 reuses the block where caching keeps it
    INFO("round " << round);
    auto a = c.memory->allocate(MemoryCategory::ndarray, kSize);
    REQUIRE(a);
    const std::vector<unsigned char> pattern(kSize, 0xAB);
    REQUIRE(c.mock.memcpy_host_to_device(*a, 0, pattern.data(), kSize));
    REQUIRE(c.memory->free(*a));
    auto z = c.memory->allocate(MemoryCategory::ndarray, kSize, /*zero_fill=*/true);
    REQUIRE(z);
    std::vector<unsigned char> back(kSize, 0xFF);
    REQUIRE(c.mock.memcpy_device_to_host(back.data(), *z, 0, kSize));
    CHECK(std::all_of(back.begin(), back.end(), [](unsigned char v) { return v == 0; }));
    REQUIRE(c.memory->free(*z));
  }
}

TEMPLATE_TEST_CASE("contract: 0 bytes, pool_cache and no category are invalid_usage and charge nothing",
                   "[device_memory][caching_pool][contract]", KILN_DEVICE_MEMORY_CONFIGS) {
  Contract<TestType> c;
  const uint64_t queries_before = c.mock.memory_info_count();
  const std::array<std::pair<MemoryCategory, uint64_t>, 3> bad{{
      {MemoryCategory::ndarray, 0},
      {MemoryCategory::pool_cache, 1_MiB},
      {static_cast<MemoryCategory>(250), 1_MiB},
  }};
  for (const auto &[category, size_bytes] : bad) {
    INFO("category " << static_cast<int>(category) << ", " << size_bytes << " bytes");
    auto refused = c.memory->allocate(category, size_bytes);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().result == RhiResult::invalid_usage);
    CHECK(refused.error().result != RhiResult::out_of_memory);
  }
  CHECK(c.memory->in_use_bytes() == 0);
  CHECK(c.mock.driver_allocation_count() == 0);
  CHECK(c.mock.memory_info_count() == queries_before);  // refused before any live check
  CHECK(c.memory->stats().allocations == 0);
}

TEMPLATE_TEST_CASE("contract: a request over the budget is refused by the budget with nothing held",
                   "[device_memory][caching_pool][contract]", KILN_DEVICE_MEMORY_CONFIGS) {
  Contract<TestType> c(10_MiB);
  auto big = c.memory->allocate(MemoryCategory::ndarray, 16_MiB);
  REQUIRE_FALSE(big);
  CHECK(big.error().result == RhiResult::out_of_memory);
  CHECK(big.error().oom_source == OomSource::budget);
  CHECK(c.memory->in_use_bytes() == 0);
  CHECK(c.mock.held_bytes() == 0);
  CHECK(c.mock.driver_allocation_count() == 0);  // the driver was never asked
  CHECK(c.memory->stats().ledger.refusals == 1);
  auto fits = c.memory->allocate(MemoryCategory::ndarray, 8_MiB);  // and the budget still serves
  REQUIRE(fits);
  REQUIRE(c.memory->free(*fits));
}

TEMPLATE_TEST_CASE("contract: a group is all-or-nothing",
                   "[device_memory][caching_pool][contract][group]", KILN_DEVICE_MEMORY_CONFIGS) {
  Contract<TestType> c(10_MiB);
  const std::array<AllocRequest, 3> too_big{{{MemoryCategory::ndarray, 4_MiB},
                                             {MemoryCategory::staging, 4_MiB},
                                             {MemoryCategory::argument_buffer, 4_MiB}}};
  auto refused = c.memory->allocate_group(too_big);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().result == RhiResult::out_of_memory);
  CHECK(c.memory->in_use_bytes() == 0);
  CHECK(c.mock.held_bytes() == 0);
  const std::array<AllocRequest, 3> fits{{{MemoryCategory::ndarray, 2_MiB},
                                          {MemoryCategory::staging, 2_MiB},
                                          {MemoryCategory::argument_buffer, 1_MiB}}};
  auto group = c.memory->allocate_group(fits);
  REQUIRE(group);
  REQUIRE(group->size() == 3);
  CHECK(charged(*c.memory, MemoryCategory::ndarray) == 2_MiB);
  CHECK(charged(*c.memory, MemoryCategory::staging) == 2_MiB);
  CHECK(charged(*c.memory, MemoryCategory::argument_buffer) == 1_MiB);
  c.check_ledger_adds_up();
  for (const DeviceAllocation &a : *group) REQUIRE(c.memory->free(a));
  c.memory->release_cached();
  CHECK(c.mock.held_bytes() == 0);
}

TEMPLATE_TEST_CASE("contract: stats count allocations, frees and hits, and the ledger adds up",
                   "[device_memory][caching_pool][contract]", KILN_DEVICE_MEMORY_CONFIGS) {
  Contract<TestType> c;
  for (int round = 0; round < 3; ++round) {
    auto a = c.memory->allocate(MemoryCategory::ndarray, 1_MiB);
    auto b = c.memory->allocate(MemoryCategory::staging, 512_KiB);
    REQUIRE(a);
    REQUIRE(b);
    c.check_ledger_adds_up();
    REQUIRE(c.memory->free(*a));
    REQUIRE(c.memory->free(*b));
    c.check_ledger_adds_up();
  }
  const MemoryStats s = c.memory->stats();
  CHECK(s.allocations == 6);
  CHECK(s.frees == 6);
  CHECK(s.cache_hits == (TestType::kCaching ? 4 : 0));  // rounds 2 and 3 reuse both blocks
  CHECK(s.lock_free_hits <= s.cache_hits);
  if (std::is_same_v<TestType, FastPathClosed>) CHECK(s.lock_free_hits == 0);
  CHECK(c.mock.driver_allocation_count() == (TestType::kCaching ? 2 : 6));
  CHECK(s.ledger.peak_total_bytes == 1_MiB + 512_KiB);
}

TEMPLATE_TEST_CASE("contract: a second free is invalid_usage and changes nothing",
                   "[device_memory][caching_pool][contract]", KILN_DEVICE_MEMORY_CONFIGS) {
  Contract<TestType> c;
  const DeviceAllocation keep = c.allocate(MemoryCategory::ndarray, 2_MiB);
  const DeviceAllocation a = c.allocate(MemoryCategory::ndarray, 2_MiB);
  REQUIRE(c.memory->free(a));
  const auto ledger = c.memory->in_use_by_category();
  auto again = c.memory->free(a);
  REQUIRE_FALSE(again);
  CHECK(again.error().result == RhiResult::invalid_usage);
  CHECK(again.error().device == "mock");
  CHECK(c.memory->in_use_by_category() == ledger);
  CHECK(charged(*c.memory, MemoryCategory::ndarray) == 2_MiB);
  CHECK(c.memory->stats().frees == 1);
  CHECK(c.memory->stats().cached_blocks == (TestType::kCaching ? 1 : 0));  // not put twice
  CHECK(c.mock.held_bytes() == (TestType::kCaching ? 4_MiB : 2_MiB));

  // A block made on the device directly (not through DeviceMemory) is not freed here either.
  kiln::LlvmRuntimeAllocParams params;
  params.size_bytes = 1_MiB;
  auto raw = c.mock.allocate_runtime(params);
  REQUIRE(raw);
  auto foreign = c.memory->free(*raw);
  REQUIRE_FALSE(foreign);
  CHECK(foreign.error().result == RhiResult::invalid_usage);
  CHECK(c.memory->in_use_by_category() == ledger);
  CHECK(c.memory->in_use_bytes() == (TestType::kCaching ? 4_MiB : 2_MiB));
  CHECK(c.mock.live_allocation_count() == (TestType::kCaching ? 3 : 2));  // keep, (a,) raw
  REQUIRE(c.mock.dealloc_memory(*raw));

  // The freed block is handed out once, not twice.
  auto b = c.memory->allocate(MemoryCategory::ndarray, 2_MiB);
  auto d = c.memory->allocate(MemoryCategory::ndarray, 2_MiB);
  REQUIRE(b);
  REQUIRE(d);
  CHECK(*b != *d);
  CHECK(c.memory->stats().cache_hits == (TestType::kCaching ? 1 : 0));
  for (const DeviceAllocation &x : {keep, *b, *d}) REQUIRE(c.memory->free(x));
  c.memory->release_cached();
  CHECK(c.mock.held_bytes() == 0);
}
