// CUDA's libdevice (libdevice.10.bc: the math library nvcc links, from the CUDA toolkit) linked
// into a user module for NVPTX, so that exp, log, sin, tanh, pow and their kin compile: LLVM's
// NVPTX back end lowers none of them itself. kiln never needs the toolkit to build; libdevice is
// looked for at run time. Private to runtime/.
#ifndef KILN_RUNTIME_JIT_LIBDEVICE_H_
#define KILN_RUNTIME_JIT_LIBDEVICE_H_

#include <llvm/IR/Module.h>

#include "kiln/rhi/result.h"
#include "kiln/runtime/ptx_codegen.h"  // find_libdevice

namespace kiln::runtime {

/// Replaces every call of a math intrinsic NVPTX cannot lower (check_device_math's list) in
/// `module` with a call of libdevice's function for it (llvm.exp.f32 -> __nv_expf, llvm.tanh.f64
/// -> __nv_tanh, ...) and links those functions from the file find_libdevice names (parsed once
/// per path and process; LLVM IR text or bitcode), internal, so O3 inlines them. NVVMReflect
/// (in the NVPTX pass pipeline) then resolves libdevice's __nvvm_reflect queries: no flush to zero.
/// Does nothing when the module calls none of them or no libdevice is found (check_device_math
/// then refuses the module, naming KILN_LIBDEVICE). `device` names the device in failures.
/// Errors: not_supported when the file cannot be read or parsed, or lacks a function the module
/// needs (its path and the function named); error when linking fails. Thread-safe.
[[nodiscard]] RhiStatus link_libdevice(llvm::Module &module, const char *device);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_JIT_LIBDEVICE_H_
