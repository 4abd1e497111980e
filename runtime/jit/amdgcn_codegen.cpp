// generate_user_hsaco (amdgcn_codegen.h): the embedded amdgcn runtime bitcode + the user module ->
// O3 for one gfx processor -> a relocatable object -> lld -> HSACO. The pipeline is the one the
// build-time kiln-amdgcn-codegen runs for kiln's own code objects (llvm_gpu_pipeline.h). Every
// llvm::Error and every LLVM diagnostic of error severity becomes a Failure; nothing aborts.
#include "kiln/runtime/amdgcn_codegen.h"

#include <cctype>
#include <memory>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include <llvm/ADT/SmallVector.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>

#include "hsaco_linker.h"
#include "llvm_gpu_pipeline.h"
#include "math_library.h"
#include "user_module.h"
#include "kiln/runtime/embedded_code.h"

#if KILN_HAVE_AMDGPU
extern "C" void LLVMInitializeAMDGPUTargetInfo();
extern "C" void LLVMInitializeAMDGPUTarget();
extern "C" void LLVMInitializeAMDGPUTargetMC();
extern "C" void LLVMInitializeAMDGPUAsmPrinter();
extern "C" void LLVMInitializeAMDGPUAsmParser();
#endif

namespace kiln::runtime {
namespace {

constexpr const char *kSite = "generate_user_hsaco";
constexpr const char *kTriple = "amdgcn-amd-amdhsa";

/// Initializes LLVM's AMDGPU target once per process (its asm parser too: the section that
/// carries the user's IR is module-level assembly); nullptr if this LLVM has none.
const llvm::Target *amdgpu_target() {
#if KILN_HAVE_AMDGPU
  static gpu::TargetSlot slot;
  return gpu::initialize_target_once(slot, kTriple, [] {
    LLVMInitializeAMDGPUTargetInfo();
    LLVMInitializeAMDGPUTarget();
    LLVMInitializeAMDGPUTargetMC();
    LLVMInitializeAMDGPUAsmPrinter();
    LLVMInitializeAMDGPUAsmParser();
  });
#else
  return nullptr;
#endif
}

/// An AMDGPU target machine for the processor `gfx`. Errors: not_supported (unknown processor).
RhiExpected<std::unique_ptr<llvm::TargetMachine>> target_machine(const llvm::Target &target, const std::string &gfx,
                                                                const char *device) {
  std::unique_ptr<llvm::MCSubtargetInfo> info(target.createMCSubtargetInfo(kTriple, "", ""));
  if (!info || !info->isCPUStringValid(gfx))
    return std::unexpected(make_failure(RhiResult::not_supported, device, kSite,
                                        "LLVM " LLVM_VERSION_STRING " cannot generate code for the processor " + gfx));
  std::unique_ptr<llvm::TargetMachine> tm(target.createTargetMachine(
      kTriple, gfx, "", llvm::TargetOptions(), llvm::Reloc::PIC_, std::nullopt, llvm::CodeGenOptLevel::Aggressive));
  if (!tm)
    return std::unexpected(make_failure(RhiResult::error, device, kSite,
                                        "LLVM could not create an AMDGPU target machine for " + gfx));
  return tm;
}

/// The embedded runtime bitcode, parsed into `context` and set up for `tm`.
RhiExpected<std::unique_ptr<llvm::Module>> runtime_module(llvm::LLVMContext &context, llvm::TargetMachine &tm,
                                                          const char *device) {
  const std::span<const uint8_t> bytes = amdgcn_runtime_bitcode();
  const llvm::StringRef data(reinterpret_cast<const char *>(bytes.data()), bytes.size());
  auto parsed = llvm::parseBitcodeFile(llvm::MemoryBufferRef(data, "kiln_device_runtime_amdgcn"), context);
  if (!parsed)
    return std::unexpected(make_failure(RhiResult::error, device, kSite,
                                        "could not parse the embedded amdgcn runtime bitcode: " +
                                            llvm::toString(parsed.takeError())));
  std::unique_ptr<llvm::Module> module = std::move(*parsed);
  module->setTargetTriple(kTriple);
  module->setDataLayout(tm.createDataLayout());
  return module;
}

/// `text` as the operand of an assembler .ascii directive: letters, digits and a few marks as
/// they are, every other byte as a three-digit octal escape.
std::string ascii_operand(std::string_view text) {
  std::string out = "\"";
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == ' ' || c == '_' || c == '-' || c == '.' || c == '/')
      out.push_back(c);
    else
      out += fmt::format("\\{:03o}", u);
  }
  return out + "\"";
}

/// Appends module-level assembly that puts user_module_comment's text in kUserModuleSection, a
/// section with no flags: not allocated, so the loader never copies it to the device.
void add_user_module_section(llvm::Module &module, std::span<const std::byte> ir, std::string_view entry,
                             std::span<const UserValueType> params) {
  module.appendModuleInlineAsm(fmt::format(".pushsection {},\"\",@progbits\n.ascii {}\n.popsection",
                                           kUserModuleSection,
                                           ascii_operand(user_module_comment(ir, entry, params))));
}

}  // namespace

bool can_generate_hsaco() {
  return amdgpu_target() != nullptr && !amdgcn_runtime_bitcode().empty() && have_hsaco_linker();
}

RhiExpected<std::vector<std::byte>> generate_user_hsaco(std::span<const std::byte> ir, std::string_view entry,
                                                        std::span<const UserValueType> params,
                                                        std::string_view target, const char *device) {
  const llvm::Target *amdgpu = amdgpu_target();
  if (amdgpu == nullptr || amdgcn_runtime_bitcode().empty())
    return std::unexpected(make_failure(RhiResult::not_supported, device, kSite,
                                        "this kiln was built with an LLVM that has no AMDGPU target; rebuild "
                                        "against an LLVM with AMDGPU"));
  if (!have_hsaco_linker()) return std::unexpected(link_hsaco({}, device).error());  // not_supported, with the fix
  // Only the processors kiln builds its own code objects for (KILN_AMDGPU_TARGETS): the device
  // runtime is compiled and tested for those, and a device kiln has no code object for cannot run
  // kiln anyway. (LLVM knows more, some it cannot compile kiln for: gfx600, *-generic.)
  if (auto built = amdgcn_code_object(target); !built) {
    built.error().device = device;
    return std::unexpected(std::move(built).error());
  }
  const std::string gfx(target.substr(0, target.find(':')));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<llvm::TargetMachine> tm, target_machine(*amdgpu, gfx, device));
  llvm::LLVMContext context;
  auto diagnostics = std::make_unique<gpu::DiagnosticCollector>();
  gpu::DiagnosticCollector *collected = diagnostics.get();
  context.setDiagnosticHandler(std::move(diagnostics));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<llvm::Module> runtime, runtime_module(context, *tm, device));
  auto module = prepare_user_module(context, ir, entry, params, std::move(runtime), device, /*gpu_entry=*/true);
  if (!module) {
    if (!collected->errors.empty()) module.error().detail += ": " + collected->errors;
    return std::unexpected(std::move(module).error());
  }
  KILN_RETURN_IF_ERROR(link_math_library(**module, DeviceMath::amdgcn, gfx, device));  // ocml's tanh, exp, ...
  KILN_RETURN_IF_ERROR(check_device_math(**module, DeviceMath::amdgcn, device));
  gpu::prepare_entry_points(**module, gpu::mark_amdgpu_kernel);  // the GPU entry a kernel, the rest internal
  gpu::optimize(**module, *tm);
  add_user_module_section(**module, ir, entry, params);
  llvm::SmallVector<char, 0> object;
  if (llvm::Error e = gpu::verify_and_emit(**module, *tm, llvm::CodeGenFileType::ObjectFile, *collected, object))
    return std::unexpected(make_failure(RhiResult::error, device, kSite,
                                        fmt::format("code generation for {} failed: {}", gfx,
                                                    llvm::toString(std::move(e)))));
  return link_hsaco(object, device);
}

}  // namespace kiln::runtime
