// The vendor math libraries linked into a user module for a GPU: LLVM's back ends lower few of
// exp, log, sin, tanh, pow and their kin themselves (check_device_math has the lists).
//   nvptx:  CUDA's libdevice (libdevice.10.bc, from the CUDA toolkit), functions __nv_expf, ...
//   amdgcn: ROCm's ocml (ocml.bc, from ROCm or Debian's rocm-device-libs), __ocml_exp_f32, ...
// kiln never needs either to build; they are looked for at run time (find_libdevice, find_ocml).
// Private to runtime/.
#ifndef KILN_RUNTIME_JIT_MATH_LIBRARY_H_
#define KILN_RUNTIME_JIT_MATH_LIBRARY_H_

#include <string_view>

#include <llvm/IR/Module.h>

#include "kiln/rhi/result.h"
#include "user_module.h"  // DeviceMath

namespace kiln::runtime {

/// Replaces every call of a math intrinsic `target` cannot lower (check_device_math's list) in
/// `module` with a call of the vendor library's function for it (nvptx: llvm.exp.f32 ->
/// __nv_expf, llvm.tanh.f64 -> __nv_tanh; amdgcn: __ocml_exp_f32, __ocml_tanh_f64) and links
/// those functions from the library file (parsed once per path and process; LLVM IR text or
/// bitcode). NVVMReflect (in the NVPTX pipeline) resolves libdevice's __nvvm_reflect queries: no
/// flush to zero. For ocml, the oclc control constants it reads are defined here: no flush to
/// zero, no unsafe or finite-only math, correctly rounded float32 sqrt, and __oclc_ISA_version
/// from `gfx` ("gfx90a" -> 9010). Does nothing when the module calls none of them or no library
/// is found (check_device_math then refuses the module, saying how to name one). `device` names
/// the device in failures.
/// Errors: not_supported when the file cannot be read or parsed, or lacks a function the module
/// needs (its path and the function named); error when linking fails. Thread-safe.
[[nodiscard]] RhiStatus link_math_library(llvm::Module &module, DeviceMath target, std::string_view gfx,
                                          const char *device);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_JIT_MATH_LIBRARY_H_
