// The device conformance suite, run for every backend in KILN_CONFORMANCE_BACKENDS
// (conformance_backends.h): allocation. *out written only on success, size 0 and bad alignments
// are invalid_usage naming the request, zero_fill clears, memory info and live counts add up.
// Copies and frees: test_device_conformance_copies.cpp; fault plans: _faults.cpp.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string_view>
#include <vector>

#include "conformance_backends.h"

using namespace kiln::test::conformance;

TEMPLATE_TEST_CASE("allocate_memory_runtime writes *out on success and the handle is live",
                   "[conformance]", KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  DeviceAllocation out = marker();
  REQUIRE(device->allocate_memory_runtime(params_of(4_KiB), &out) == RhiResult::success);
  CHECK(out.device == device.get());
  CHECK(out != marker());
  auto size = device->allocation_size(out);
  REQUIRE(size);
  CHECK(*size == 4_KiB);
  CHECK(device->live_allocation_count() == 1);
  CHECK(device->live_allocation_bytes() == 4_KiB);
  REQUIRE(device->dealloc_memory(out));
}

TEMPLATE_TEST_CASE("allocate_runtime returns the allocation as an expected", "[conformance]",
                   KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  auto first = device->allocate_runtime(params_of(1_KiB));
  auto second = device->allocate_runtime(params_of(2_KiB));
  REQUIRE(first);
  REQUIRE(second);
  CHECK(first->device == device.get());
  CHECK(*first != *second);
  CHECK(device->live_allocation_bytes() == 3_KiB);

  auto bad = device->allocate_runtime(params_of(0));
  REQUIRE_FALSE(bad);
  CHECK(bad.error().result == RhiResult::invalid_usage);
  CHECK(bad.error().device == TestType::kName);
  REQUIRE(device->dealloc_memory(*first));
  REQUIRE(device->dealloc_memory(*second));
}

TEMPLATE_TEST_CASE("size 0 is invalid_usage, *out untouched, last_failure says why",
                   "[conformance]", KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  clear_last_failure();
  DeviceAllocation out = marker();
  CHECK(device->allocate_memory_runtime(params_of(0), &out) == RhiResult::invalid_usage);
  CHECK(out == marker());
  const kiln::Failure &f = kiln::last_failure();
  CHECK(f.result == RhiResult::invalid_usage);
  CHECK(f.oom_source == OomSource::none);
  CHECK(f.device == TestType::kName);
  CHECK(std::string_view(f.site) == kAllocSite);
  CHECK_FALSE(f.detail.empty());
  CHECK(device->live_allocation_count() == 0);
}

TEMPLATE_TEST_CASE("alignment that is not a power of two is invalid_usage", "[conformance]",
                   KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  const uint64_t alignment = GENERATE(as<uint64_t>{}, 0, 3, 48, 100);
  CAPTURE(alignment);
  auto params = params_of(1_KiB);
  params.alignment_bytes = alignment;
  clear_last_failure();
  DeviceAllocation out = marker();
  CHECK(device->allocate_memory_runtime(params, &out) == RhiResult::invalid_usage);
  CHECK(out == marker());
  CHECK(kiln::last_failure().result == RhiResult::invalid_usage);
  CHECK(kiln::last_failure().device == TestType::kName);
  CHECK(std::string_view(kiln::last_failure().site) == kAllocSite);
  CHECK(device->live_allocation_count() == 0);

  // Powers of two other than the default are accepted.
  params.alignment_bytes = 4096;
  auto ok = device->allocate_runtime(params);
  REQUIRE(ok);
  REQUIRE(device->dealloc_memory(*ok));
}

TEMPLATE_TEST_CASE("zero_fill clears memory that held data before", "[conformance]",
                   KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  constexpr std::size_t kBytes = 4096;
  // Dirty a block and free it, so the allocator is likely to hand the same memory back.
  for (int round = 0; round < 4; ++round) {
    auto dirty = device->allocate_runtime(params_of(kBytes));
    REQUIRE(dirty);
    const std::vector<uint8_t> junk(kBytes, 0xAB);
    REQUIRE(device->memcpy_host_to_device(*dirty, 0, junk.data(), kBytes));
    REQUIRE(device->dealloc_memory(*dirty));

    auto params = params_of(kBytes);
    params.zero_fill = true;
    auto clean = device->allocate_runtime(params);
    REQUIRE(clean);
    std::vector<uint8_t> back(kBytes, 0xFF);
    REQUIRE(device->memcpy_device_to_host(back.data(), *clean, 0, kBytes));
    CHECK(std::all_of(back.begin(), back.end(), [](uint8_t b) { return b == 0; }));
    REQUIRE(device->dealloc_memory(*clean));
  }
}

TEMPLATE_TEST_CASE("get_memory_info reports free <= total and total > 0", "[conformance]",
                   KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  uint64_t free_bytes = 0;
  uint64_t total_bytes = 0;
  REQUIRE(device->get_memory_info(&free_bytes, &total_bytes) == RhiResult::success);
  CHECK(total_bytes > 0);
  CHECK(free_bytes <= total_bytes);
  auto info = device->memory_info();
  REQUIRE(info);
  CHECK(info->total_bytes == total_bytes);
  CHECK(info->free_bytes <= info->total_bytes);
}

TEMPLATE_TEST_CASE("live allocation count and bytes return to 0 after every free",
                   "[conformance]", KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  std::vector<DeviceAllocation> held;
  uint64_t expected_bytes = 0;
  for (uint64_t size : {1ull, 63ull, 64ull, 1000ull, 4096ull, 65537ull}) {
    auto a = device->allocate_runtime(params_of(size));
    REQUIRE(a);
    held.push_back(*a);
    expected_bytes += size;
    CHECK(device->live_allocation_count() == held.size());
    CHECK(device->live_allocation_bytes() == expected_bytes);
  }
  // A refused allocation holds nothing.
  device->fault_plan().fail_nth_allocation(1);
  CHECK_FALSE(device->allocate_runtime(params_of(100)));
  CHECK(device->live_allocation_bytes() == expected_bytes);
  for (DeviceAllocation a : held) REQUIRE(device->dealloc_memory(a));
  CHECK(device->live_allocation_count() == 0);
  CHECK(device->live_allocation_bytes() == 0);
}

TEMPLATE_TEST_CASE("an invalid_usage allocation failure names the requested bytes and category",
                   "[conformance]", KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  auto params = params_of(1000, MemoryCategory::staging);
  params.alignment_bytes = 3;
  clear_last_failure();
  DeviceAllocation out = marker();
  REQUIRE(device->allocate_memory_runtime(params, &out) == RhiResult::invalid_usage);
  CHECK(kiln::last_failure().requested_bytes == 1000);
  CHECK(kiln::last_failure().category == MemoryCategory::staging);
}
