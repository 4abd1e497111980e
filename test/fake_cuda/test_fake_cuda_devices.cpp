// Several fake CUDA devices (KILN_FAKE_CUDA_DEVICES): each with its own memory and capacity, a
// sticky fault that poisons only its own device, and malformed device or capacity lists.
#include <catch2/catch.hpp>

#include <string>

#include "fake_cuda_test_support.h"

using namespace kiln::cuda;
using namespace kiln::fake_cuda_test;

namespace {

/// Retains device `ordinal`'s primary context and makes it current (after cuInit).
CUcontext use_device(Fake &f, int ordinal) {
  CUdevice device = -1;
  REQUIRE(f.cuDeviceGet(&device, ordinal) == kSuccess);
  CHECK(device == ordinal);
  CUcontext context = nullptr;
  REQUIRE(f.cuDevicePrimaryCtxRetain(&context, device) == kSuccess);
  REQUIRE(f.cuCtxSetCurrent(context) == kSuccess);
  return context;
}

}  // namespace

TEST_CASE("fake cuda: KILN_FAKE_CUDA_DEVICES offers several devices, each with its own memory",
          "[fake_cuda]") {
  Fake &f = fresh({{"KILN_FAKE_CUDA_DEVICES", "2"}, {"KILN_FAKE_CUDA_CAPACITY_MB", "64,128"}});
  REQUIRE(f.cuInit(0) == kSuccess);
  int count = 0;
  REQUIRE(f.cuDeviceGetCount(&count) == kSuccess);
  CHECK(count == 2);
  CHECK(f.device_count() == 2);
  CUdevice device = -1;
  CHECK(f.cuDeviceGet(&device, 2) == kErrorInvalidDevice);  // as the real driver answers
  CUcontext context = nullptr;
  CHECK(f.cuDevicePrimaryCtxRetain(&context, 2) == kErrorInvalidDevice);
  CHECK(f.device_capacity_bytes(0) == 64 * kMiB);
  CHECK(f.device_capacity_bytes(1) == 128 * kMiB);

  const CUcontext first = use_device(f, 0);
  const CUcontext second = use_device(f, 1);
  CHECK(first != second);
  std::size_t free_bytes = 0, total_bytes = 0;
  REQUIRE(f.cuMemGetInfo_v2(&free_bytes, &total_bytes) == kSuccess);
  CHECK(total_bytes == 128 * kMiB);  // device 1's, its context being current
  const CUdeviceptr on_second = alloc(f, 100 * kMiB);
  CHECK(f.device_held_bytes(1) == 100 * kMiB);
  CHECK(f.device_held_bytes(0) == 0);  // held by device 1 only
  CHECK(f.held_bytes() == 100 * kMiB);
  CHECK(f.device_held_bytes(5) == 0);

  REQUIRE(f.cuCtxSetCurrent(first) == kSuccess);
  REQUIRE(f.cuMemGetInfo_v2(&free_bytes, &total_bytes) == kSuccess);
  CHECK(total_bytes == 64 * kMiB);
  CHECK(free_bytes == 64 * kMiB);
  CUdeviceptr ptr = 0;
  CHECK(f.cuMemAlloc_v2(&ptr, 100 * kMiB) == kErrorOutOfMemory);  // device 0's capacity
  CHECK(f.device_oom_count(0) == 1);
  CHECK(f.device_oom_count(1) == 0);
  CHECK(f.cuMemFree_v2(on_second) == kErrorInvalidValue);  // not device 0's allocation

  // Releasing device 1's context frees device 1's memory only.
  const CUdeviceptr on_first = alloc(f, kMiB);
  REQUIRE(f.cuDevicePrimaryCtxRelease_v2(1) == kSuccess);
  CHECK(f.device_held_bytes(1) == 0);
  CHECK(f.device_held_bytes(0) == kMiB);
  CHECK(f.cuCtxSetCurrent(second) == kErrorInvalidContext);  // destroyed with its last release
  CHECK(f.cuMemFree_v2(on_first) == kSuccess);
}

TEST_CASE("fake cuda: a sticky fault poisons the device whose context raised it, no other",
          "[fake_cuda]") {
  Fake &f = fresh({{"KILN_FAKE_CUDA_DEVICES", "2"}});
  REQUIRE(f.cuInit(0) == kSuccess);
  CHECK(f.device_contexts(0) == 0);
  CHECK(f.device_contexts(1) == 0);
  const CUcontext first = use_device(f, 0);
  const CUdeviceptr on_first = alloc(f, kMiB);
  const CUcontext second = use_device(f, 1);
  CHECK(f.device_contexts(0) == 1);
  CHECK(f.device_contexts(1) == 1);

  REQUIRE(f.inject_fault("cuCtxSynchronize", 1, kErrorIllegalAddress) == 0);
  CHECK(f.cuCtxSynchronize() == kErrorIllegalAddress);  // device 1's context is current
  CHECK(f.device_sticky_error(1) == kErrorIllegalAddress);
  CHECK(f.device_sticky_error(0) == kSuccess);
  CHECK(f.sticky_error() == kErrorIllegalAddress);  // the lowest ordinal with one
  CUdeviceptr ptr = 0;
  CHECK(f.cuMemAlloc_v2(&ptr, 64) == kErrorIllegalAddress);
  CUdevice device = -1;
  CHECK(f.cuDeviceGet(&device, 1) == kErrorIllegalAddress);
  CUcontext retained = nullptr;
  CHECK(f.cuDevicePrimaryCtxRetain(&retained, 1) == kErrorIllegalAddress);
  int count = 0;
  CHECK(f.cuDeviceGetCount(&count) == kSuccess);  // acts on no device

  // Device 0 goes on: its context, its memory, its queries.
  REQUIRE(f.cuCtxSetCurrent(first) == kSuccess);
  CHECK(f.cuMemAlloc_v2(&ptr, 64) == kSuccess);
  int value = 7;
  CHECK(f.cuMemcpyHtoD_v2(on_first, &value, sizeof value) == kSuccess);
  int back = 0;
  CHECK(f.cuMemcpyDtoH_v2(&back, on_first, sizeof back) == kSuccess);
  CHECK(back == 7);
  CHECK(f.cuCtxSynchronize() == kSuccess);
  CHECK(f.cuMemFree_v2(ptr) == kSuccess);
  CHECK(f.cuDeviceGet(&device, 0) == kSuccess);
  CHECK(f.device_sticky_error(0) == kSuccess);

  // Device 1's context still answers its error; its last release clears it and frees device 1's
  // memory only; the next retain makes (and counts) a new context.
  CHECK(f.cuCtxSetCurrent(second) == kErrorIllegalAddress);
  REQUIRE(f.cuDevicePrimaryCtxRelease_v2(1) == kSuccess);
  CHECK(f.device_sticky_error(1) == kSuccess);
  CHECK(f.sticky_error() == kSuccess);
  CHECK(f.device_held_bytes(0) == kMiB);
  use_device(f, 1);
  CHECK(f.device_contexts(1) == 2);
  CHECK(f.cuMemAlloc_v2(&ptr, 64) == kSuccess);
  use_device(f, 0);  // retaining a retained context makes none
  CHECK(f.device_contexts(0) == 1);
  CHECK(f.device_contexts(2) == 0);  // an ordinal the fake lacks
  fresh();  // later tests see one device again
}

TEST_CASE("fake cuda: a malformed KILN_FAKE_CUDA_DEVICES or capacity list fails cuInit",
          "[fake_cuda]") {
  for (const char *devices : {"0", "9", "two", "-1"}) {
    Fake &f = fresh({{"KILN_FAKE_CUDA_DEVICES", devices}});
    CHECK(f.cuInit(0) == kErrorInvalidValue);
    char text[256] = {};
    f.config_error(text, sizeof text);
    CHECK(std::string(text).find("KILN_FAKE_CUDA_DEVICES") != std::string::npos);
  }
  Fake &f = fresh({{"KILN_FAKE_CUDA_DEVICES", "2"}, {"KILN_FAKE_CUDA_CAPACITY_MB", "64,128,256"}});
  CHECK(f.cuInit(0) == kErrorInvalidValue);
  char text[256] = {};
  f.config_error(text, sizeof text);
  CHECK(std::string(text).find("one per device (2)") != std::string::npos);
  fresh();  // later tests see one device again
}
