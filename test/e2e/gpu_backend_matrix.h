// The GPU-backend matrix of the end-to-end tests: one body per behaviour (gpu_backend_matrix.cpp),
// run once per backend registered against its fake driver, as IREE's CTS runs one suite per driver.
// A backend registers itself in its own file (test_cuda_ops.cpp, test_amdgpu_ops.cpp) by
// describing its fake driver in a GpuBackendCase and writing KILN_GPU_BACKEND_MATRIX(fn, "tag");
// that file also holds the cases only that backend has (PTX targets, gfx code objects...).
// A backend whose fake driver is not built or does not load is skipped, saying why.
#ifndef KILN_TEST_E2E_GPU_BACKEND_MATRIX_H_
#define KILN_TEST_E2E_GPU_BACKEND_MATRIX_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "fake_gpu_handle.h"
#include "kiln/executor/executor.h"
#include "suite.h"

namespace kiln::test {

/// One GPU backend as the matrix sees it: kiln's names for it and its fake driver's names for
/// the entry points and answers the matrix uses.
struct GpuBackendCase {
  const char *name;          // "cuda": the device prefix and the Catch2 tag
  Backend backend;
  CodegenArch arch;
  const char *fake_library;  // the fake driver's path; nullptr when it is not built
  const char *driver_env;    // the variable kiln's loader reads: KILN_CUDA_DRIVER, KILN_HIP_RUNTIME
  const char *fake_prefix;   // the fake's control API prefix: "kiln_fake_cuda_"
  const char *alloc_entry;   // cuMemAlloc_v2, hipMalloc
  const char *launch_entry;  // cuLaunchKernel, hipModuleLaunchKernel
  const char *context_entry; // the call made before every driver use: cuCtxSetCurrent, hipSetDevice
  const char *device_reset_entry;  // called when the last user of a lost device lets go (or nullptr)
  const char *module_unload_entry; // cuModuleUnload, hipModuleUnload
  int out_of_memory_code;
  const char *out_of_memory_status;
  int illegal_address_code;
  const char *illegal_address_status;
  /// The fake's no-device modes and what kiln's message must say for each: the driver's answer
  /// by name, or (CUDA's nodevice: cuDeviceGetCount succeeds with 0) the count it reported.
  std::vector<std::pair<const char *, const char *>> unsupported_modes;

  /// The fake driver, reset, kiln's loader pointed at it (opened once per process); nullptr with
  /// a WARN saying why when the fake is not built or does not load: the caller then skips.
  FakeGpu *fake_or_skip() const;
  /// kiln-ops options for this backend with an 8 MiB device heap and arrays up to `max_array_bytes`.
  ops::SuiteOptions suite_options(uint64_t max_array_bytes) const;
};

/// Arms kind=lost at `ex`'s next request and makes one (a 16-float ndarray): it must fail
/// device_lost, marked injected, and leave the device lost.
void lose_the_device_by_injection(LlvmRuntimeExecutor &ex);

namespace gpu_matrix {
void ops_cases_all_ok(const GpuBackendCase &b);
void driver_oom_at_every_allocation(const GpuBackendCase &b);
void driver_answer_names_the_request(const GpuBackendCase &b);
void illegal_address_at_a_launch(const GpuBackendCase &b);
void sticky_fault_fails_fast(const GpuBackendCase &b);
void no_device_is_not_supported(const GpuBackendCase &b);
void lost_device_recovers_once_arrays_let_go(const GpuBackendCase &b);
void recreate_releases_a_lost_executor_first(const GpuBackendCase &b);
void injected_loss_gives_everything_back(const GpuBackendCase &b);
void two_devices_at_once(const GpuBackendCase &b);
}  // namespace gpu_matrix

}  // namespace kiln::test

/// Registers the matrix for the backend `backend_fn()` returns (a `const GpuBackendCase &`), each
/// case tagged [`tag`][e2e] plus its behaviour's tag. Use once, in the backend's own test file.
#define KILN_GPU_BACKEND_MATRIX(backend_fn, tag)                                                    \
  TEST_CASE("kiln-ops cases on " tag " against the fake driver are all OK", "[" tag "][e2e]") {     \
    ::kiln::test::gpu_matrix::ops_cases_all_ok(backend_fn());                                       \
  }                                                                                                 \
  TEST_CASE(tag ": the driver's out-of-memory at any allocation ends OK or DeviceOutOfMemoryError", \
            "[" tag "][e2e][fault]") {                                                              \
    ::kiln::test::gpu_matrix::driver_oom_at_every_allocation(backend_fn());                         \
  }                                                                                                 \
  TEST_CASE(tag ": the driver's answer to an allocation names the bytes asked for and not "         \
                "the class",                                                                        \
            "[" tag "][e2e][fault]") {                                                              \
    ::kiln::test::gpu_matrix::driver_answer_names_the_request(backend_fn());                        \
  }                                                                                                 \
  TEST_CASE(tag ": an illegal address at a launch is DeviceLostError and later cases fail fast",    \
            "[" tag "][e2e][lost]") {                                                               \
    ::kiln::test::gpu_matrix::illegal_address_at_a_launch(backend_fn());                            \
  }                                                                                                 \
  TEST_CASE(tag ": after a sticky fault kiln fails fast without calling the driver again",          \
            "[" tag "][e2e][lost]") {                                                               \
    ::kiln::test::gpu_matrix::sticky_fault_fails_fast(backend_fn());                                \
  }                                                                                                 \
  TEST_CASE(tag ": a driver with no device is NotSupported naming the library and its answer",      \
            "[" tag "][e2e]") {                                                                     \
    ::kiln::test::gpu_matrix::no_device_is_not_supported(backend_fn());                             \
  }                                                                                                 \
  TEST_CASE(tag ": after a lost device a new executor recovers once the old one and its arrays "    \
                "let go",                                                                           \
            "[" tag "][e2e][lost]") {                                                               \
    ::kiln::test::gpu_matrix::lost_device_recovers_once_arrays_let_go(backend_fn());                \
  }                                                                                                 \
  TEST_CASE(tag ": recreate_executor releases a lost executor before making the new one",           \
            "[" tag "][e2e][lost]") {                                                               \
    ::kiln::test::gpu_matrix::recreate_releases_a_lost_executor_first(backend_fn());                \
  }                                                                                                 \
  TEST_CASE(tag ": an injected kind=lost still frees every block and unloads the module, with no " \
                "device reset",                                                                     \
            "[" tag "][e2e][lost][fault_kinds]") {                                                  \
    ::kiln::test::gpu_matrix::injected_loss_gives_everything_back(backend_fn());                    \
  }                                                                                                 \
  TEST_CASE(tag ": executors on devices 0 and 1 at once, each with its own memory; device 2 of 2 " \
                "is NotSupported",                                                                  \
            "[" tag "][e2e][devices]") {                                                            \
    ::kiln::test::gpu_matrix::two_devices_at_once(backend_fn());                                    \
  }

#endif  // KILN_TEST_E2E_GPU_BACKEND_MATRIX_H_
