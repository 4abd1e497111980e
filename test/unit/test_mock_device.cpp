// The mock device's own promises, which tests elsewhere rely on: its capacity refusal looks like a
// driver's, its script of other processes' usage is consumed one value per memory_info() call,
// and its counters tell the truth, also under concurrent use.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <latch>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

#include "byte_units.h"
#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "seeded_threads.h"

using kiln::DeviceAllocation;
using kiln::LlvmRuntimeAllocParams;
using kiln::MemoryCategory;
using kiln::MockDevice;
using kiln::MockDeviceOptions;
using kiln::OomSource;
using kiln::RhiResult;

namespace {

using namespace kiln::test::units;

LlvmRuntimeAllocParams params_of(uint64_t size_bytes,
                                 MemoryCategory category = MemoryCategory::ndarray) {
  LlvmRuntimeAllocParams params;
  params.size_bytes = size_bytes;
  params.category = category;
  return params;
}

MockDevice make_mock(uint64_t capacity_bytes, std::vector<uint64_t> script = {}) {
  MockDeviceOptions options;
  options.capacity_bytes = capacity_bytes;
  options.other_process_bytes_script = std::move(script);
  return MockDevice(options);
}

uint64_t free_bytes_now(MockDevice &mock) {
  auto info = mock.memory_info();
  REQUIRE(info);
  return info->free_bytes;
}

}  // namespace

TEST_CASE("mock capacity refusal is a driver out_of_memory named MOCK_ERROR_OUT_OF_MEMORY",
          "[mock]") {
  MockDevice mock = make_mock(1_MiB);
  auto first = mock.allocate_runtime(params_of(768_KiB));
  REQUIRE(first);

  kiln::set_last_failure(kiln::Failure{});
  DeviceAllocation out{nullptr, 77};
  CHECK(mock.allocate_memory_runtime(params_of(512_KiB, MemoryCategory::staging), &out) ==
        RhiResult::out_of_memory);
  CHECK(out == DeviceAllocation{nullptr, 77});
  const kiln::Failure &f = kiln::last_failure();
  CHECK(f.result == RhiResult::out_of_memory);
  CHECK(f.oom_source == OomSource::driver);
  CHECK(std::string_view(f.driver_status) == "MOCK_ERROR_OUT_OF_MEMORY");
  CHECK(f.category == MemoryCategory::staging);
  CHECK(f.requested_bytes == 512_KiB);
  CHECK(f.device == "mock");
  CHECK(std::string_view(f.site) == "MockDevice::driver_allocate");
  CHECK(mock.driver_oom_count() == 1);
  CHECK(mock.held_bytes() == 768_KiB);
  CHECK(mock.live_allocation_count() == 1);

  // Larger than the whole device: refused too, without wrapping the arithmetic.
  CHECK_FALSE(mock.allocate_runtime(params_of(UINT64_MAX - 1_KiB)));
  CHECK(mock.driver_oom_count() == 2);

  // What is left still fits exactly.
  auto rest = mock.allocate_runtime(params_of(256_KiB));
  REQUIRE(rest);
  CHECK(mock.held_bytes() == 1_MiB);
  CHECK(mock.driver_oom_count() == 2);
  REQUIRE(mock.dealloc_memory(*first));
  REQUIRE(mock.dealloc_memory(*rest));
  CHECK(mock.held_bytes() == 0);
}

TEST_CASE("an injected fault is not counted as a driver OOM by the mock", "[mock]") {
  MockDevice mock = make_mock(1_MiB);
  mock.fault_plan().fail_nth_allocation(1);
  CHECK_FALSE(mock.allocate_runtime(params_of(1_KiB)));
  CHECK(mock.driver_oom_count() == 0);
  CHECK(mock.driver_allocation_count() == 0);
  CHECK(mock.held_bytes() == 0);
}

TEST_CASE("other_process_bytes_script is consumed one value per memory_info call, last stays",
          "[mock]") {
  MockDevice mock = make_mock(1_MiB, {100_KiB, 300_KiB, 50_KiB});
  CHECK(free_bytes_now(mock) == 1_MiB - 100_KiB);
  CHECK(free_bytes_now(mock) == 1_MiB - 300_KiB);
  CHECK(free_bytes_now(mock) == 1_MiB - 50_KiB);
  CHECK(free_bytes_now(mock) == 1_MiB - 50_KiB);
  CHECK(free_bytes_now(mock) == 1_MiB - 50_KiB);
  CHECK(mock.memory_info_count() == 5);

  // free also accounts for what kiln holds; total is the capacity.
  auto a = mock.allocate_runtime(params_of(200_KiB));
  REQUIRE(a);
  auto info = mock.memory_info();
  REQUIRE(info);
  CHECK(info->free_bytes == 1_MiB - 50_KiB - 200_KiB);
  CHECK(info->total_bytes == 1_MiB);
  REQUIRE(mock.dealloc_memory(*a));
}

TEST_CASE("other processes using more than the capacity leave free at 0, not wrapped", "[mock]") {
  MockDevice mock = make_mock(1_MiB, {2_MiB});
  CHECK(free_bytes_now(mock) == 0);
  CHECK_FALSE(mock.allocate_runtime(params_of(1_KiB)));
  CHECK(mock.driver_oom_count() == 1);
}

TEST_CASE("set_other_process_bytes replaces the script and the driver sees it", "[mock]") {
  MockDevice mock = make_mock(1_MiB, {0, 0, 0});
  CHECK(free_bytes_now(mock) == 1_MiB);
  mock.set_other_process_bytes(900_KiB);
  CHECK(free_bytes_now(mock) == 1_MiB - 900_KiB);
  CHECK(free_bytes_now(mock) == 1_MiB - 900_KiB);  // the rest of the old script is gone

  auto too_big = mock.allocate_runtime(params_of(200_KiB));
  REQUIRE_FALSE(too_big);
  CHECK(too_big.error().driver_status == std::string_view("MOCK_ERROR_OUT_OF_MEMORY"));
  auto fits = mock.allocate_runtime(params_of(100_KiB));
  REQUIRE(fits);

  mock.set_other_process_bytes(0);
  CHECK(free_bytes_now(mock) == 1_MiB - 100_KiB);
  auto now_fits = mock.allocate_runtime(params_of(200_KiB));
  REQUIRE(now_fits);
  REQUIRE(mock.dealloc_memory(*fits));
  REQUIRE(mock.dealloc_memory(*now_fits));
}

TEST_CASE("high_water_bytes is the most the mock ever held at once", "[mock]") {
  MockDevice mock = make_mock(1_MiB);
  CHECK(mock.high_water_bytes() == 0);
  auto a = mock.allocate_runtime(params_of(100_KiB));
  auto b = mock.allocate_runtime(params_of(300_KiB));
  REQUIRE(a);
  REQUIRE(b);
  CHECK(mock.held_bytes() == 400_KiB);
  CHECK(mock.high_water_bytes() == 400_KiB);
  REQUIRE(mock.dealloc_memory(*b));
  CHECK(mock.held_bytes() == 100_KiB);
  CHECK(mock.high_water_bytes() == 400_KiB);
  auto c = mock.allocate_runtime(params_of(200_KiB));
  REQUIRE(c);
  CHECK(mock.high_water_bytes() == 400_KiB);  // 300 KiB now: below the old peak
  auto d = mock.allocate_runtime(params_of(250_KiB));
  REQUIRE(d);
  CHECK(mock.high_water_bytes() == 550_KiB);
  // A refused allocation does not raise the peak.
  CHECK_FALSE(mock.allocate_runtime(params_of(1_MiB)));
  CHECK(mock.high_water_bytes() == 550_KiB);
  CHECK(mock.driver_allocation_count() == 5);
  for (auto *x : {&a, &c, &d}) REQUIRE(mock.dealloc_memory(**x));
  CHECK(mock.held_bytes() == 0);
}

TEST_CASE("8 threads allocating concurrently never push the mock past its capacity",
          "[mock][threads]") {
  constexpr uint64_t kCapacity = 512_KiB;
  constexpr int kIterations = 2000;
  MockDevice mock = make_mock(kCapacity);
  std::atomic<uint64_t> over_capacity_seen{0};
  std::atomic<uint64_t> successes{0};
  std::atomic<uint64_t> refusals{0};
  std::atomic<uint64_t> wrong_errors{0};

  auto worker = [&](std::mt19937 &rng) {
    std::uniform_int_distribution<uint64_t> size_kib(16, 192);
    std::vector<DeviceAllocation> held;
    for (int i = 0; i < kIterations; ++i) {
      if (held.size() < 4 && (rng() & 1u)) {
        auto a = mock.allocate_runtime(params_of(size_kib(rng) << 10));
        if (a) {
          held.push_back(*a);
          successes.fetch_add(1);
        } else if (a.error().result == RhiResult::out_of_memory &&
                   a.error().oom_source == OomSource::driver) {
          refusals.fetch_add(1);
        } else {
          wrong_errors.fetch_add(1);
        }
      } else if (!held.empty()) {
        if (!mock.dealloc_memory(held.back())) wrong_errors.fetch_add(1);
        held.pop_back();
      }
      if (mock.held_bytes() > kCapacity) over_capacity_seen.fetch_add(1);
    }
    for (DeviceAllocation a : held)
      if (!mock.dealloc_memory(a)) wrong_errors.fetch_add(1);
  };
  kiln::test::run_seeded_threads(/*num_threads=*/8, /*first_seed=*/1234u, worker);

  CHECK(over_capacity_seen.load() == 0);
  CHECK(mock.high_water_bytes() <= kCapacity);
  CHECK(wrong_errors.load() == 0);
  // Even one thread's demand (up to 4 x 192 KiB) exceeds the capacity, so both happened.
  CHECK(successes.load() > 0);
  CHECK(refusals.load() > 0);
  CHECK(mock.driver_oom_count() == refusals.load());
  CHECK(mock.held_bytes() == 0);
  CHECK(mock.live_allocation_count() == 0);
}
