// Growth checks the device's live free memory: what no longer fits in free - reserve is refused by
// the budget (so other processes' growth is refused by kiln before the driver is asked), with
// live_check off the driver refuses it, another thread's allocation in the gap is seen, and a live
// refusal carries the reserve it keeps.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

namespace {

/// The reserve the stepped tests keep free for other processes.
constexpr uint64_t kReserve = 64_MiB;

/// A mock of `capacity_bytes` whose other processes use steps[k].other_bytes when request k asks
/// (the script's first value is consumed by create()).
template <class Steps>
MockDeviceOptions other_processes_by_step(uint64_t capacity_bytes, const Steps &steps) {
  std::vector<uint64_t> script{0};
  for (const auto &step : steps) script.push_back(step.other_bytes);
  return mock_options(capacity_bytes, std::move(script));
}

}  // namespace

TEST_CASE("as other processes grow, every request beyond free - reserve is refused by the budget",
          "[caching_pool][live]") {
  constexpr uint64_t kCapacity = 1_GiB;
  struct Step {
    uint64_t other_bytes;  // what other processes use when this request asks
    uint64_t size_bytes;   // a whole size class, so the ledger and the driver see the same bytes
  };
  // held grows by each granted request; free = 1 GiB - held - other.
  const std::array<Step, 10> steps{{
      {0, 64_MiB},        // usable 960 MiB
      {100_MiB, 96_MiB},  // usable 796 MiB
      {300_MiB, 128_MiB},
      {400_MiB, 160_MiB},
      {420_MiB, 128_MiB},  // free 156 MiB: the driver would accept, the reserve would be gone
      {420_MiB, 40_MiB},
      {450_MiB, 48_MiB},  // free 86 MiB, usable 22 MiB
      {470_MiB, 512_KiB},
      {500_MiB, 512_KiB},  // free 35.5 MiB: below the reserve
      {1_GiB, 512_KiB},    // nothing free at all
  }};
  MockDevice mock(other_processes_by_step(kCapacity, steps));
  auto memory = make_memory(mock, cached(kCapacity, kReserve));  // the ledger alone never refuses

  std::vector<DeviceAllocation> held;
  uint64_t held_bytes = 0, refusals = 0, refusals_the_driver_would_grant = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    const Step &s = steps[i];
    CAPTURE(i, s.other_bytes, s.size_bytes);
    REQUIRE(CachingPool::size_class(s.size_bytes) == s.size_bytes);
    const uint64_t free_bytes =
        kCapacity > held_bytes + s.other_bytes ? kCapacity - held_bytes - s.other_bytes : 0;
    const bool fits = free_bytes >= kReserve && s.size_bytes <= free_bytes - kReserve;
    const uint64_t driver_calls = mock.driver_allocation_count();
    auto a = memory->allocate(MemoryCategory::ndarray, s.size_bytes);
    if (fits) {
      REQUIRE(a);
      held.push_back(*a);
      held_bytes += s.size_bytes;
      continue;
    }
    ++refusals;
    if (s.size_bytes <= free_bytes) ++refusals_the_driver_would_grant;
    REQUIRE_FALSE(a);
    CHECK(a.error().result == RhiResult::out_of_memory);
    CHECK(a.error().oom_source == OomSource::budget);
    CHECK(a.error().requested_bytes == s.size_bytes);
    CHECK(a.error().memory.free_bytes == free_bytes);
    CHECK(mock.driver_allocation_count() == driver_calls);  // the driver was never asked
  }
  CHECK(refusals == 4);
  CHECK(refusals_the_driver_would_grant == 3);
  CHECK(held.size() == 6);
  CHECK(mock.driver_oom_count() == 0);
  CHECK(memory->stats().live_refusals == refusals);
  CHECK(memory->stats().driver_ooms == 0);
  CHECK(mock.held_bytes() == held_bytes);
  CHECK(memory->in_use_bytes() == held_bytes);
  for (DeviceAllocation a : held) REQUIRE(memory->free(a));
}

TEST_CASE("live check: growth that no longer fits in free - reserve is refused by the budget",
          "[device_memory][live]") {
  constexpr uint64_t kSize = 128_MiB;
  struct Step {
    uint64_t other_bytes;  // what other processes use when this allocation asks
    bool fits;
  };
  // held grows by 128 MiB per success; free = 1 GiB - held - other.
  const std::array<Step, 6> steps{{
      {0, true},          // free 1024 MiB
      {256_MiB, true},    // free 640 MiB
      {512_MiB, true},    // free 256 MiB
      {450_MiB, false},   // free 190 MiB: the driver would accept, the reserve would not be kept
      {768_MiB, false},   // free 0 (other processes outgrew us)
      {0, true},          // they went away again
  }};
  MockDevice mock(other_processes_by_step(1_GiB, steps));
  // A limit of 1 GiB: the ledger alone would allow every step.
  auto memory = make_uncached_memory(mock, fixed_limit(1_GiB, /*reserve_bytes=*/kReserve));

  std::vector<DeviceAllocation> held;
  uint64_t refusals = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    CAPTURE(i, steps[i].other_bytes);
    const uint64_t ledger_before = memory->in_use_bytes();
    auto a = memory->allocate(MemoryCategory::ndarray, kSize);
    if (steps[i].fits) {
      REQUIRE(a);
      held.push_back(*a);
      continue;
    }
    REQUIRE_FALSE(a);
    ++refusals;
    const kiln::Failure &f = a.error();
    CHECK(f.result == RhiResult::out_of_memory);
    CHECK(f.oom_source == OomSource::budget);
    CHECK(f.requested_bytes == kSize);
    CHECK(f.device == "mock");
    CHECK(std::string_view(f.site) == "BudgetAdaptor::check_live_free");
    REQUIRE(f.has_memory);
    CHECK(f.memory.total_bytes == 1_GiB);
    CHECK(f.memory.free_bytes ==
          (1_GiB > held.size() * kSize + steps[i].other_bytes
               ? 1_GiB - held.size() * kSize - steps[i].other_bytes
               : 0));
    // The ledger still had room: only the live check could have refused.
    CHECK(ledger_before + kSize <= memory->limit_bytes());
    CHECK(memory->in_use_bytes() == ledger_before);
    CHECK(f.message().find(kiln::format_bytes(kSize)) != std::string::npos);
  }
  CHECK(refusals == 2);
  CHECK(held.size() == 4);
  CHECK(mock.driver_oom_count() == 0);
  CHECK(memory->stats().live_refusals == 2);
  CHECK(memory->stats().live_checks == steps.size());
  CHECK(mock.held_bytes() == 4 * kSize);
  for (DeviceAllocation a : held) REQUIRE(memory->free(a));
}

TEST_CASE("with live_check off the same growth reaches the driver and the driver refuses it",
          "[device_memory][live]") {
  constexpr uint64_t kSize = 128_MiB;
  MockDevice mock(mock_options(1_GiB));
  BudgetConfig config = no_cache();
  config.limit_bytes = 1_GiB;
  config.reserve_bytes = 64_MiB;
  config.live_check = false;
  auto memory = make_uncached_memory(mock, config);

  std::vector<DeviceAllocation> held;
  for (int i = 0; i < 3; ++i) {
    auto a = memory->allocate(MemoryCategory::ndarray, kSize);
    REQUIRE(a);
    held.push_back(*a);
  }
  mock.set_other_process_bytes(768_MiB);  // free is now 0
  const uint64_t calls = mock.driver_allocation_count();
  auto refused = memory->allocate(MemoryCategory::ndarray, kSize);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().result == RhiResult::out_of_memory);
  CHECK(refused.error().oom_source == OomSource::driver);
  CHECK(refused.error().driver_status == std::string_view("MOCK_ERROR_OUT_OF_MEMORY"));
  CHECK(mock.driver_allocation_count() == calls + 1);
  CHECK(mock.driver_oom_count() == 1);
  CHECK(memory->stats().driver_ooms == 1);
  CHECK(memory->stats().live_checks == 0);
  CHECK(memory->in_use_bytes() == 3 * kSize);  // the reservation was given back
  for (DeviceAllocation a : held) REQUIRE(memory->free(a));
  CHECK(memory->in_use_bytes() == 0);
}

TEST_CASE("growth that another thread's allocation no longer leaves room for is refused",
          "[device_memory][threads][recheck]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(10_MiB));
  std::optional<DeviceAllocation> taken;
  auto gap = std::make_unique<InTheBudgetGap>(*memory, [&] {
    auto alloc = memory->allocate(MemoryCategory::ndarray, 8_MiB);
    if (alloc) taken = *alloc;
  });

  auto first = memory->allocate(MemoryCategory::ndarray, 8_MiB);

  REQUIRE(gap->fired());
  REQUIRE(taken.has_value());  // the other thread got in first
  REQUIRE_FALSE(first.has_value());
  CHECK(first.error().result == RhiResult::out_of_memory);
  CHECK(first.error().oom_source == OomSource::budget);
  CHECK(first.error().requested_bytes == 8_MiB);
  CHECK(memory->in_use_bytes() == 8_MiB);  // never past the 10 MiB limit
  CHECK(charged(*memory, MemoryCategory::ndarray) == 8_MiB);
  CHECK(mock.held_bytes() == 8_MiB);  // the driver was asked once
  gap.reset();
  CHECK(memory->free(*taken));
  CHECK(memory->in_use_bytes() == 0);
}

TEST_CASE("a live refusal carries the reserve it keeps and is counted as a live refusal",
          "[device_memory][live]") {
  // 1 GiB device; other processes hold 924 MiB from the first allocation on: 100 MiB free.
  MockDevice mock(mock_options(1_GiB, {0, 924_MiB}));
  // A limit of 1 GiB: the limit alone would allow it.
  auto memory = make_uncached_memory(mock, fixed_limit(1_GiB, /*reserve_bytes=*/40_MiB));
  auto refused = memory->allocate(MemoryCategory::ndarray, 80_MiB);  // 80 > 100 - 40
  REQUIRE_FALSE(refused);
  const kiln::Failure &f = refused.error();
  CHECK(f.oom_source == OomSource::budget);
  REQUIRE(f.has_memory);
  CHECK(f.memory.reserve_bytes == 40_MiB);
  CHECK(f.memory.free_bytes == 100_MiB);
  CHECK(f.requested_bytes + f.memory.reserve_bytes > f.memory.free_bytes);  // figures agree
  const auto stats = memory->stats();
  CHECK(stats.live_refusals == 1);
  CHECK(stats.ledger.refusals == 0);  // not a refusal by the limit
}
