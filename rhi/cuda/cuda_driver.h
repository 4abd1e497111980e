// The CUDA driver, opened with dlopen at run time: kiln builds and runs without it.
#ifndef KILN_RHI_CUDA_DRIVER_H_
#define KILN_RHI_CUDA_DRIVER_H_

#include <string>

#include "cuda_types.h"
#include "kiln/rhi/result.h"

namespace kiln::cuda {

/// The driver's entry points, one member per row of cuda_driver.inc.
struct CudaDriver {
#define KILN_CUDA_ENTRY(name, params) CUresult (*name) params = nullptr;
#include "cuda_driver.inc"
#undef KILN_CUDA_ENTRY
  std::string library;  ///< the path or soname that was opened

  /// Opens the driver named by KILN_CUDA_DRIVER, else libcuda.so.1, once per process (it is
  /// never closed, so names it returns stay valid). Errors: not_supported naming the library
  /// and dlerror() when it cannot be opened or lacks an entry point.
  [[nodiscard]] static RhiExpected<const CudaDriver *> load();
};

/// The ONLY place a CUresult becomes an RhiResult: success, or the Failure with the driver's
/// error name. out_of_memory (oom_source driver) for CUDA_ERROR_OUT_OF_MEMORY; device_lost for
/// the sticky faults; not_supported for no device / not initialized / stub / old driver;
/// invalid_usage for invalid value; error with the name for anything else.
[[nodiscard]] RhiStatus to_rhi(const CudaDriver *driver, CUresult result, const char *site,
                               std::string device, const AllocationFigures *allocation = nullptr);
/// The driver's name for a code ("CUDA_ERROR_OUT_OF_MEMORY"); a static string.
[[nodiscard]] const char *error_name(const CudaDriver *driver, CUresult result);

}  // namespace kiln::cuda

#endif  // KILN_RHI_CUDA_DRIVER_H_
