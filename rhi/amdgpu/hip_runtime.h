// The HIP runtime (libamdhip64), opened with dlopen at run time: kiln builds and runs without it.
#ifndef KILN_RHI_HIP_RUNTIME_H_
#define KILN_RHI_HIP_RUNTIME_H_

#include <string>

#include "hip_types.h"
#include "kiln/rhi/result.h"

namespace kiln::hip {

/// The runtime's entry points, one member per row of hip_runtime.inc.
struct HipRuntime {
#define KILN_HIP_ENTRY(ret, name, params) ret (*name) params = nullptr;
#include "hip_runtime.inc"
#undef KILN_HIP_ENTRY
  std::string library;  ///< the path or soname that was opened

  /// Opens the runtime named by KILN_HIP_RUNTIME, else the first of libamdhip64.so,
  /// libamdhip64.so.6, libamdhip64.so.5 that opens, once per process (never closed, so names it
  /// returns stay valid). Errors: not_supported naming the libraries tried and dlerror() when
  /// none opens or one lacks an entry point.
  [[nodiscard]] static RhiExpected<const HipRuntime *> load();
};

/// The ONLY place a hipError_t becomes an RhiResult, by numeric code: success, or the Failure
/// with the runtime's error name. out_of_memory (oom_source driver) for hipErrorOutOfMemory;
/// device_lost for the sticky faults (illegal address, launch failure, ECC, assert, ...);
/// not_supported for no device / invalid device / not initialized / insufficient driver / no
/// binary for the GPU; invalid_usage for invalid value; error with the name for anything else.
[[nodiscard]] RhiStatus to_rhi(const HipRuntime *runtime, hipError_t result, const char *site,
                               std::string device, const AllocationFigures *allocation = nullptr);
/// The runtime's name for a code ("hipErrorOutOfMemory"); a static string.
[[nodiscard]] const char *error_name(const HipRuntime *runtime, hipError_t result);

}  // namespace kiln::hip

#endif  // KILN_RHI_HIP_RUNTIME_H_
