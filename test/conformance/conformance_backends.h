// The backends of the device conformance suite (test_device_conformance_*.cpp), one small factory
// struct each, and the helpers the suite shares. To add a backend (e.g. a fake CUDA or HIP driver),
// write a factory like CpuFactory below and add it to KILN_CONFORMANCE_BACKENDS. Every backend runs:
// the fake drivers are built with the unit tests (a fake that does not load fails the test that
// makes its device, saying which).
#ifndef KILN_TEST_CONFORMANCE_BACKENDS_H_
#define KILN_TEST_CONFORMANCE_BACKENDS_H_

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <memory>
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


namespace kiln::test::conformance {

using kiln::DeviceAllocation;
using kiln::FaultPlan;
using kiln::LlvmDevice;
using kiln::LlvmRuntimeAllocParams;
using kiln::MemoryCategory;
using kiln::OomSource;
using kiln::RhiResult;

using namespace kiln::test::units;

// The function that refuses: allocate_memory_runtime calls it, DeviceMemory calls it directly, so
// it is on every allocation's path (allocate_memory_runtime is not on DeviceMemory's).
inline constexpr std::string_view kAllocSite = "LlvmDevice::allocate_runtime";

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

inline LlvmRuntimeAllocParams params_of(uint64_t size_bytes,
                                 MemoryCategory category = MemoryCategory::ndarray) {
  LlvmRuntimeAllocParams params;
  params.size_bytes = size_bytes;
  params.category = category;
  return params;
}

// A value no successful allocation can write: a failed call must leave it exactly as it was.
inline DeviceAllocation marker() {
  return DeviceAllocation{reinterpret_cast<kiln::LlvmDevice *>(uintptr_t{0xdeadbeef}), 0x5a5a5a5a};
}

// Resets last_failure() so a test can prove the failing call set it.
inline void clear_last_failure() { kiln::set_last_failure(kiln::Failure{}); }

inline std::vector<uint8_t> pattern(std::size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 7);
  return v;
}

}  // namespace kiln::test::conformance

#define KILN_CONFORMANCE_BACKENDS CpuFactory, MockFactory, FakeCudaFactory, FakeHipFactory

#endif  // KILN_TEST_CONFORMANCE_BACKENDS_H_
