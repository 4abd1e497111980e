// The fake CUDA driver's faults: the fault plan (environment and control API), sticky faults from a
// launch and their end, and a launch that reads a host pointer.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "fake_cuda_test_support.h"

using namespace kiln::cuda;
using namespace kiln::fake_cuda_test;

TEST_CASE("fake cuda: the fault plan fails the N-th call of an entry point", "[fake_cuda]") {
  SECTION("from the environment") {
    Fake &f = opened({{"KILN_FAKE_CUDA_FAULTS",
                       "cuMemAlloc_v2@2=2,cuMemsetD8_v2@*=CUDA_ERROR_INVALID_VALUE"}});
    CUdeviceptr ptr = 0;
    CHECK(f.cuMemAlloc_v2(&ptr, 64) == kSuccess);
    CUdeviceptr refused = 99;
    CHECK(f.cuMemAlloc_v2(&refused, 64) == kErrorOutOfMemory);
    CHECK(refused == 99);
    CHECK(f.oom_count() == 0);  // injected, not the capacity
    CUdeviceptr third = 0;
    CHECK(f.cuMemAlloc_v2(&third, 64) == kSuccess);
    CHECK(f.cuMemsetD8_v2(ptr, 0, 64) == kErrorInvalidValue);
    CHECK(f.cuMemsetD8_v2(ptr, 0, 64) == kErrorInvalidValue);
    CHECK(f.held_bytes() == 128);
  }
  SECTION("from the control API, counted from the injection") {
    Fake &f = opened();
    CUdeviceptr ptr = alloc(f, 64);
    REQUIRE(f.inject_fault("cuMemAlloc_v2", 1, kErrorOutOfMemory) == 0);
    REQUIRE(f.inject_fault("cuMemcpyHtoD_v2", 2, kErrorUnknown) == 0);
    CHECK(f.inject_fault("cuNoSuchCall", 1, 2) == -1);
    CUdeviceptr refused = 0;
    CHECK(f.cuMemAlloc_v2(&refused, 64) == kErrorOutOfMemory);
    CHECK(f.cuMemAlloc_v2(&refused, 64) == kSuccess);
    int value = 1;
    CHECK(f.cuMemcpyHtoD_v2(ptr, &value, sizeof value) == kSuccess);
    CHECK(f.cuMemcpyHtoD_v2(ptr, &value, sizeof value) == kErrorUnknown);
    CHECK(f.cuMemcpyHtoD_v2(ptr, &value, sizeof value) == kSuccess);
  }
  SECTION("a malformed plan makes cuInit fail instead of being ignored") {
    Fake &f = fresh({{"KILN_FAKE_CUDA_FAULTS", "cuMemAlloc@1=2"}});
    CHECK(f.cuInit(0) == kErrorInvalidValue);
    char text[256];  // and says why, for callers that configure it through the environment
    CHECK(f.config_error(text, sizeof text) > 0);
    CHECK(std::string(text) == "KILN_FAKE_CUDA_FAULTS item 'cuMemAlloc@1=2' is not <entry point>@"
                               "<call number or *>=<result number or name>");
    CHECK(fresh().config_error(text, sizeof text) == 0);
    CHECK(std::string(text).empty());
  }
  SECTION("cuInit itself can fail, like a driver that finds no GPU") {
    Fake &f = fresh({{"KILN_FAKE_CUDA_FAULTS", "cuInit@*=100"}});
    CHECK(f.cuInit(0) == kErrorNoDevice);
    int count = 0;
    CHECK(f.cuDeviceGetCount(&count) == kErrorNotInitialized);
  }
}

TEST_CASE("fake cuda: a sticky fault from a launch fails every later call on its device until "
          "the context goes",
          "[fake_cuda]") {
  Fake &f = opened({{"KILN_FAKE_CUDA_FAULTS", "cuLaunchKernel@1=700"}});
  Launch launch(f);
  const CUdeviceptr out = alloc(f, 16 * sizeof(float));
  KilnKernelArgs args{};
  args.ptr[0] = out;
  args.num_elements = 16;
  args.iteration_size = 16;
  args.num_tasks = 1;
  CHECK(launch.run("kiln_fill_f32_gpu", args, 1, 32) == kErrorIllegalAddress);
  CHECK(f.sticky_error() == kErrorIllegalAddress);
  CHECK(f.launch_count() == 0);
  CHECK(f.cuCtxSynchronize() == kErrorIllegalAddress);
  CUdeviceptr ptr = 0;
  CHECK(f.cuMemAlloc_v2(&ptr, 64) == kErrorIllegalAddress);
  CHECK(f.cuMemFree_v2(out) == kErrorIllegalAddress);
  CUdevice device = -1;  // a call naming the device answers its error too
  CHECK(f.cuDeviceGet(&device, 0) == kErrorIllegalAddress);
  int count = 0;  // calls that act on no device do not: the error is the context's
  CHECK(f.cuDeviceGetCount(&count) == kSuccess);
  CHECK(count == 1);
  CHECK(f.cuInit(0) == kSuccess);
  int version = 0;
  CHECK(f.cuDriverGetVersion(&version) == kSuccess);
  const char *name = nullptr;  // a pure lookup still answers
  CHECK(f.cuGetErrorName(kErrorIllegalAddress, &name) == kSuccess);
  CHECK(std::string(name) == "CUDA_ERROR_ILLEGAL_ADDRESS");

  // Releasing the primary context destroys the corrupt context: the next one starts clean.
  CHECK(f.held_bytes() > 0);
  CHECK(f.cuDevicePrimaryCtxRelease_v2(0) == kSuccess);
  CHECK(f.sticky_error() == kSuccess);
  CHECK(f.held_bytes() == 0);
  CUcontext context = nullptr;
  REQUIRE(f.cuDevicePrimaryCtxRetain(&context, 0) == kSuccess);
  REQUIRE(f.cuCtxSetCurrent(context) == kSuccess);
  CHECK(f.cuMemAlloc_v2(&ptr, 64) == kSuccess);
}

TEST_CASE("fake cuda: a reset clears a sticky fault", "[fake_cuda]") {
  Fake &f = opened();
  REQUIRE(f.inject_fault("cuCtxSynchronize", 1, kErrorLaunchFailed) == 0);
  CHECK(f.cuCtxSynchronize() == kErrorLaunchFailed);
  CHECK(f.cuCtxSynchronize() == kErrorLaunchFailed);
  fresh();
  CHECK(f.sticky_error() == kSuccess);
  CHECK(f.cuInit(0) == kSuccess);
}

TEST_CASE("fake cuda: a launch that would read a host pointer faults like a GPU", "[fake_cuda]") {
  Fake &f = opened();
  Launch launch(f);
  std::vector<float> host(64, 0.0f);
  KilnKernelArgs args{};
  args.ptr[0] = reinterpret_cast<uint64_t>(host.data());  // forgot to stage it
  args.num_elements = 64;
  args.iteration_size = 64;
  args.scalar_f64 = 1.0;
  args.num_tasks = 1;
  CHECK(launch.run("kiln_fill_f32_gpu", args, 1, 32) == kErrorIllegalAddress);
  CHECK(host[0] == 0.0f);  // nothing ran
  CHECK(f.cuCtxSynchronize() == kErrorIllegalAddress);
}
