// The one CUresult -> RhiResult mapping (rhi/cuda/cuda_status.cpp).
#include <catch2/catch.hpp>

#include "cuda_driver.h"
#include "kiln/executor/errors.h"

using namespace kiln;
using namespace kiln::cuda;

namespace {
Failure map(CUresult code) {
  auto status = to_rhi(nullptr, code, "cuTest", "cuda:0");
  REQUIRE_FALSE(status);
  return status.error();
}
}  // namespace

TEST_CASE("CUDA success maps to success", "[cuda][status]") {
  CHECK(to_rhi(nullptr, kSuccess, "cuTest", "cuda:0"));
}

TEST_CASE("CUDA_ERROR_OUT_OF_MEMORY is a driver out_of_memory", "[cuda][status]") {
  const Failure f = map(kErrorOutOfMemory);
  CHECK(f.result == RhiResult::out_of_memory);
  CHECK(f.oom_source == OomSource::driver);
  CHECK(std::string(f.driver_status) == "CUDA_ERROR_OUT_OF_MEMORY");
  CHECK(classify(f) == ErrorKind::device_out_of_memory);
}

TEST_CASE("sticky CUDA faults are device_lost", "[cuda][status]") {
  for (CUresult code : {kErrorIllegalAddress, kErrorAssert, kErrorLaunchFailed, kErrorIllegalInstruction,
                        kErrorMisalignedAddress, kErrorHardwareStackError, kErrorEccUncorrectable,
                        kErrorInvalidPc, kErrorInvalidAddressSpace, kErrorLaunchTimeout}) {
    INFO("code " << code);
    CHECK(map(code).result == RhiResult::device_lost);
  }
  CHECK(std::string(map(kErrorIllegalAddress).driver_status) == "CUDA_ERROR_ILLEGAL_ADDRESS");
}

TEST_CASE("absent drivers and devices are not_supported", "[cuda][status]") {
  for (CUresult code : {kErrorNoDevice, kErrorNotInitialized, kErrorStubLibrary,
                        kErrorInsufficientDriver, kErrorInvalidDevice, kErrorDeinitialized}) {
    INFO("code " << code);
    CHECK(map(code).result == RhiResult::not_supported);
  }
  CHECK(std::string(map(kErrorStubLibrary).driver_status) == "CUDA_ERROR_STUB_LIBRARY");
}

TEST_CASE("a driver code is error with its name, invalid value too (kiln checked the values)",
          "[cuda][status]") {
  CHECK(map(kErrorInvalidValue).result == RhiResult::error);
  CHECK(std::string(map(kErrorInvalidValue).driver_status) == "CUDA_ERROR_INVALID_VALUE");
  const Failure unknown = map(12345);
  CHECK(unknown.result == RhiResult::error);
  CHECK_THAT(unknown.message(), Catch::Contains("12345") && Catch::Contains("cuTest"));
  CHECK(map(kErrorInvalidPtx).result == RhiResult::error);
  CHECK(std::string(map(kErrorInvalidPtx).driver_status) == "CUDA_ERROR_INVALID_PTX");
}

TEST_CASE("without a driver library the cuda backend is not_supported, naming the library",
          "[cuda]") {
  setenv("KILN_CUDA_DRIVER", "/nonexistent/libcuda-missing.so", 1);
  auto driver = CudaDriver::load();
  unsetenv("KILN_CUDA_DRIVER");
  REQUIRE_FALSE(driver);
  CHECK(driver.error().result == RhiResult::not_supported);
  CHECK_THAT(driver.error().message(), Catch::Contains("/nonexistent/libcuda-missing.so"));
}

TEST_CASE("CUDA_ERROR_OUT_OF_MEMORY from a copy is no allocation of 0 B", "[cuda][status]") {
  auto status = to_rhi(nullptr, kErrorOutOfMemory, "cuMemcpyHtoD_v2", "cuda:0");
  REQUIRE_FALSE(status);
  CHECK_FALSE(status.error().allocating);
  CHECK_THAT(status.error().message(),
             Catch::StartsWith("cuda:0 ran out of memory in cuMemcpyHtoD_v2") &&
                 !Catch::Contains("0 B") && !Catch::Contains("ndarray"));
}
