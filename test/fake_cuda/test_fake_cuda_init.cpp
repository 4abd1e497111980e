// The fake CUDA driver's start: nothing before cuInit or without a current context, device and
// error-name queries, and the stub and no-device modes.
#include <catch2/catch.hpp>

#include <string>

#include "fake_cuda_test_support.h"

using namespace kiln::cuda;
using namespace kiln::fake_cuda_test;

TEST_CASE("fake cuda: nothing works before cuInit, and nothing without a current context",
          "[fake_cuda]") {
  Fake &f = fresh();
  int count = -1;
  CHECK(f.cuDeviceGetCount(&count) == kErrorNotInitialized);
  int version = 0;
  CHECK(f.cuDriverGetVersion(&version) == kSuccess);
  CHECK(version >= 12000);
  REQUIRE(f.cuInit(0) == kSuccess);
  CHECK(f.cuDeviceGetCount(&count) == kSuccess);
  CHECK(count == 1);
  CUdeviceptr ptr = 0;
  CHECK(f.cuMemAlloc_v2(&ptr, 64) == kErrorInvalidContext);
  CUdevice device = -1;
  CHECK(f.cuDeviceGet(&device, 1) == kErrorInvalidDevice);
  char name[64] = {};
  REQUIRE(f.cuDeviceGet(&device, 0) == kSuccess);
  CHECK(f.cuDeviceGetName(name, sizeof name, device) == kSuccess);
  CHECK(std::string(name).find("fake") != std::string::npos);
  const char *error = nullptr;
  CHECK(f.cuGetErrorName(kErrorOutOfMemory, &error) == kSuccess);
  CHECK(std::string(error) == "CUDA_ERROR_OUT_OF_MEMORY");
  CHECK(f.cuGetErrorName(12345, &error) == kErrorInvalidValue);
}

TEST_CASE("fake cuda: stub mode answers CUDA_ERROR_STUB_LIBRARY to everything", "[fake_cuda]") {
  Fake &f = fresh({{"KILN_FAKE_CUDA_MODE", "stub"}});
  CHECK(f.cuInit(0) == kErrorStubLibrary);
  int value = 0;
  CHECK(f.cuDriverGetVersion(&value) == kErrorStubLibrary);
  CHECK(f.cuDeviceGetCount(&value) == kErrorStubLibrary);
  const char *name = nullptr;
  CHECK(f.cuGetErrorName(kErrorStubLibrary, &name) == kErrorStubLibrary);
  CHECK(f.set_mode("normal") == 0);
  CHECK(f.cuInit(0) == kSuccess);
  CHECK(f.set_mode("bogus") == -1);
}

TEST_CASE("fake cuda: nodevice mode initializes but has no device", "[fake_cuda]") {
  Fake &f = fresh({{"KILN_FAKE_CUDA_MODE", "nodevice"}});
  REQUIRE(f.cuInit(0) == kSuccess);
  int count = -1;
  CHECK(f.cuDeviceGetCount(&count) == kSuccess);
  CHECK(count == 0);
  CUdevice device = -1;
  CHECK(f.cuDeviceGet(&device, 0) == kErrorNoDevice);
  CUcontext context = nullptr;
  CHECK(f.cuDevicePrimaryCtxRetain(&context, 0) == kErrorInvalidDevice);
}
