// The fake CUDA driver on its own, loaded with dlopen() the way kiln loads a driver: memory,
// capacity and other processes, the fault plan, sticky faults (per device), the stub and no-device modes,
// module and handle checks, and kernels from generate_ptx() run end to end.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_types.h"
#include "fake_cuda_control.h"
#include "kiln/runtime/kernel_abi.h"
#include "kiln/runtime/ptx_codegen.h"

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

/// Every entry point of cuda_driver.inc and the control API, resolved from one dlopen handle.
struct Fake {
#define KILN_CUDA_ENTRY(name, params) CUresult(*name) params = nullptr;
#include "cuda_driver.inc"
#undef KILN_CUDA_ENTRY
  kiln_fake_cuda_reset_fn reset = nullptr;
  kiln_fake_cuda_set_capacity_bytes_fn set_capacity_bytes = nullptr;
  kiln_fake_cuda_set_other_process_bytes_fn set_other_process_bytes = nullptr;
  kiln_fake_cuda_inject_fault_fn inject_fault = nullptr;
  kiln_fake_cuda_set_mode_fn set_mode = nullptr;
  kiln_fake_cuda_call_count_fn call_count = nullptr;
  kiln_fake_cuda_bytes_fn held_bytes = nullptr;
  kiln_fake_cuda_bytes_fn high_water_bytes = nullptr;
  kiln_fake_cuda_bytes_fn allocation_count = nullptr;
  kiln_fake_cuda_bytes_fn module_bytes = nullptr;
  kiln_fake_cuda_count_fn oom_count = nullptr;
  kiln_fake_cuda_count_fn launch_count = nullptr;
  kiln_fake_cuda_sticky_error_fn sticky_error = nullptr;
  size_t (*config_error)(char *, size_t) = nullptr;
  int (*device_count)() = nullptr;
  size_t (*device_held_bytes)(int) = nullptr;
  size_t (*device_capacity_bytes)(int) = nullptr;
  unsigned long long (*device_oom_count)(int) = nullptr;
  kiln_fake_cuda_device_sticky_error_fn device_sticky_error = nullptr;
  kiln_fake_cuda_device_contexts_fn device_contexts = nullptr;
};

template <class Fn>
void resolve(void *handle, const char *name, Fn *fn) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) FAIL("libkiln_fake_cuda.so does not export " << name);
}

Fake &fake() {
  static Fake loaded = [] {
    void *handle = dlopen(KILN_FAKE_CUDA_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) FAIL("dlopen(" KILN_FAKE_CUDA_LIBRARY ") failed: " << dlerror());
    Fake f;
#define KILN_CUDA_ENTRY(name, params) resolve(handle, #name, &f.name);
#include "cuda_driver.inc"
#undef KILN_CUDA_ENTRY
    resolve(handle, "kiln_fake_cuda_reset", &f.reset);
    resolve(handle, "kiln_fake_cuda_set_capacity_bytes", &f.set_capacity_bytes);
    resolve(handle, "kiln_fake_cuda_set_other_process_bytes", &f.set_other_process_bytes);
    resolve(handle, "kiln_fake_cuda_inject_fault", &f.inject_fault);
    resolve(handle, "kiln_fake_cuda_set_mode", &f.set_mode);
    resolve(handle, "kiln_fake_cuda_call_count", &f.call_count);
    resolve(handle, "kiln_fake_cuda_held_bytes", &f.held_bytes);
    resolve(handle, "kiln_fake_cuda_high_water_bytes", &f.high_water_bytes);
    resolve(handle, "kiln_fake_cuda_allocation_count", &f.allocation_count);
    resolve(handle, "kiln_fake_cuda_module_bytes", &f.module_bytes);
    resolve(handle, "kiln_fake_cuda_oom_count", &f.oom_count);
    resolve(handle, "kiln_fake_cuda_launch_count", &f.launch_count);
    resolve(handle, "kiln_fake_cuda_sticky_error", &f.sticky_error);
    resolve(handle, "kiln_fake_cuda_config_error", &f.config_error);
    resolve(handle, "kiln_fake_cuda_device_count", &f.device_count);
    resolve(handle, "kiln_fake_cuda_device_held_bytes", &f.device_held_bytes);
    resolve(handle, "kiln_fake_cuda_device_capacity_bytes", &f.device_capacity_bytes);
    resolve(handle, "kiln_fake_cuda_device_oom_count", &f.device_oom_count);
    resolve(handle, "kiln_fake_cuda_device_sticky_error", &f.device_sticky_error);
    resolve(handle, "kiln_fake_cuda_device_contexts", &f.device_contexts);
    // The kernels compiled into the fake must not leak into the process's symbol space.
    if (dlsym(handle, "kiln_axpy_f32") != nullptr) FAIL("the fake exports its host kernels");
    return f;
  }();
  return loaded;
}

/// Clears the KILN_FAKE_CUDA_* environment, resets the fake, and sets `env` (name=value pairs).
Fake &fresh(std::vector<std::pair<const char *, const char *>> env = {}) {
  for (const char *name : {"KILN_FAKE_CUDA_CAPACITY_MB", "KILN_FAKE_CUDA_OTHER_MB",
                           "KILN_FAKE_CUDA_FAULTS", "KILN_FAKE_CUDA_MODE", "KILN_FAKE_CUDA_DEVICES"}) {
    unsetenv(name);
  }
  for (const auto &[name, value] : env) setenv(name, value, 1);
  Fake &f = fake();
  f.reset();
  return f;
}

/// cuInit, the primary context retained and current: what kiln's CudaDevice does first.
Fake &opened(std::vector<std::pair<const char *, const char *>> env = {}) {
  Fake &f = fresh(std::move(env));
  REQUIRE(f.cuInit(0) == kiln::cuda::kSuccess);
  CUdevice device = -1;
  REQUIRE(f.cuDeviceGet(&device, 0) == kiln::cuda::kSuccess);
  CUcontext context = nullptr;
  REQUIRE(f.cuDevicePrimaryCtxRetain(&context, device) == kiln::cuda::kSuccess);
  REQUIRE(f.cuCtxSetCurrent(context) == kiln::cuda::kSuccess);
  return f;
}

CUdeviceptr alloc(Fake &f, std::size_t size_bytes) {
  CUdeviceptr ptr = 0;
  REQUIRE(f.cuMemAlloc_v2(&ptr, size_bytes) == kiln::cuda::kSuccess);
  return ptr;
}

const std::string &ptx() {
  static const std::string text = [] {
    auto generated = kiln::runtime::generate_ptx();
    if (!generated) FAIL("generate_ptx failed: " << generated.error().message());
    return std::move(generated).value();
  }();
  return text;
}

/// Device memory for one launch: runtime block, argument block; launches `name` over
/// `num_tasks` tasks as grid x block threads.
struct Launch {
  Fake &f;
  CUdeviceptr runtime = 0;
  CUdeviceptr args = 0;
  CUmodule module = nullptr;

  explicit Launch(Fake &fake_driver) : f(fake_driver) {
    runtime = alloc(f, sizeof(KilnRuntime));
    args = alloc(f, sizeof(KilnKernelArgs));
    REQUIRE(f.cuMemsetD8_v2(runtime, 0, sizeof(KilnRuntime)) == kiln::cuda::kSuccess);
    REQUIRE(f.cuModuleLoadData(&module, ptx().c_str()) == kiln::cuda::kSuccess);
  }

  CUresult run(const char *name, const KilnKernelArgs &host_args, unsigned grid, unsigned block) {
    REQUIRE(f.cuMemcpyHtoD_v2(args, &host_args, sizeof host_args) == kiln::cuda::kSuccess);
    CUfunction function = nullptr;
    REQUIRE(f.cuModuleGetFunction(&function, module, name) == kiln::cuda::kSuccess);
    void *params[] = {&runtime, &args};
    return f.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, 0, nullptr, params, nullptr);
  }
};

}  // namespace

using namespace kiln::cuda;

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

TEST_CASE("fake cuda: modules accept PTX only and functions must be its entries",
          "[fake_cuda]") {
  Fake &f = opened();
  CUmodule module = nullptr;
  CHECK(f.cuModuleLoadData(&module, "\x7f" "ELF not a PTX image") == kErrorInvalidImage);
  CHECK(f.cuModuleLoadData(&module, "hello, world") == kErrorInvalidPtx);
  CHECK(f.cuModuleLoadData(&module, ".version 7.0\n.target sm_80\n") == kErrorInvalidPtx);
  REQUIRE(f.cuModuleLoadData(&module, ptx().c_str()) == kSuccess);
  CHECK(f.module_bytes() == ptx().size() + 1);
  CUfunction function = nullptr;
  CHECK(f.cuModuleGetFunction(&function, module, "kiln_axpy_f64_gpu") == kSuccess);
  CUfunction again = nullptr;
  CHECK(f.cuModuleGetFunction(&again, module, "kiln_axpy_f64_gpu") == kSuccess);
  CHECK(again == function);
  CHECK(f.cuModuleGetFunction(&function, module, "kiln_axpy_f64") == kErrorNotFound);
  CHECK(f.cuModuleGetFunction(&function, reinterpret_cast<CUmodule>(&again), "x") ==
        kErrorInvalidHandle);
  CHECK(f.cuModuleUnload(module) == kSuccess);
  CHECK(f.module_bytes() == 0);
  CHECK(f.cuModuleUnload(module) == kErrorInvalidHandle);
  void *params[2] = {nullptr, nullptr};
  CHECK(f.cuLaunchKernel(again, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr) ==
        kErrorInvalidHandle);
  CHECK(f.sticky_error() == kSuccess);
}

TEST_CASE("fake cuda: fill_f32 from generate_ptx() runs end to end", "[fake_cuda]") {
  Fake &f = opened();
  Launch launch(f);
  constexpr int64_t kN = 100003;
  const CUdeviceptr out = alloc(f, kN * sizeof(float));
  REQUIRE(f.cuMemsetD8_v2(out, 0, kN * sizeof(float)) == kSuccess);
  KilnKernelArgs args{};
  args.ptr[0] = out;
  args.num_elements = kN;
  args.iteration_size = kN;
  args.scalar_f64 = 2.5;
  args.num_tasks = 4;  // 4 blocks of 256 threads grid-stride over 100003 elements
  REQUIRE(launch.run("kiln_fill_f32_gpu", args, 4, 256) == kSuccess);
  REQUIRE(f.cuCtxSynchronize() == kSuccess);
  std::vector<float> host(kN, 0.0f);
  REQUIRE(f.cuMemcpyDtoH_v2(host.data(), out, kN * sizeof(float)) == kSuccess);
  CHECK(std::count(host.begin(), host.end(), 2.5f) == kN);
  CHECK(f.launch_count() == 1);
}

TEST_CASE("fake cuda: reduce_sum_i64 writes one partial sum per block", "[fake_cuda]") {
  Fake &f = opened();
  Launch launch(f);
  constexpr int64_t kN = 1000;
  constexpr int64_t kBlocks = 3;
  constexpr int64_t kThreads = 32;
  std::vector<int64_t> x(kN);
  for (int64_t i = 0; i < kN; ++i) x[i] = i;
  const CUdeviceptr in = alloc(f, kN * sizeof(int64_t));
  const CUdeviceptr results = alloc(f, kBlocks * sizeof(KilnTaskResult));
  REQUIRE(f.cuMemcpyHtoD_v2(in, x.data(), kN * sizeof(int64_t)) == kSuccess);
  REQUIRE(f.cuMemsetD8_v2(results, 0, kBlocks * sizeof(KilnTaskResult)) == kSuccess);
  KilnKernelArgs args{};
  args.ptr[0] = in;
  args.num_elements = kN;
  args.iteration_size = kN;
  args.result_buffer = results;
  args.num_tasks = kBlocks;
  REQUIRE(launch.run("kiln_reduce_sum_i64_gpu", args, kBlocks, kThreads) == kSuccess);
  std::vector<KilnTaskResult> slots(kBlocks);
  REQUIRE(f.cuMemcpyDtoH_v2(slots.data(), results, kBlocks * sizeof(KilnTaskResult)) == kSuccess);
  // Grid stride: element i belongs to thread i % 96, i.e. to block (i / 32) % 3.
  std::vector<int64_t> expected(kBlocks, 0);
  for (int64_t i = 0; i < kN; ++i) expected[(i / kThreads) % kBlocks] += x[i];
  int64_t total = 0;
  for (int64_t block = 0; block < kBlocks; ++block) {
    CHECK(static_cast<int64_t>(slots[block].value_bits) == expected[block]);
    total += static_cast<int64_t>(slots[block].value_bits);
  }
  CHECK(total == kN * (kN - 1) / 2);
}

TEST_CASE("fake cuda: reduce_sum with more blocks than result slots records a device assertion",
          "[fake_cuda]") {
  Fake &f = opened();
  Launch launch(f);
  constexpr int64_t kN = 64;
  const CUdeviceptr in = alloc(f, kN * sizeof(float));
  const CUdeviceptr results = alloc(f, sizeof(KilnTaskResult));
  REQUIRE(f.cuMemsetD8_v2(in, 0, kN * sizeof(float)) == kSuccess);
  KilnKernelArgs args{};
  args.ptr[0] = in;
  args.iteration_size = kN;
  args.result_buffer = results;
  args.num_tasks = 1;  // one slot, two blocks: a partial would be lost
  REQUIRE(launch.run("kiln_reduce_sum_f32_gpu", args, 2, 32) == kSuccess);
  KilnRuntime state{};
  REQUIRE(f.cuMemcpyDtoH_v2(&state, launch.runtime, sizeof state) == kSuccess);
  CHECK(state.error_code == KILN_DEVICE_ASSERTION);
  CHECK(state.error_arg0 == 1);  // kiln_gpu::kMoreBlocksThanSlots
  CHECK(state.error_arg1 == 2);
  CHECK(state.error_arg2 == 1);
  CHECK(std::string(state.error_message) == "reduce_sum launched with more blocks than result slots");
}

TEST_CASE("fake cuda: a grid smaller than the data still covers every element (grid stride)",
          "[fake_cuda]") {
  Fake &f = opened();
  Launch launch(f);
  constexpr int64_t kN = 10007;  // prime: no grid divides it
  std::vector<double> x(kN), y(kN);
  for (int64_t i = 0; i < kN; ++i) {
    x[i] = static_cast<double>(i);
    y[i] = 1.0;
  }
  const CUdeviceptr dx = alloc(f, kN * sizeof(double));
  const CUdeviceptr dy = alloc(f, kN * sizeof(double));
  REQUIRE(f.cuMemcpyHtoD_v2(dx, x.data(), kN * sizeof(double)) == kSuccess);
  KilnKernelArgs args{};
  args.ptr[0] = dy;
  args.ptr[1] = dx;
  args.num_elements = kN;
  args.iteration_size = kN;
  args.scalar_f64 = 2.0;
  args.num_tasks = 1;
  for (const auto &[grid, block] : {std::pair{1u, 1u}, {1u, 256u}, {3u, 64u}, {7u, 33u}}) {
    CAPTURE(grid, block);
    REQUIRE(f.cuMemcpyHtoD_v2(dy, y.data(), kN * sizeof(double)) == kSuccess);
    REQUIRE(launch.run("kiln_axpy_f64_gpu", args, grid, block) == kSuccess);
    std::vector<double> out(kN, 0.0);
    REQUIRE(f.cuMemcpyDtoH_v2(out.data(), dy, kN * sizeof(double)) == kSuccess);
    int64_t wrong = 0;
    for (int64_t i = 0; i < kN; ++i) wrong += out[i] == 2.0 * static_cast<double>(i) + 1.0 ? 0 : 1;
    CHECK(wrong == 0);
  }
  SECTION("and a block bigger than the kernels' 256 threads is refused, as .maxntid 256 makes a GPU") {
    CHECK(launch.run("kiln_axpy_f64_gpu", args, 1, 512) == kErrorInvalidValue);
  }
}

TEST_CASE("fake cuda: the tiled matmul covers odd shapes with any grid", "[fake_cuda]") {
  Fake &f = opened();
  Launch launch(f);
  for (const auto &[m, n, k] : {std::tuple{1, 1, 1}, {37, 29, 19}, {16, 32, 17}, {5, 70, 33}}) {
    CAPTURE(m, n, k);
    std::vector<int32_t> a(m * k), b(k * n), expected(m * n, 0);
    for (int i = 0; i < m * k; ++i) a[i] = (i * 7) % 13 - 6;
    for (int i = 0; i < k * n; ++i) b[i] = (i * 5) % 11 - 5;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j)
        for (int p = 0; p < k; ++p) expected[i * n + j] += a[i * k + p] * b[p * n + j];
    const CUdeviceptr dc = alloc(f, m * n * sizeof(int32_t));
    const CUdeviceptr da = alloc(f, m * k * sizeof(int32_t));
    const CUdeviceptr db = alloc(f, k * n * sizeof(int32_t));
    REQUIRE(f.cuMemcpyHtoD_v2(da, a.data(), a.size() * sizeof(int32_t)) == kSuccess);
    REQUIRE(f.cuMemcpyHtoD_v2(db, b.data(), b.size() * sizeof(int32_t)) == kSuccess);
    KilnKernelArgs args{};
    args.ptr[0] = dc;
    args.ptr[1] = da;
    args.ptr[2] = db;
    args.dims[0] = m;
    args.dims[1] = n;
    args.dims[2] = k;
    args.iteration_size = m;
    args.num_tasks = 1;
    for (unsigned grid : {1u, 2u, 64u}) {  // fewer, and more, blocks than tiles
      CAPTURE(grid);
      REQUIRE(f.cuMemsetD8_v2(dc, 0xff, m * n * sizeof(int32_t)) == kSuccess);
      REQUIRE(launch.run("kiln_matmul_i32_gpu", args, grid, 256) == kSuccess);
      std::vector<int32_t> c(m * n);
      REQUIRE(f.cuMemcpyDtoH_v2(c.data(), dc, c.size() * sizeof(int32_t)) == kSuccess);
      CHECK(c == expected);
    }
  }
  SECTION("a block that is not 16x16 threads records a device assertion") {
    const CUdeviceptr d = alloc(f, 4 * sizeof(float));
    KilnKernelArgs args{};
    args.ptr[0] = args.ptr[1] = args.ptr[2] = d;
    args.dims[0] = args.dims[1] = args.dims[2] = 1;
    args.iteration_size = 1;
    args.num_tasks = 1;
    REQUIRE(launch.run("kiln_matmul_f32_gpu", args, 1, 128) == kSuccess);
    KilnRuntime state{};
    REQUIRE(f.cuMemcpyDtoH_v2(&state, launch.runtime, sizeof state) == kSuccess);
    CHECK(state.error_code == KILN_DEVICE_ASSERTION);
    CHECK(state.error_arg0 == 2);  // kiln_gpu::kMatmulBlockShape
    CHECK(state.error_arg1 == 128);
  }
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
