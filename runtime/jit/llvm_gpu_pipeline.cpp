#include "llvm_gpu_pipeline.h"

#include <llvm/IR/CallingConv.h>
#include <llvm/IR/DiagnosticPrinter.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/raw_ostream.h>

namespace kiln::runtime::gpu {

bool DiagnosticCollector::handleDiagnostics(const llvm::DiagnosticInfo &info) {
  if (info.getSeverity() == llvm::DS_Error) {
    llvm::raw_string_ostream os(errors);
    if (!errors.empty()) os << "; ";
    llvm::DiagnosticPrinterRawOStream printer(os);
    info.print(printer);
  }
  return true;  // handled: nothing is printed
}

int prepare_entry_points(llvm::Module &module, llvm::function_ref<void(llvm::Function &)> mark_kernel) {
  int kernels = 0;
  for (llvm::Function &function : module) {
    function.removeFnAttr("target-cpu");
    function.removeFnAttr("target-features");
    function.removeFnAttr("tune-cpu");
    if (function.isDeclaration()) continue;
    const llvm::StringRef name = function.getName();
    if (name.starts_with("kiln_") && name.ends_with("_gpu")) {
      mark_kernel(function);
      ++kernels;
    } else {
      function.setLinkage(llvm::GlobalValue::InternalLinkage);
    }
  }
  return kernels;
}

void mark_amdgpu_kernel(llvm::Function &function) {
  function.setCallingConv(llvm::CallingConv::AMDGPU_KERNEL);
  function.setLinkage(llvm::GlobalValue::ExternalLinkage);
  function.setVisibility(llvm::GlobalValue::ProtectedVisibility);
  function.addFnAttr("amdgpu-flat-work-group-size", "1,256");  // GpuKernelLauncher::kBlockThreads
}

void optimize(llvm::Module &module, llvm::TargetMachine &tm) {
  llvm::PipelineTuningOptions tuning;
  tuning.LoopVectorization = true;
  tuning.SLPVectorization = true;
  llvm::PassBuilder builder(&tm, tuning);
  llvm::LoopAnalysisManager loop_analyses;
  llvm::FunctionAnalysisManager function_analyses;
  llvm::CGSCCAnalysisManager cgscc_analyses;
  llvm::ModuleAnalysisManager module_analyses;
  builder.registerModuleAnalyses(module_analyses);
  builder.registerCGSCCAnalyses(cgscc_analyses);
  builder.registerFunctionAnalyses(function_analyses);
  builder.registerLoopAnalyses(loop_analyses);
  builder.crossRegisterProxies(loop_analyses, function_analyses, cgscc_analyses, module_analyses);
  llvm::ModulePassManager passes =
      builder.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
  passes.run(module, module_analyses);
}

llvm::Error verify_and_emit(llvm::Module &module, llvm::TargetMachine &tm,
                            llvm::CodeGenFileType type, const DiagnosticCollector &diagnostics,
                            llvm::SmallVectorImpl<char> &out) {
  std::string verifier_text;
  llvm::raw_string_ostream verifier_os(verifier_text);
  if (llvm::verifyModule(module, &verifier_os))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "the optimized module failed verification: " + verifier_os.str());
  llvm::raw_svector_ostream os(out);
  // Code generation still runs on the legacy pass manager: in LLVM 19 TargetMachine's new-PM
  // codegen pipeline (buildCodeGenPipeline) is experimental and NVPTX does not implement it.
  // Every IR pipeline (optimize above) is the new pass manager's.
  llvm::legacy::PassManager codegen;
  if (tm.addPassesToEmitFile(codegen, os, nullptr, type))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "the target cannot emit this kind of file");
  codegen.run(module);
  if (!diagnostics.errors.empty())
    return llvm::createStringError(llvm::inconvertibleErrorCode(), diagnostics.errors);
  return llvm::Error::success();
}

const llvm::Target *initialize_target_once(TargetSlot &slot, const char *triple, void (*initialize)()) {
  std::call_once(slot.once, [&] {
    initialize();
    std::string ignored;
    slot.target = llvm::TargetRegistry::lookupTarget(triple, ignored);
  });
  return slot.target;
}

}  // namespace kiln::runtime::gpu
