// The device conformance suite (conformance_backends.h): the device's fault plan fails exactly the
// N-th allocation, and large allocations only until it is cleared.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <string_view>
#include <vector>

#include "conformance_backends.h"

using namespace kiln::test::conformance;

TEMPLATE_TEST_CASE("fail_nth_allocation fails exactly the N-th allocation", "[conformance]",
                   KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  constexpr uint64_t kN = 3;
  device->fault_plan().fail_nth_allocation(kN);
  std::vector<DeviceAllocation> held;
  for (uint64_t i = 1; i <= 6; ++i) {
    CAPTURE(i);
    clear_last_failure();
    DeviceAllocation out = marker();
    const RhiResult r =
        device->allocate_memory_runtime(params_of(512 * i, MemoryCategory::staging), &out);
    if (i == kN) {
      CHECK(r == RhiResult::out_of_memory);
      CHECK(out == marker());
      const kiln::Failure &f = kiln::last_failure();
      CHECK(f.result == RhiResult::out_of_memory);
      CHECK(f.oom_source == OomSource::driver);
      CHECK(f.category == MemoryCategory::staging);
      CHECK(f.requested_bytes == 512 * i);
      CHECK(f.device == TestType::kName);
      CHECK(std::string_view(f.site) == kAllocSite);
      CHECK(device->live_allocation_count() == held.size());
    } else {
      REQUIRE(r == RhiResult::success);
      held.push_back(out);
    }
  }
  CHECK(held.size() == 5);
  CHECK(device->fault_plan().allocation_count() == 6);
  for (DeviceAllocation a : held) REQUIRE(device->dealloc_memory(a));
}

TEMPLATE_TEST_CASE("fail_sizes_at_least fails large allocations only, until cleared",
                   "[conformance]", KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  device->fault_plan().fail_sizes_at_least(64_KiB);

  auto small = device->allocate_runtime(params_of(64_KiB - 1));
  REQUIRE(small);
  auto at_threshold = device->allocate_runtime(params_of(64_KiB, MemoryCategory::runtime_heap));
  REQUIRE_FALSE(at_threshold);
  CHECK(at_threshold.error().result == RhiResult::out_of_memory);
  CHECK(at_threshold.error().oom_source == OomSource::driver);
  CHECK(at_threshold.error().category == MemoryCategory::runtime_heap);
  CHECK(at_threshold.error().requested_bytes == 64_KiB);
  CHECK(at_threshold.error().device == TestType::kName);
  auto above = device->allocate_runtime(params_of(1_MiB));
  REQUIRE_FALSE(above);
  CHECK(above.error().result == RhiResult::out_of_memory);
  CHECK(device->live_allocation_count() == 1);

  device->fault_plan().clear();
  auto after_clear = device->allocate_runtime(params_of(1_MiB));
  REQUIRE(after_clear);
  REQUIRE(device->dealloc_memory(*small));
  REQUIRE(device->dealloc_memory(*after_clear));
}
