// The fake CUDA driver loaded with dlopen() the way kiln loads a driver, for the tests in this
// folder (test_fake_cuda_*.cpp): every entry point and control function resolved from one handle,
// a fresh or opened fake per test, and one launch's device memory.
#ifndef KILN_TEST_FAKE_CUDA_TEST_SUPPORT_H_
#define KILN_TEST_FAKE_CUDA_TEST_SUPPORT_H_

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "cuda_types.h"
#include "fake_cuda_control.h"
#include "kiln/runtime/kernel_abi.h"
#include "kiln/runtime/ptx_codegen.h"

namespace kiln::fake_cuda_test {

inline constexpr std::size_t kMiB = std::size_t{1} << 20;

// The control functions the tests call: X(member), exported as kiln_fake_cuda_<member>.
#define KILN_FAKE_CUDA_TEST_CONTROL(X)                                                            \
  X(reset) X(set_capacity_bytes) X(set_other_process_bytes) X(inject_fault) X(set_mode)           \
  X(call_count) X(held_bytes) X(high_water_bytes) X(allocation_count) X(module_bytes)             \
  X(oom_count) X(launch_count) X(sticky_error) X(config_error) X(device_count)                    \
  X(device_held_bytes) X(device_capacity_bytes) X(device_oom_count) X(device_sticky_error)        \
  X(device_contexts)

/// Every entry point of cuda_driver.inc and the control API, resolved from one dlopen handle.
struct Fake {
#define KILN_CUDA_ENTRY(name, params) CUresult(*name) params = nullptr;
#include "cuda_driver.inc"
#undef KILN_CUDA_ENTRY
#define KILN_FAKE_CUDA_MEMBER(name) decltype(&kiln_fake_cuda_##name) name = nullptr;
  KILN_FAKE_CUDA_TEST_CONTROL(KILN_FAKE_CUDA_MEMBER)
#undef KILN_FAKE_CUDA_MEMBER
};

template <class Fn>
void resolve(void *handle, const char *name, Fn *fn) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (*fn == nullptr) FAIL("libkiln_fake_cuda.so does not export " << name);
}

/// The fake, loaded once for the whole test binary.
inline Fake &fake() {
  static Fake loaded = [] {
    void *handle = dlopen(KILN_FAKE_CUDA_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) FAIL("dlopen(" KILN_FAKE_CUDA_LIBRARY ") failed: " << dlerror());
    Fake f;
#define KILN_CUDA_ENTRY(name, params) resolve(handle, #name, &f.name);
#include "cuda_driver.inc"
#undef KILN_CUDA_ENTRY
#define KILN_FAKE_CUDA_RESOLVE(name) resolve(handle, "kiln_fake_cuda_" #name, &f.name);
    KILN_FAKE_CUDA_TEST_CONTROL(KILN_FAKE_CUDA_RESOLVE)
#undef KILN_FAKE_CUDA_RESOLVE
    // The kernels compiled into the fake must not leak into the process's symbol space.
    if (dlsym(handle, "kiln_axpy_f32") != nullptr) FAIL("the fake exports its host kernels");
    return f;
  }();
  return loaded;
}

/// Clears the KILN_FAKE_CUDA_* environment, resets the fake, and sets `env` (name=value pairs).
inline Fake &fresh(std::vector<std::pair<const char *, const char *>> env = {}) {
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
inline Fake &opened(std::vector<std::pair<const char *, const char *>> env = {}) {
  Fake &f = fresh(std::move(env));
  REQUIRE(f.cuInit(0) == kiln::cuda::kSuccess);
  CUdevice device = -1;
  REQUIRE(f.cuDeviceGet(&device, 0) == kiln::cuda::kSuccess);
  CUcontext context = nullptr;
  REQUIRE(f.cuDevicePrimaryCtxRetain(&context, device) == kiln::cuda::kSuccess);
  REQUIRE(f.cuCtxSetCurrent(context) == kiln::cuda::kSuccess);
  return f;
}

inline CUdeviceptr alloc(Fake &f, std::size_t size_bytes) {
  CUdeviceptr ptr = 0;
  REQUIRE(f.cuMemAlloc_v2(&ptr, size_bytes) == kiln::cuda::kSuccess);
  return ptr;
}

/// The PTX of generate_ptx(), generated once.
inline const std::string &ptx() {
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

  /// The runtime block as the launches left it: its error fields record a device assertion.
  KilnRuntime runtime_state() {
    KilnRuntime state{};
    REQUIRE(f.cuMemcpyDtoH_v2(&state, runtime, sizeof state) == kiln::cuda::kSuccess);
    return state;
  }
};

}  // namespace kiln::fake_cuda_test

#endif  // KILN_TEST_FAKE_CUDA_TEST_SUPPORT_H_
