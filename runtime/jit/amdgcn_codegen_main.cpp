// kiln-amdgcn-codegen: the build-time half of the AMDGPU backend. Turns the generic amdgcn
// device-runtime bitcode (cmake/KilnDeviceBitcode.cmake, clang-19 --target=amdgcn-amd-amdhsa
// -nogpulib -mcode-object-version=5) into a relocatable code object for one gfx processor;
// ld.lld-19 then links it into the HSACO that kiln embeds (cmake/KilnAmdgpuCodeObjects.cmake)
// and hipModuleLoadData loads.
//
//   kiln-amdgcn-codegen <input.bc> <gfx processor> <output.o>
//
// The pipeline is ptx_codegen's (llvm_gpu_pipeline.h): every kiln_*_gpu function becomes an
// entry point (gpu::mark_amdgpu_kernel), every other definition is internalized, O3, verify, emit.
// The code object version is the one the bitcode's "amdhsa_code_object_version" module flag
// names (clang wrote 500: v5, ELF ABI version 3); a bitcode without the flag is refused, so the
// version never silently follows LLVM's default.
//
// Exit status 0 on success; 1 with the reason on stderr (unknown processor, bad bitcode, codegen
// error); 2 on bad usage.
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>

#include <llvm/ADT/SmallVector.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>

#include "llvm_gpu_pipeline.h"

extern "C" void LLVMInitializeAMDGPUTargetInfo();
extern "C" void LLVMInitializeAMDGPUTarget();
extern "C" void LLVMInitializeAMDGPUTargetMC();
extern "C" void LLVMInitializeAMDGPUAsmPrinter();

namespace {

constexpr const char *kTriple = "amdgcn-amd-amdhsa";
constexpr uint64_t kCodeObjectVersion = 500;           // v5, as the module flag spells it

int fail(const std::string &what) {
  std::fprintf(stderr, "kiln-amdgcn-codegen: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 4 || std::string_view(argv[1]).starts_with("-")) {
    std::fprintf(stderr, "usage: kiln-amdgcn-codegen <input.bc> <gfx processor> <output.o>\n");
    return 2;
  }
  const std::string input = argv[1], gfx = argv[2], output = argv[3];
  LLVMInitializeAMDGPUTargetInfo();
  LLVMInitializeAMDGPUTarget();
  LLVMInitializeAMDGPUTargetMC();
  LLVMInitializeAMDGPUAsmPrinter();
  std::string error;
  const llvm::Target *target = llvm::TargetRegistry::lookupTarget(kTriple, error);
  if (target == nullptr) return fail("this LLVM has no AMDGPU target: " + error);
  std::unique_ptr<llvm::MCSubtargetInfo> info(target->createMCSubtargetInfo(kTriple, "", ""));
  if (!info || !info->isCPUStringValid(gfx))
    return fail("LLVM " LLVM_VERSION_STRING " does not know the processor " + gfx);
  std::unique_ptr<llvm::TargetMachine> tm(target->createTargetMachine(
      kTriple, gfx, "", llvm::TargetOptions(), llvm::Reloc::PIC_, std::nullopt,
      llvm::CodeGenOptLevel::Aggressive));
  if (!tm) return fail("LLVM could not create an AMDGPU target machine for " + gfx);

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
  const int kernels = kiln::runtime::gpu::prepare_entry_points(*module, kiln::runtime::gpu::mark_amdgpu_kernel);
  if (kernels == 0) return fail(input + " defines no kiln_*_gpu entry point");
  const auto *version = llvm::mdconst::extract_or_null<llvm::ConstantInt>(
      module->getModuleFlag("amdhsa_code_object_version"));
  if (version == nullptr || version->getZExtValue() != kCodeObjectVersion)
    return fail(input + " does not name code object v5 (module flag amdhsa_code_object_version "
                "500; compile it with -mcode-object-version=5)");
  kiln::runtime::gpu::optimize(*module, *tm);
  llvm::SmallVector<char, 0> object;
  if (llvm::Error e = kiln::runtime::gpu::verify_and_emit(
          *module, *tm, llvm::CodeGenFileType::ObjectFile, *collected, object))
    return fail("code generation for " + gfx + " failed: " + llvm::toString(std::move(e)));
  std::error_code ec;
  llvm::raw_fd_ostream out(output, ec, llvm::sys::fs::OF_None);
  if (ec) return fail("cannot write " + output + ": " + ec.message());
  out.write(object.data(), object.size());
  out.close();
  if (out.has_error()) return fail("cannot write " + output + ": " + out.error().message());
  return 0;
}
