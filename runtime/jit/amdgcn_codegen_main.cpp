// kiln-amdgcn-codegen: the build-time half of the AMDGPU backend. Turns the generic amdgcn
// device-runtime bitcode (cmake/KilnDeviceBitcode.cmake, --target=amdgcn-amd-amdhsa -nogpulib)
// into a relocatable code object for one gfx processor; ld.lld then links it into the HSACO
// that kiln embeds (runtime/CMakeLists.txt) and hipModuleLoadData loads.
//
//   kiln-amdgcn-codegen <input.bc> <gfx processor> <output.o>
//   kiln-amdgcn-codegen --emit-llvm <input.bc> <output.bc>
//
// --emit-llvm stops before code generation: it writes the prepared, optimized module (the same
// entry points, calling convention, visibility and attributes, no target-cpu) as LLVM bitcode,
// optimized for the generic amdgcn processor. A newer LLVM reads LLVM 14 bitcode, so its llc
// turns that module into the object for a processor LLVM 14 predates (gfx1100 with LLVM 16's
// llc-16, runtime/CMakeLists.txt), and ld.lld links it exactly like this tool's objects.
//
// The pipeline is ptx_codegen's (gpu_pipeline.h): every kiln_*_gpu function becomes an entry
// point, every other definition is internalized, O3, verify, emit. An entry point here gets the
// amdgpu_kernel calling convention (clang-14 has no source attribute for it outside OpenCL and
// HIP), protected visibility (so ld.lld exports it and the runtime finds it by name) and
// "amdgpu-flat-work-group-size"="1,<kBlockThreads>": GpuKernelLauncher never launches more than
// kBlockThreads = 256 threads per block, which lets the compiler budget registers for 256.
// The code object version is LLVM 14's default (v4), which ROCm 4.1 and later load.
//
// Exit status 0 on success; 1 with the reason on stderr (unknown processor, bad bitcode, codegen
// error); 2 on bad usage.
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include <llvm/ADT/SmallVector.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/IR/CallingConv.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>

#include "gpu_pipeline.h"

extern "C" void LLVMInitializeAMDGPUTargetInfo();
extern "C" void LLVMInitializeAMDGPUTarget();
extern "C" void LLVMInitializeAMDGPUTargetMC();
extern "C" void LLVMInitializeAMDGPUAsmPrinter();

namespace {

constexpr const char *kTriple = "amdgcn-amd-amdhsa";
constexpr const char *kFlatWorkGroupSize = "1,256";  // GpuKernelLauncher::kBlockThreads

int fail(const std::string &what) {
  std::fprintf(stderr, "kiln-amdgcn-codegen: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char **argv) {
  const bool emit_llvm = argc == 4 && std::string_view(argv[1]) == "--emit-llvm";
  if (argc != 4 || (!emit_llvm && std::string_view(argv[1]).starts_with("-"))) {
    std::fprintf(stderr,
                 "usage: kiln-amdgcn-codegen <input.bc> <gfx processor> <output.o>\n"
                 "       kiln-amdgcn-codegen --emit-llvm <input.bc> <output.bc>\n");
    return 2;
  }
  // --emit-llvm: no processor; the generic one ("") only supplies the data layout and the
  // cost model for the optimizer, and the bitcode names no target-cpu.
  const std::string input = argv[emit_llvm ? 2 : 1], output = argv[3];
  const std::string gfx = emit_llvm ? "" : argv[2];
  LLVMInitializeAMDGPUTargetInfo();
  LLVMInitializeAMDGPUTarget();
  LLVMInitializeAMDGPUTargetMC();
  LLVMInitializeAMDGPUAsmPrinter();
  std::string error;
  const llvm::Target *target = llvm::TargetRegistry::lookupTarget(kTriple, error);
  if (target == nullptr) return fail("this LLVM has no AMDGPU target: " + error);
  std::unique_ptr<llvm::MCSubtargetInfo> info(target->createMCSubtargetInfo(kTriple, "", ""));
  if (!info || (!emit_llvm && !info->isCPUStringValid(gfx)))
    return fail("LLVM " LLVM_VERSION_STRING " does not know the processor " + gfx);
  std::unique_ptr<llvm::TargetMachine> tm(target->createTargetMachine(
      kTriple, gfx, "", llvm::TargetOptions(), llvm::Reloc::PIC_, llvm::None,
      llvm::CodeGenOpt::Aggressive));
  if (!tm)
    return fail("LLVM could not create an AMDGPU target machine for " +
                (emit_llvm ? std::string("the generic processor") : gfx));

  llvm::LLVMContext context;
  auto diagnostics = std::make_unique<kiln::runtime::gpu::DiagnosticCollector>();
  const kiln::runtime::gpu::DiagnosticCollector *collected = diagnostics.get();
  context.setDiagnosticHandler(std::move(diagnostics));
  auto buffer = llvm::MemoryBuffer::getFile(input);
  if (!buffer) return fail("cannot read " + input + ": " + buffer.getError().message());
  auto parsed = llvm::parseBitcodeFile((*buffer)->getMemBufferRef(), context);
  if (!parsed) return fail("cannot parse " + input + ": " + llvm::toString(parsed.takeError()));
  std::unique_ptr<llvm::Module> module = std::move(*parsed);
  module->setTargetTriple(kTriple);
  module->setDataLayout(tm->createDataLayout());
  const int kernels = kiln::runtime::gpu::prepare_entry_points(*module, [](llvm::Function &function) {
    function.setCallingConv(llvm::CallingConv::AMDGPU_KERNEL);
    function.setLinkage(llvm::GlobalValue::ExternalLinkage);
    function.setVisibility(llvm::GlobalValue::ProtectedVisibility);
    function.addFnAttr("amdgpu-flat-work-group-size", kFlatWorkGroupSize);
  });
  if (kernels == 0) return fail(input + " defines no kiln_*_gpu entry point");
  kiln::runtime::gpu::optimize(*module, *tm);
  if (emit_llvm) {
    std::string broken;
    llvm::raw_string_ostream why(broken);
    if (llvm::verifyModule(*module, &why))
      return fail("the optimized module is broken: " + why.str());
    if (!collected->errors.empty()) return fail("optimization failed: " + collected->errors);
    std::error_code ec;
    llvm::raw_fd_ostream out(output, ec, llvm::sys::fs::OF_None);
    if (ec) return fail("cannot write " + output + ": " + ec.message());
    llvm::WriteBitcodeToFile(*module, out);
    out.close();
    if (out.has_error()) return fail("cannot write " + output + ": " + out.error().message());
    return 0;
  }
  llvm::SmallVector<char, 0> object;
  if (llvm::Error e = kiln::runtime::gpu::verify_and_emit(*module, *tm, llvm::CGFT_ObjectFile,
                                                          *collected, object))
    return fail("code generation for " + gfx + " failed: " + llvm::toString(std::move(e)));
  std::error_code ec;
  llvm::raw_fd_ostream out(output, ec, llvm::sys::fs::OF_None);
  if (ec) return fail("cannot write " + output + ": " + ec.message());
  out.write(object.data(), object.size());
  out.close();
  if (out.has_error()) return fail("cannot write " + output + ": " + out.error().message());
  return 0;
}
