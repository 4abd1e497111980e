// The one CUresult -> RhiResult mapping (rhi/cuda/cuda_status.cpp): CUDA's codes in the GPU
// status matrix (gpu_status_matrix.h), and the driver loader.
#include <catch2/catch.hpp>

#include "cuda_driver.h"
#include "gpu_status_matrix.h"
#include "kiln/executor/errors.h"

using namespace kiln;
using namespace kiln::cuda;

namespace {

const kiln::test::GpuStatusTable &cuda_status() {
  static const kiln::test::GpuStatusTable table{
      .device = "cuda:0",
      .site = "cuTest",
      .to_rhi = [](int code, const char *site, const char *device) { return to_rhi(nullptr, code, site, device); },
      .success = kSuccess,
      .out_of_memory = {kErrorOutOfMemory, "CUDA_ERROR_OUT_OF_MEMORY"},
      .sticky = {kErrorIllegalAddress, kErrorAssert, kErrorLaunchFailed, kErrorIllegalInstruction,
                 kErrorMisalignedAddress, kErrorHardwareStackError, kErrorEccUncorrectable,
                 kErrorInvalidPc, kErrorInvalidAddressSpace, kErrorLaunchTimeout},
      .sticky_names = {{kErrorIllegalAddress, "CUDA_ERROR_ILLEGAL_ADDRESS"}},
      .absent = {kErrorNoDevice, kErrorNotInitialized, kErrorStubLibrary, kErrorInsufficientDriver,
                 kErrorInvalidDevice, kErrorDeinitialized},
      .absent_names = {{kErrorStubLibrary, "CUDA_ERROR_STUB_LIBRARY"}},
      .errors = {{kErrorInvalidValue, "CUDA_ERROR_INVALID_VALUE"}, {kErrorInvalidPtx, "CUDA_ERROR_INVALID_PTX"}},
      .not_allocating_site = "cuMemcpyHtoD_v2",
  };
  return table;
}

}  // namespace

KILN_GPU_STATUS_MATRIX(cuda_status, "cuda")

TEST_CASE("without a driver library the cuda backend is not_supported, naming the library",
          "[cuda]") {
  setenv("KILN_CUDA_DRIVER", "/nonexistent/libcuda-missing.so", 1);
  auto driver = CudaDriver::load();
  unsetenv("KILN_CUDA_DRIVER");
  REQUIRE_FALSE(driver);
  CHECK(driver.error().result == RhiResult::not_supported);
  CHECK_THAT(driver.error().message(), Catch::Contains("/nonexistent/libcuda-missing.so"));
}
