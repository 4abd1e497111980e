// One device conformance suite, instantiated for every backend through a small factory struct.
// To add a backend (e.g. a fake CUDA or HIP driver), write a factory like CpuFactory below and add
// it to KILN_CONFORMANCE_BACKENDS. Every backend runs here: the fake drivers are built with this
// binary (a fake that does not load fails the test that makes its device, saying which).
#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <string_view>
#include <vector>

#include "byte_units.h"
#include "fake_gpu_handle.h"
#include "kiln/rhi/amdgpu_device.h"
#include "kiln/rhi/cpu_device.h"
#include "kiln/rhi/cuda_device.h"
#include "kiln/rhi/device.h"
#include "kiln/rhi/fault_plan.h"
#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"

using kiln::DeviceAllocation;
using kiln::FaultPlan;
using kiln::LlvmDevice;
using kiln::LlvmRuntimeAllocParams;
using kiln::MemoryCategory;
using kiln::OomSource;
using kiln::RhiResult;

namespace {

using namespace kiln::test::units;

// The function that refuses: allocate_memory_runtime calls it, DeviceMemory calls it directly, so
// it is on every allocation's path (allocate_memory_runtime is not on DeviceMemory's).
constexpr std::string_view kAllocSite = "LlvmDevice::allocate_runtime";

struct CpuFactory {
  static constexpr const char *kName = "cpu";
  static std::unique_ptr<LlvmDevice> make() { return std::make_unique<kiln::CpuDevice>(); }
};

struct MockFactory {
  static constexpr const char *kName = "mock";
  static std::unique_ptr<LlvmDevice> make() {
    kiln::MockDeviceOptions options;
    options.capacity_bytes = 256_MiB;
    return std::make_unique<kiln::MockDevice>(options);
  }
};

// The GPU backends over the fake drivers CI builds (test/fake_cuda, test/fake_hip), reset before
// each device so one test's faults and memory never reach the next.
template <class Traits>
struct FakeGpuFactory {
  static constexpr const char *kName = Traits::kName;
  static std::unique_ptr<LlvmDevice> make() {
    static kiln::test::FakeGpu fake =
        kiln::test::FakeGpu::open(Traits::kLibrary, Traits::kEnvVar, Traits::kPrefix);
    setenv(Traits::kEnvVar, Traits::kLibrary, 1);  // other tests may have pointed it elsewhere
    fake.reset();
    auto device = Traits::create();
    REQUIRE(device);
    return std::move(*device);
  }
};

struct FakeCudaTraits {
  static constexpr const char *kName = "cuda:0";  // the device name the fake driver gives
  static constexpr const char *kLibrary = KILN_FAKE_CUDA_LIBRARY;
  static constexpr const char *kEnvVar = "KILN_CUDA_DRIVER";
  static constexpr const char *kPrefix = "kiln_fake_cuda_";
  static auto create() { return kiln::create_cuda_device(0); }
};

struct FakeHipTraits {
  static constexpr const char *kName = "amdgpu:0";
  static constexpr const char *kLibrary = KILN_FAKE_HIP_LIBRARY;
  static constexpr const char *kEnvVar = "KILN_HIP_RUNTIME";
  static constexpr const char *kPrefix = "kiln_fake_hip_";
  static auto create() { return kiln::create_amdgpu_device(0); }
};

using FakeCudaFactory = FakeGpuFactory<FakeCudaTraits>;
using FakeHipFactory = FakeGpuFactory<FakeHipTraits>;

LlvmRuntimeAllocParams params_of(uint64_t size_bytes,
                                 MemoryCategory category = MemoryCategory::ndarray) {
  LlvmRuntimeAllocParams params;
  params.size_bytes = size_bytes;
  params.category = category;
  return params;
}

// A value no successful allocation can write: a failed call must leave it exactly as it was.
DeviceAllocation marker() {
  return DeviceAllocation{reinterpret_cast<kiln::Device *>(uintptr_t{0xdeadbeef}), 0x5a5a5a5a};
}

// Resets last_failure() so a test can prove the failing call set it.
void clear_last_failure() { kiln::set_last_failure(kiln::Failure{}); }

std::vector<uint8_t> pattern(std::size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

}  // namespace

#define KILN_CONFORMANCE_BACKENDS CpuFactory, MockFactory, FakeCudaFactory, FakeHipFactory

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
