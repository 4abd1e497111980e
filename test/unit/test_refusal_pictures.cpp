// What a refusal says: the requested bytes and the budget, a memory picture that does not count the
// refused request as held, a device reading reused within one tick by budget refusals and taken
// anew by driver refusals, a picture kept when the device query fails.
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

TEST_CASE("an out-of-memory message names the requested bytes and the budget",
          "[device_memory]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(10_MiB));
  auto a = memory->allocate(MemoryCategory::ndarray, 7_MiB);
  REQUIRE(a);
  auto refused = memory->allocate(MemoryCategory::staging, 5_MiB);
  REQUIRE_FALSE(refused);
  const std::string message = refused.error().message();
  CAPTURE(message);
  CHECK(message.find(kiln::format_bytes(5_MiB)) != std::string::npos);
  CHECK(message.find("budget " + kiln::format_bytes(10_MiB)) != std::string::npos);
  CHECK(message.find(kiln::format_bytes(3_MiB) + " left") != std::string::npos);
  CHECK(message.find("mock") != std::string::npos);
  // The memory layer names no knob: the interface layer's advice does (test_refusal_messages).
  CHECK(message.find("KILN_POOL_LIMIT_MB") == std::string::npos);
  REQUIRE(memory->free(*a));
}

// A refusal's memory picture is taken after the refused request's reservation is given back.
TEST_CASE("a live refusal's memory picture does not count the refused request as held",
          "[device_memory][live]") {
  MockDevice mock(mock_options(1_GiB, {0, 900_MiB}));
  auto memory = make_uncached_memory(mock, fixed_limit(1_GiB, /*reserve_bytes=*/64_MiB));
  auto refused = memory->allocate(MemoryCategory::ndarray, 128_MiB);
  REQUIRE_FALSE(refused);
  REQUIRE(refused.error().oom_source == OomSource::budget);
  CAPTURE(refused.error().message());
  CHECK(memory->in_use_bytes() == 0);
  CHECK(refused.error().memory.in_use_total_bytes() == 0);
}

TEST_CASE("a driver refusal's memory picture does not count the refused request as held",
          "[device_memory]") {
  MockDevice mock(mock_options(1_GiB));
  BudgetConfig config = no_cache();
  config.limit_bytes = 1_GiB;
  config.live_check = false;
  auto memory = make_uncached_memory(mock, config);
  auto held = memory->allocate(MemoryCategory::ndarray, 256_MiB);
  REQUIRE(held);
  mock.set_other_process_bytes(768_MiB);
  auto refused = memory->allocate(MemoryCategory::staging, 128_MiB);
  REQUIRE_FALSE(refused);
  REQUIRE(refused.error().oom_source == OomSource::driver);
  CAPTURE(refused.error().message());
  CHECK(refused.error().memory.in_use_total_bytes() == 256_MiB);
  CHECK(refused.error().memory.in_use_bytes[static_cast<std::size_t>(MemoryCategory::staging)] ==
        0);
  REQUIRE(memory->free(*held));
}

// Growth asks the driver for a request's size class, but the refusal is about the request: it
// names the bytes the caller asked for (the driver builds the failure from them), not the class.
TEST_CASE("a driver refusal names the bytes requested and not the size class asked of the driver",
          "[device_memory][caching_pool]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(512_MiB));
  const uint64_t size_bytes = 5_MiB + 1;
  REQUIRE(CachingPool::size_class(size_bytes) > size_bytes);  // grown at a larger class
  mock.fault_plan().fail_nth_allocation(1);  // the driver refuses the class (injected: no retry)
  auto refused = memory->allocate(MemoryCategory::ndarray, size_bytes);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().oom_source == OomSource::driver);
  CHECK(refused.error().requested_bytes == size_bytes);
  CHECK(refused.error().class_bytes == 0);  // no exact-size try followed: no class refused first
  CHECK(memory->in_use_bytes() == 0);
}

// A budget refusal is the ledger's verdict; the device's free/total only complete its picture.
// They come from a reading at most one kernel tick old (DeviceMemory::kLiveReadingReuse), so
// refusing in a loop does not ask the device each time; anything older is read again.
TEST_CASE("budget refusals reuse a live reading of this tick and read again once it is older",
          "[device_memory][live]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(10_MiB));
  const uint64_t queries_before = mock.memory_info_count();
  const uint64_t refusals_before = memory->stats().ledger.refusals;
  constexpr int kRefusals = 200;
  uint64_t fresh = 0;  // refusals whose reading was taken for them (age 0)
  for (int i = 0; i < kRefusals; ++i) {
    auto refused = memory->allocate(MemoryCategory::ndarray, 20_MiB);
    REQUIRE_FALSE(refused);
    REQUIRE(refused.error().oom_source == OomSource::budget);
    REQUIRE(refused.error().has_memory);
    // A reused reading says how old it may be: at least 1 ms, at most a tick (<= 10 ms).
    fresh += refused.error().memory.live_age_ms == 0;
    CHECK(refused.error().memory.live_age_ms <= 10);
    CHECK(refused.error().memory.total_bytes == 1_GiB);
    CHECK(refused.error().memory.free_bytes == 1_GiB);
    CHECK(refused.error().memory.limit_bytes == 10_MiB);
    CHECK(refused.error().device == "mock");
  }
  CHECK(memory->stats().ledger.refusals == refusals_before + kRefusals);
  // A few ticks may pass during the loop; every refusal asking would make it kRefusals.
  CHECK(mock.memory_info_count() - queries_before < 10);
  CHECK(fresh == mock.memory_info_count() - queries_before);

  // Other processes grow; once the reading is older than the reuse window the next refusal sees it.
  mock.set_other_process_bytes(512_MiB);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // past any kernel tick (HZ >= 100)
  auto refused = memory->allocate(MemoryCategory::ndarray, 20_MiB);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().memory.free_bytes == 512_MiB);
  CHECK(refused.error().memory.live_age_ms == 0);
}

TEST_CASE("a driver refusal reads the device now, not a budget refusal's reading",
          "[device_memory][live]") {
  MockDevice mock(mock_options(1_GiB));
  BudgetConfig config = fixed_limit(1_GiB);
  config.live_check = false;
  auto memory = make_uncached_memory(mock, config);
  REQUIRE_FALSE(memory->allocate(MemoryCategory::ndarray, 2_GiB));  // a reading: 1 GiB free
  mock.set_other_process_bytes(960_MiB);
  auto refused = memory->allocate(MemoryCategory::ndarray, 128_MiB);
  REQUIRE_FALSE(refused);
  REQUIRE(refused.error().oom_source == OomSource::driver);
  CHECK(refused.error().memory.free_bytes == 64_MiB);
  CHECK(refused.error().memory.live_age_ms == 0);
}

// When the device cannot say how much memory it has free, a refusal still names what kiln
// knows (limit, bytes held per category), and the live check refuses growth it cannot check.
TEST_CASE("a failing device query: the budget refusal keeps its picture, growth is refused",
          "[device_memory][live]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(10_MiB));
  auto held = memory->allocate(MemoryCategory::ndarray, 4_MiB);
  REQUIRE(held);
  mock.fail_memory_info(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // no reading of this tick left

  auto refused = memory->allocate(MemoryCategory::ndarray, 20_MiB);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().oom_source == OomSource::budget);
  CHECK(refused.error().has_memory);
  CHECK_FALSE(refused.error().memory.device_read);  // unknown, not made up
  CHECK(refused.error().memory.limit_bytes == 10_MiB);
  CHECK(refused.error().memory.in_use_total_bytes() == 4_MiB);
  const std::string message = refused.error().message();
  CAPTURE(message);
  CHECK_THAT(message, Catch::Contains("budget"));
  CHECK_THAT(message, Catch::Contains("free memory could not be read; kiln holds 4.00 MiB"));
  CHECK_THAT(message, !Catch::Contains("0 B free of 0 B"));

  auto grow = memory->allocate(MemoryCategory::ndarray, 2_MiB);  // fits the budget: asks
  REQUIRE_FALSE(grow);
  CHECK(grow.error().result == RhiResult::error);
  CHECK(std::string(grow.error().driver_status) == "MOCK_ERROR_UNKNOWN");
  // Says what it was doing: the query answers no allocation of its own.
  CHECK_THAT(grow.error().message(),
             Catch::Contains("reading free device memory before growing 2.00 MiB for ndarray"));
  const std::array<AllocRequest, 2> group{{{MemoryCategory::staging, 1_MiB},
                                           {MemoryCategory::ndarray, 1_MiB}}};
  auto grow_group = memory->allocate_group(group);  // a group's growth names the group
  REQUIRE_FALSE(grow_group);
  CHECK(grow_group.error().result == RhiResult::error);
  CHECK_THAT(grow_group.error().message(),
             Catch::Contains("before growing 2.00 MiB for a group of 2 buffers"));
  CHECK(memory->in_use_bytes() == 4_MiB);  // nothing held for it

  mock.fail_memory_info(false);
  auto fine = memory->allocate(MemoryCategory::ndarray, 2_MiB);
  REQUIRE(fine);
  REQUIRE(memory->free(*fine));
  REQUIRE(memory->free(*held));
  CHECK(memory->in_use_bytes() == 0);
  CHECK(mock.held_bytes() == 0);
}
