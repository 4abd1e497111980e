// The one hipError_t -> RhiResult mapping (rhi/amdgpu/hip_status.cpp): HIP's codes in the GPU
// status matrix (gpu_status_matrix.h), by the numbers of hip_runtime_api.h (not kiln's own
// constants, so a wrong constant shows); the runtime loader, and the AMDGPU backend on whatever HIP
// runtime this machine has (Debian's libamdhip64 in CI, which finds no device): always
// NotSupported carrying the runtime's own answer, never a crash.
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "gpu_status_matrix.h"
#include "hip_runtime.h"
#include "kiln/executor/errors.h"
#include "kiln/executor/executor.h"
#include "kiln/rhi/amdgpu_device.h"

using namespace kiln;
using namespace kiln::hip;

namespace {

const kiln::test::GpuStatusTable &hip_status() {
  static const kiln::test::GpuStatusTable table{
      .device = "amdgpu:0",
      .site = "hipTest",
      .to_rhi = [](int code, const char *site, const char *device) { return to_rhi(nullptr, code, site, device); },
      .success = 0,  // hipSuccess
      .out_of_memory = {2, "hipErrorOutOfMemory"},
      // IllegalAddress, LaunchFailure, Assert, ECCNotCorrectable, LaunchTimeOut, ContextIsDestroyed,
      // PriorLaunchFailure.
      .sticky = {700, 719, 710, 214, 702, 709, 53},
      .sticky_names = {{700, "hipErrorIllegalAddress"}, {719, "hipErrorLaunchFailure"}},
      // NoDevice, InvalidDevice, NotInitialized, InsufficientDriver, NoBinaryForGpu, NotSupported.
      .absent = {100, 101, 3, 35, 209, 801},
      .absent_names = {{100, "hipErrorNoDevice"}, {101, "hipErrorInvalidDevice"}},
      .errors = {{1, "hipErrorInvalidValue"}, {200, "hipErrorInvalidImage"}, {500, "hipErrorNotFound"}},
      .not_allocating_site = "hipModuleLaunchKernel",
  };
  return table;
}

}  // namespace

KILN_GPU_STATUS_MATRIX(hip_status, "amdgpu")

TEST_CASE("without a HIP runtime the amdgpu backend is not_supported, naming the library",
          "[amdgpu]") {
  setenv("KILN_HIP_RUNTIME", "/nonexistent/libamdhip64.so", 1);
  auto device = create_amdgpu_device(0);
  ExecutorConfig config;
  config.backend = Backend::amdgpu;
  auto ex = LlvmRuntimeExecutor::create(config);
  unsetenv("KILN_HIP_RUNTIME");
  REQUIRE_FALSE(device);
  CHECK(device.error().result == RhiResult::not_supported);
  CHECK_THAT(device.error().message(), Catch::Contains("/nonexistent/libamdhip64.so"));
  REQUIRE_FALSE(ex);
  CHECK(classify(ex.error()) == ErrorKind::not_supported);
}

TEST_CASE("the machine's HIP runtime without an AMD GPU is NotSupported with its own answer",
          "[amdgpu]") {
  unsetenv("KILN_HIP_RUNTIME");
  auto runtime = HipRuntime::load();
  ExecutorConfig config;
  config.backend = Backend::amdgpu;
  auto ex = LlvmRuntimeExecutor::create(config);
  if (!runtime) {  // no libamdhip64 here: the loader's answer names what it tried
    WARN("no HIP runtime installed: " << runtime.error().message());
    REQUIRE_FALSE(ex);
    CHECK(classify(ex.error()) == ErrorKind::not_supported);
    CHECK_THAT(ex.error().message(), Catch::Contains("libamdhip64.so.5"));
    return;
  }
  INFO("HIP runtime " << (*runtime)->library);
  if (ex) {
    WARN("this machine has an AMD GPU: " << (*ex)->device().name());
    return;
  }
  CHECK(classify(ex.error()) == ErrorKind::not_supported);
  const std::string answer = ex.error().driver_status;
  CHECK_THAT(answer, Catch::StartsWith("hipError"));  // the runtime's own answer, by name
  CHECK_THAT(ex.error().message(), Catch::Contains(answer) && Catch::Contains("libamdhip64"));
}
