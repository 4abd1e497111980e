// What the LLVM code generators share (ptx_codegen.cpp at run time, amdgcn_codegen_main.cpp
// at build time; cpu_jit.cpp uses the O3 pipeline too): turning the generic device-runtime bitcode into a module whose kiln_*_gpu
// functions are the only entry points, the O3 pipeline, verification, and emission with LLVM's
// error diagnostics collected instead of printed. Private to runtime/; returns llvm::Error, so
// the build-time tool needs nothing but LLVM.
#ifndef KILN_RUNTIME_JIT_LLVM_GPU_PIPELINE_H_
#define KILN_RUNTIME_JIT_LLVM_GPU_PIPELINE_H_

#include <mutex>
#include <string>

#include <llvm/ADT/STLFunctionalExtras.h>
#include <llvm/ADT/SmallVector.h>
#include <llvm/IR/DiagnosticInfo.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/CodeGen.h>
#include <llvm/Support/Error.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Target/TargetMachine.h>

namespace kiln::runtime::gpu {

/// Collects error-severity diagnostics (codegen reports some of its errors this way) instead of
/// letting LLVM print them or exit. Install with LLVMContext::setDiagnosticHandler.
struct DiagnosticCollector final : llvm::DiagnosticHandler {
  std::string errors;
  bool handleDiagnostics(const llvm::DiagnosticInfo &info) override;
};

/// Strips the per-function target-cpu / target-features / tune-cpu clang wrote (they would
/// override the target machine's), calls `mark_kernel` on every defined kiln_*_gpu function and
/// internalizes every other definition, so O3 inlines the range kernels into the entry points
/// and drops what no entry point uses. Returns the number of kernels.
int prepare_entry_points(llvm::Module &module, llvm::function_ref<void(llvm::Function &)> mark_kernel);

/// Makes `function` an AMDGPU kernel as kiln launches it: the amdgpu_kernel calling convention
/// (clang has no source attribute for it outside OpenCL and HIP), external linkage and protected
/// visibility (ld.lld exports it, the runtime finds it by name), and
/// "amdgpu-flat-work-group-size"="1,256": GpuKernelLauncher never launches more than
/// kBlockThreads = 256 threads per block, which lets the compiler budget registers for 256.
void mark_amdgpu_kernel(llvm::Function &function);

/// The O3 module pipeline for `tm`, loop and SLP vectorization on.
void optimize(llvm::Module &module, llvm::TargetMachine &tm);

/// Verifies `module` and emits it as `type` into `out`. Errors: verification failure, a target
/// that cannot emit `type`, or error diagnostics collected by `diagnostics` (with their text).
[[nodiscard]] llvm::Error verify_and_emit(llvm::Module &module, llvm::TargetMachine &tm,
                                          llvm::CodeGenFileType type,
                                          const DiagnosticCollector &diagnostics,
                                          llvm::SmallVectorImpl<char> &out);

/// A target's one-time registration: `initialize` (its LLVMInitialize*() calls) runs once per
/// slot, then `triple` is looked up. Returns the target, or nullptr if it is not registered.
struct TargetSlot {
  std::once_flag once;
  const llvm::Target *target = nullptr;
};
const llvm::Target *initialize_target_once(TargetSlot &slot, const char *triple, void (*initialize)());

}  // namespace kiln::runtime::gpu

#endif  // KILN_RUNTIME_JIT_LLVM_GPU_PIPELINE_H_
