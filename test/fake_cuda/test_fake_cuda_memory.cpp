// The fake CUDA driver's memory: alloc, copy, memset and free over host memory, the capacity and
// other processes' memory, and what releasing the primary context frees.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "fake_cuda_test_support.h"

using namespace kiln::cuda;
using namespace kiln::fake_cuda_test;

TEST_CASE("fake cuda: alloc, copy, memset and free over host memory", "[fake_cuda]") {
  Fake &f = opened();
  const CUdeviceptr a = alloc(f, 1000);
  const CUdeviceptr b = alloc(f, 1000);
  CHECK(a % 256 == 0);
  CHECK(f.held_bytes() == 2000);
  CHECK(f.allocation_count() == 2);
  std::vector<uint8_t> in(1000), out(1000, 0);
  for (std::size_t i = 0; i < in.size(); ++i) in[i] = static_cast<uint8_t>(i * 7);
  CHECK(f.cuMemcpyHtoD_v2(a, in.data(), in.size()) == kSuccess);
  CHECK(f.cuMemcpyDtoD_v2(b, a, 1000) == kSuccess);
  CHECK(f.cuMemcpyDtoH_v2(out.data(), b, out.size()) == kSuccess);
  CHECK(out == in);
  CHECK(f.cuMemsetD8_v2(b + 10, 0xAB, 5) == kSuccess);
  CHECK(f.cuMemcpyDtoH_v2(out.data(), b, out.size()) == kSuccess);
  CHECK(out[9] == in[9]);
  CHECK(out[10] == 0xAB);
  CHECK(out[14] == 0xAB);
  CHECK(out[15] == in[15]);

  // Out-of-range and unknown device pointers are CUDA_ERROR_INVALID_VALUE.
  CHECK(f.cuMemcpyHtoD_v2(a + 1, in.data(), 1000) == kErrorInvalidValue);
  CHECK(f.cuMemcpyDtoH_v2(out.data(), 0x10, 4) == kErrorInvalidValue);
  CHECK(f.cuMemFree_v2(a + 8) == kErrorInvalidValue);
  CUdeviceptr zero = 0;
  CHECK(f.cuMemAlloc_v2(&zero, 0) == kErrorInvalidValue);

  CHECK(f.cuMemFree_v2(a) == kSuccess);
  CHECK(f.cuMemFree_v2(a) == kErrorInvalidValue);  // double free
  CHECK(f.cuMemFree_v2(b) == kSuccess);
  CHECK(f.held_bytes() == 0);
  CHECK(f.high_water_bytes() == 2000);
  CHECK(f.call_count("cuMemAlloc_v2") == 3);
  CHECK(f.call_count("cuMemFree_v2") == 4);
  CHECK(f.call_count("cuNotAnEntryPoint") == 0);
}

TEST_CASE("fake cuda: the capacity refuses with CUDA_ERROR_OUT_OF_MEMORY and writes nothing",
          "[fake_cuda]") {
  Fake &f = opened({{"KILN_FAKE_CUDA_CAPACITY_MB", "64"}});
  std::size_t free_bytes = 0, total_bytes = 0;
  REQUIRE(f.cuMemGetInfo_v2(&free_bytes, &total_bytes) == kSuccess);
  CHECK(total_bytes == 64 * kMiB);
  CHECK(free_bytes == 64 * kMiB);
  const CUdeviceptr big = alloc(f, 40 * kMiB);
  CUdeviceptr ptr = 12345;
  CHECK(f.cuMemAlloc_v2(&ptr, 30 * kMiB) == kErrorOutOfMemory);
  CHECK(ptr == 12345);
  CHECK(f.oom_count() == 1);
  CHECK(f.held_bytes() == 40 * kMiB);
  REQUIRE(f.cuMemGetInfo_v2(&free_bytes, &total_bytes) == kSuccess);
  CHECK(free_bytes == 24 * kMiB);

  // Other processes take memory too.
  f.set_other_process_bytes(20 * kMiB);
  REQUIRE(f.cuMemGetInfo_v2(&free_bytes, &total_bytes) == kSuccess);
  CHECK(free_bytes == 4 * kMiB);
  CHECK(f.cuMemAlloc_v2(&ptr, 8 * kMiB) == kErrorOutOfMemory);
  CHECK(f.cuMemFree_v2(big) == kSuccess);
  CHECK(f.cuMemAlloc_v2(&ptr, 8 * kMiB) == kSuccess);
  CHECK(f.cuMemFree_v2(ptr) == kSuccess);
}

TEST_CASE("fake cuda: KILN_FAKE_CUDA_OTHER_MB is consumed one value per cuMemGetInfo_v2",
          "[fake_cuda]") {
  Fake &f = opened({{"KILN_FAKE_CUDA_CAPACITY_MB", "100"}, {"KILN_FAKE_CUDA_OTHER_MB", "0,30,90"}});
  std::vector<std::size_t> seen;
  for (int i = 0; i < 5; ++i) {
    std::size_t free_bytes = 0, total_bytes = 0;
    REQUIRE(f.cuMemGetInfo_v2(&free_bytes, &total_bytes) == kSuccess);
    seen.push_back(free_bytes / kMiB);
  }
  CHECK(seen == std::vector<std::size_t>{100, 70, 10, 10, 10});
  CUdeviceptr ptr = 0;
  CHECK(f.cuMemAlloc_v2(&ptr, 11 * kMiB) == kErrorOutOfMemory);  // the last reported value holds
}

TEST_CASE("fake cuda: releasing the primary context frees what it held", "[fake_cuda]") {
  Fake &f = opened();
  alloc(f, 4096);
  CUmodule module = nullptr;
  REQUIRE(f.cuModuleLoadData(&module, ptx().c_str()) == kSuccess);
  CHECK(f.held_bytes() == 4096);
  REQUIRE(f.cuDevicePrimaryCtxRelease_v2(0) == kSuccess);
  CHECK(f.held_bytes() == 0);
  CHECK(f.module_bytes() == 0);
  CUdeviceptr ptr = 0;
  CHECK(f.cuMemAlloc_v2(&ptr, 64) == kErrorInvalidContext);
  CHECK(f.cuDevicePrimaryCtxRelease_v2(0) == kErrorInvalidContext);
}
