// The device conformance suite (conformance_backends.h): copies and frees. Copies round-trip and
// those outside the allocation copy nothing; a second dealloc and another device's allocation are
// invalid_usage and the device stays usable.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <numeric>
#include <vector>

#include "conformance_backends.h"

using namespace kiln::test::conformance;

TEMPLATE_TEST_CASE("host->device->host and device->device copies round-trip", "[conformance]",
                   KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  constexpr std::size_t kBytes = 1000;  // not a multiple of the alignment
  auto a = device->allocate_runtime(params_of(kBytes));
  auto b = device->allocate_runtime(params_of(kBytes));
  REQUIRE(a);
  REQUIRE(b);
  const std::vector<uint8_t> src = pattern(kBytes, 3);
  REQUIRE(device->memcpy_host_to_device(*a, 0, src.data(), kBytes));

  SECTION("host round-trip") {
    std::vector<uint8_t> back(kBytes, 0);
    REQUIRE(device->memcpy_device_to_host(back.data(), *a, 0, kBytes));
    CHECK(back == src);
  }
  SECTION("device to device, whole allocation") {
    REQUIRE(device->memcpy_device_to_device(*b, 0, *a, 0, kBytes));
    std::vector<uint8_t> back(kBytes, 0);
    REQUIRE(device->memcpy_device_to_host(back.data(), *b, 0, kBytes));
    CHECK(back == src);
  }
  SECTION("offsets are honoured on both sides") {
    const std::vector<uint8_t> zeros(kBytes, 0);
    REQUIRE(device->memcpy_host_to_device(*b, 0, zeros.data(), kBytes));
    REQUIRE(device->memcpy_device_to_device(*b, 100, *a, 10, 50));
    std::vector<uint8_t> back(50, 0);
    REQUIRE(device->memcpy_device_to_host(back.data(), *b, 100, 50));
    CHECK(std::equal(back.begin(), back.end(), src.begin() + 10));
    uint8_t before = 0xFF;
    REQUIRE(device->memcpy_device_to_host(&before, *b, 99, 1));
    CHECK(before == 0);
  }
  REQUIRE(device->dealloc_memory(*a));
  REQUIRE(device->dealloc_memory(*b));
}

TEMPLATE_TEST_CASE("copies outside the allocation are invalid_usage and copy nothing",
                   "[conformance]", KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  constexpr uint64_t kBytes = 256;
  auto a = device->allocate_runtime(params_of(kBytes));
  auto b = device->allocate_runtime(params_of(kBytes));
  REQUIRE(a);
  REQUIRE(b);
  std::vector<uint8_t> host(2 * kBytes, 0x11);
  REQUIRE(device->memcpy_host_to_device(*a, 0, host.data(), kBytes));

  auto h2d_past_end = device->memcpy_host_to_device(*a, 1, host.data(), kBytes);
  REQUIRE_FALSE(h2d_past_end);
  CHECK(h2d_past_end.error().result == RhiResult::invalid_usage);
  CHECK(h2d_past_end.error().device == TestType::kName);

  auto h2d_offset_past_end = device->memcpy_host_to_device(*a, kBytes + 1, host.data(), 0);
  REQUIRE_FALSE(h2d_offset_past_end);
  CHECK(h2d_offset_past_end.error().result == RhiResult::invalid_usage);

  // offset + size wraps around 2^64: must not pass the range check.
  auto wrapping = device->memcpy_device_to_host(host.data(), *a, 16, UINT64_MAX - 8);
  REQUIRE_FALSE(wrapping);
  CHECK(wrapping.error().result == RhiResult::invalid_usage);

  auto d2h_too_big = device->memcpy_device_to_host(host.data(), *a, 0, kBytes + 1);
  REQUIRE_FALSE(d2h_too_big);
  CHECK(d2h_too_big.error().result == RhiResult::invalid_usage);

  auto d2d_dst = device->memcpy_device_to_device(*b, 200, *a, 0, 100);
  REQUIRE_FALSE(d2d_dst);
  CHECK(d2d_dst.error().result == RhiResult::invalid_usage);
  auto d2d_src = device->memcpy_device_to_device(*b, 0, *a, 200, 100);
  REQUIRE_FALSE(d2d_src);
  CHECK(d2d_src.error().result == RhiResult::invalid_usage);

  // The exact end is in range.
  CHECK(device->memcpy_device_to_host(host.data(), *a, kBytes - 8, 8));
  REQUIRE(device->dealloc_memory(*a));
  REQUIRE(device->dealloc_memory(*b));
}

TEMPLATE_TEST_CASE("dealloc twice is invalid_usage and the device stays usable", "[conformance]",
                   KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  auto a = device->allocate_runtime(params_of(1_KiB));
  REQUIRE(a);
  REQUIRE(device->dealloc_memory(*a));
  auto again = device->dealloc_memory(*a);
  REQUIRE_FALSE(again);
  CHECK(again.error().result == RhiResult::invalid_usage);
  CHECK(again.error().device == TestType::kName);
  CHECK(device->live_allocation_count() == 0);
  CHECK(device->live_allocation_bytes() == 0);

  // A freed handle is dead for copies too.
  uint8_t byte = 0;
  auto stale_copy = device->memcpy_device_to_host(&byte, *a, 0, 1);
  REQUIRE_FALSE(stale_copy);
  CHECK(stale_copy.error().result == RhiResult::invalid_usage);

  auto b = device->allocate_runtime(params_of(1_KiB));
  REQUIRE(b);
  const std::vector<uint8_t> src = pattern(1_KiB, 9);
  std::vector<uint8_t> back(1_KiB, 0);
  REQUIRE(device->memcpy_host_to_device(*b, 0, src.data(), src.size()));
  REQUIRE(device->memcpy_device_to_host(back.data(), *b, 0, back.size()));
  CHECK(back == src);
  REQUIRE(device->dealloc_memory(*b));
}

TEMPLATE_TEST_CASE("an allocation from another device is invalid_usage", "[conformance]",
                   KILN_CONFORMANCE_BACKENDS) {
  auto device = TestType::make();
  auto other = TestType::make();
  auto mine = device->allocate_runtime(params_of(1_KiB));
  auto foreign = other->allocate_runtime(params_of(1_KiB));
  REQUIRE(mine);
  REQUIRE(foreign);
  // Both devices count from the same first id, so only the device pointer tells them apart.
  CAPTURE(mine->alloc_id, foreign->alloc_id);

  auto free_foreign = device->dealloc_memory(*foreign);
  REQUIRE_FALSE(free_foreign);
  CHECK(free_foreign.error().result == RhiResult::invalid_usage);
  CHECK(other->live_allocation_count() == 1);
  CHECK(device->live_allocation_count() == 1);

  uint8_t byte = 0;
  auto copy_foreign = device->memcpy_device_to_host(&byte, *foreign, 0, 1);
  REQUIRE_FALSE(copy_foreign);
  CHECK(copy_foreign.error().result == RhiResult::invalid_usage);
  auto d2d_foreign = device->memcpy_device_to_device(*mine, 0, *foreign, 0, 1);
  REQUIRE_FALSE(d2d_foreign);
  CHECK(d2d_foreign.error().result == RhiResult::invalid_usage);
  CHECK_FALSE(device->device_address(*foreign));

  REQUIRE(device->dealloc_memory(*mine));
  REQUIRE(other->dealloc_memory(*foreign));
}
