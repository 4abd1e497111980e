// The one hipError_t -> RhiResult mapping (rhi/amdgpu/hip_status.cpp), the runtime loader, and
// the AMDGPU backend on whatever HIP runtime this machine has (Debian's libamdhip64 in CI, which
// finds no device): always NotSupported carrying the runtime's own answer, never a crash.
#include <cstdlib>
#include <string>

#include <catch2/catch.hpp>

#include "hip_runtime.h"
#include "kiln/executor/errors.h"
#include "kiln/executor/executor.h"
#include "kiln/rhi/amdgpu_device.h"

using namespace kiln;
using namespace kiln::hip;

namespace {
Failure map(hipError_t code) {
  auto status = to_rhi(nullptr, code, "hipTest", "amdgpu:0");
  REQUIRE_FALSE(status);
  return status.error();
}
}  // namespace

TEST_CASE("hipSuccess maps to success", "[amdgpu][status]") {
  CHECK(to_rhi(nullptr, kSuccess, "hipTest", "amdgpu:0"));
}

TEST_CASE("hipErrorOutOfMemory (2) is a driver out_of_memory", "[amdgpu][status]") {
  const Failure f = map(2);
  CHECK(f.result == RhiResult::out_of_memory);
  CHECK(f.oom_source == OomSource::driver);
  CHECK(std::string(f.driver_status) == "hipErrorOutOfMemory");
  CHECK(classify(f) == ErrorKind::device_out_of_memory);
}

TEST_CASE("sticky HIP faults are device_lost", "[amdgpu][status]") {
  // hipErrorIllegalAddress, LaunchFailure, Assert, ECCNotCorrectable, LaunchTimeOut,
  // ContextIsDestroyed, PriorLaunchFailure: numeric values of hip_runtime_api.h.
  for (hipError_t code : {700, 719, 710, 214, 702, 709, 53}) {
    INFO("code " << code);
    CHECK(map(code).result == RhiResult::device_lost);
    CHECK(classify(map(code)) == ErrorKind::device_lost);
  }
  CHECK(std::string(map(700).driver_status) == "hipErrorIllegalAddress");
  CHECK(std::string(map(719).driver_status) == "hipErrorLaunchFailure");
}

TEST_CASE("absent runtimes and devices are not_supported", "[amdgpu][status]") {
  // NoDevice, InvalidDevice, NotInitialized, InsufficientDriver, NoBinaryForGpu, NotSupported.
  for (hipError_t code : {100, 101, 3, 35, 209, 801}) {
    INFO("code " << code);
    CHECK(map(code).result == RhiResult::not_supported);
  }
  CHECK(std::string(map(100).driver_status) == "hipErrorNoDevice");
  CHECK(std::string(map(101).driver_status) == "hipErrorInvalidDevice");
}

TEST_CASE("a runtime code is error with its name and number, hipErrorInvalidValue too",
          "[amdgpu][status]") {
  CHECK(map(1).result == RhiResult::error);
  CHECK(std::string(map(1).driver_status) == "hipErrorInvalidValue");
  CHECK(map(200).result == RhiResult::error);
  CHECK(std::string(map(200).driver_status) == "hipErrorInvalidImage");
  CHECK(map(500).result == RhiResult::error);
  const Failure unknown = map(12345);
  CHECK(unknown.result == RhiResult::error);
  CHECK_THAT(unknown.message(), Catch::Contains("12345") && Catch::Contains("hipTest"));
}

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

TEST_CASE("hipErrorOutOfMemory from a launch is no allocation of 0 B", "[hip][status]") {
  auto status = to_rhi(nullptr, kErrorOutOfMemory, "hipModuleLaunchKernel", "amdgpu:0");
  REQUIRE_FALSE(status);
  CHECK_FALSE(status.error().allocating);
  CHECK_THAT(status.error().message(),
             Catch::StartsWith("amdgpu:0 ran out of memory in hipModuleLaunchKernel") &&
                 !Catch::Contains("0 B") && !Catch::Contains("ndarray"));
}
