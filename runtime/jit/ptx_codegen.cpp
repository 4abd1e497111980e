// generate_ptx: the embedded nvptx64 runtime bitcode -> kernels annotated -> O3 for the chosen SM
// version -> PTX text, with the pipeline shared with the amdgcn generator (llvm_gpu_pipeline.h).
// Every llvm::Error and every LLVM diagnostic of error severity is consumed here and becomes a
// Failure; nothing in this file aborts.
#include "kiln/runtime/ptx_codegen.h"

#include <charconv>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <utility>

#include <llvm/ADT/SmallString.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/Config/llvm-config.h>
#include <llvm/IR/Constants.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Metadata.h>
#include <llvm/IR/Module.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>

#include "math_library.h"
#include "llvm_gpu_pipeline.h"
#include "user_module.h"
#include "kiln/runtime/kernel_abi.h"
#include "kiln/rhi/fork_hooks.h"
#include "kiln/runtime/embedded_code.h"

#if KILN_HAVE_NVPTX
extern "C" void LLVMInitializeNVPTXTargetInfo();
extern "C" void LLVMInitializeNVPTXTarget();
extern "C" void LLVMInitializeNVPTXTargetMC();
extern "C" void LLVMInitializeNVPTXAsmPrinter();
#endif

namespace kiln::runtime {

std::optional<int> parse_sm_version(std::string_view arch) {
  if (!arch.starts_with("sm_")) return std::nullopt;
  std::string_view digits = arch.substr(3);
  if (!digits.empty() && (digits.back() == 'a' || digits.back() == 'f')) digits.remove_suffix(1);
  int version = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), version);
  if (digits.empty() || ec != std::errc() || end != digits.data() + digits.size() ||
      version <= 0 || version > 10000) {
    return std::nullopt;
  }
  return version;
}

namespace {

constexpr const char *kDevice = "cuda";
constexpr const char *kSite = "generate_ptx";
constexpr const char *kTriple = "nvptx64-nvidia-cuda";

Failure llvm_failure(llvm::Error error, std::string_view what) {
  return make_failure(RhiResult::error, kDevice, kSite,
                      std::string(what) + ": " + llvm::toString(std::move(error)));
}

/// The lowest PTX ISA version (times 10) that can target sm_<version>, from the PTX ISA
/// reference's "PTX ISA version required" table, never below LLVM's lowest, ptx32.
int min_ptx_version(int sm_version) {
  struct Row {
    int sm;
    int ptx;
  };
  static constexpr Row kTable[] = {
      {20, 32}, {30, 32}, {32, 40}, {35, 32}, {37, 41}, {50, 40}, {52, 41}, {53, 42},
      {60, 50}, {61, 50}, {62, 50}, {70, 60}, {72, 61}, {75, 63}, {80, 70}, {86, 71},
      {87, 74}, {89, 78}, {90, 78}, {100, 86}, {101, 86}, {120, 87},
  };
  int ptx = 32;
  for (const Row &row : kTable) {
    if (row.sm <= sm_version) ptx = row.ptx;
  }
  return ptx;
}

/// Initializes LLVM's NVPTX target once per process; nullptr if this LLVM has none.
const llvm::Target *nvptx_target() {
#if KILN_HAVE_NVPTX
  static gpu::TargetSlot slot;
  return gpu::initialize_target_once(slot, kTriple, [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
  });
#else
  return nullptr;
#endif
}

/// The newest SM version <= `requested` that this LLVM can emit, or nullopt.
std::optional<int> supported_sm_version(const llvm::Target &target, int requested) {
  std::unique_ptr<llvm::MCSubtargetInfo> info(target.createMCSubtargetInfo(kTriple, "", ""));
  if (!info) return std::nullopt;
  for (int version = requested; version >= 10; --version) {
    if (info->isCPUStringValid("sm_" + std::to_string(version))) return version;
  }
  return std::nullopt;
}

/// Makes every defined kiln_*_gpu function a kernel (nvvm.annotations) and internalizes every
/// other definition (gpu::prepare_entry_points). Returns the number of kernels.
int annotate_kernels(llvm::Module &module) {
  llvm::LLVMContext &context = module.getContext();
  llvm::NamedMDNode *annotations = module.getOrInsertNamedMetadata("nvvm.annotations");
  llvm::Type *i32 = llvm::Type::getInt32Ty(context);
  return gpu::prepare_entry_points(module, [&](llvm::Function &function) {
    llvm::Metadata *operands[] = {llvm::ValueAsMetadata::get(&function),
                                  llvm::MDString::get(context, "kernel"),
                                  llvm::ConstantAsMetadata::get(llvm::ConstantInt::get(i32, 1))};
    annotations->addOperand(llvm::MDNode::get(context, operands));
    // .maxntid 256: GpuKernelLauncher never launches more (kBlockThreads), the kernels' shared
    // arrays hold 256 per-thread slots (gpu_kernels.h), and ptxas budgets registers for 256.
    llvm::Metadata *max_threads[] = {llvm::ValueAsMetadata::get(&function),
                                     llvm::MDString::get(context, "maxntidx"),
                                     llvm::ConstantAsMetadata::get(llvm::ConstantInt::get(i32, 256))};
    annotations->addOperand(llvm::MDNode::get(context, max_threads));
  });
}

/// An NVPTX target machine for sm_<sm_version> at the lowest PTX ISA version it needs.
RhiExpected<std::unique_ptr<llvm::TargetMachine>> target_machine(const llvm::Target &target, int sm_version) {
  const std::string cpu = "sm_" + std::to_string(sm_version);
  const std::string features = "+ptx" + std::to_string(min_ptx_version(sm_version));
  std::unique_ptr<llvm::TargetMachine> tm(target.createTargetMachine(
      kTriple, cpu, features, llvm::TargetOptions(), llvm::Reloc::PIC_, std::nullopt,
      llvm::CodeGenOptLevel::Aggressive));
  if (!tm) {
    return std::unexpected(make_failure(RhiResult::error, kDevice, kSite,
                                        "LLVM could not create an NVPTX target machine for " + cpu));
  }
  return tm;
}

/// The embedded nvptx runtime bitcode, parsed into `context` and set up for `tm`.
RhiExpected<std::unique_ptr<llvm::Module>> runtime_module(llvm::LLVMContext &context, llvm::TargetMachine &tm) {
  const std::span<const uint8_t> bytes = nvptx_runtime_bitcode();
  const llvm::StringRef data(reinterpret_cast<const char *>(bytes.data()), bytes.size());
  auto parsed =
      llvm::parseBitcodeFile(llvm::MemoryBufferRef(data, "kiln_device_runtime_nvptx"), context);
  if (!parsed) {
    return std::unexpected(
        llvm_failure(parsed.takeError(), "could not parse the embedded nvptx runtime bitcode"));
  }
  std::unique_ptr<llvm::Module> module = std::move(*parsed);
  module->setTargetTriple(kTriple);
  module->setDataLayout(tm.createDataLayout());
  return module;
}

/// O3 for `tm`, then PTX text.
RhiExpected<std::string> optimize_and_emit(llvm::Module &module, llvm::TargetMachine &tm,
                                           const gpu::DiagnosticCollector &collected) {
  gpu::optimize(module, tm);
  llvm::SmallString<0> ptx;
  if (llvm::Error error = gpu::verify_and_emit(module, tm, llvm::CodeGenFileType::AssemblyFile, collected, ptx)) {
    return std::unexpected(llvm_failure(std::move(error), "PTX emission for " + tm.getTargetCPU().str() + " failed"));
  }
  return std::string(ptx.data(), ptx.size());
}

/// The whole pipeline for one SM version (the caller validated it against this LLVM).
RhiExpected<std::string> emit_ptx(const llvm::Target &target, int sm_version) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<llvm::TargetMachine> tm, target_machine(target, sm_version));
  llvm::LLVMContext context;
  auto diagnostics = std::make_unique<gpu::DiagnosticCollector>();
  gpu::DiagnosticCollector *collected = diagnostics.get();
  context.setDiagnosticHandler(std::move(diagnostics));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<llvm::Module> module, runtime_module(context, *tm));
  if (annotate_kernels(*module) == 0) {
    return std::unexpected(make_failure(
        RhiResult::error, kDevice, kSite,
        "the embedded nvptx runtime bitcode defines no kiln_*_gpu entry point; rebuild kiln"));
  }
  return optimize_and_emit(*module, *tm, *collected);
}

/// The SM version to emit for `sm_arch` on this LLVM. Errors: as generate_ptx's.
RhiExpected<std::pair<const llvm::Target *, int>> pick_sm_version(std::string_view sm_arch) {
  const std::optional<int> requested = parse_sm_version(sm_arch);
  if (!requested) {
    return std::unexpected(invalid_usage(kDevice, kSite,
                                         "'" + std::string(sm_arch) +
                                             "' is not an SM version; expected sm_<digits>, "
                                             "e.g. sm_80"));
  }
  const llvm::Target *target = nvptx_target();
  if (target == nullptr || nvptx_runtime_bitcode().empty()) {
    return std::unexpected(make_failure(RhiResult::not_supported, kDevice, kSite,
                                        "this kiln was built with an LLVM that has no NVPTX "
                                        "target; rebuild against an LLVM with NVPTX"));
  }
  const std::optional<int> sm_version = supported_sm_version(*target, *requested);
  if (!sm_version) {
    return std::unexpected(make_failure(RhiResult::not_supported, kDevice, kSite,
                                        "LLVM " LLVM_VERSION_STRING " cannot emit PTX for " +
                                            std::string(sm_arch) + " or any older SM version"));
  }
  return std::pair{target, *sm_version};
}

}  // namespace

RhiExpected<std::string> generate_user_ptx(std::span<const std::byte> ir, std::string_view entry,
                                           std::span<const UserValueType> params, std::string_view sm_arch,
                                           const char *device) {
  KILN_ASSIGN_OR_RETURN(const auto picked, pick_sm_version(sm_arch));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<llvm::TargetMachine> tm, target_machine(*picked.first, picked.second));
  llvm::LLVMContext context;
  auto diagnostics = std::make_unique<gpu::DiagnosticCollector>();
  gpu::DiagnosticCollector *collected = diagnostics.get();
  context.setDiagnosticHandler(std::move(diagnostics));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<llvm::Module> runtime, runtime_module(context, *tm));
  auto module = prepare_user_module(context, ir, entry, params, std::move(runtime), device, /*gpu_entry=*/true);
  if (!module) {
    if (!collected->errors.empty()) module.error().detail += ": " + collected->errors;
    return std::unexpected(std::move(module).error());
  }
  KILN_RETURN_IF_ERROR(link_math_library(**module, DeviceMath::nvptx, {}, device));  // libdevice's exp, tanh, ...
  KILN_RETURN_IF_ERROR(check_device_math(**module, DeviceMath::nvptx, device));
  annotate_kernels(**module);  // the entry point a kernel, everything else internal
  KILN_ASSIGN_OR_RETURN(std::string ptx, optimize_and_emit(**module, *tm, *collected));
  return ptx + user_module_comment(ir, entry, params);
}

RhiExpected<std::string> generate_ptx(std::string_view sm_arch) {
  KILN_ASSIGN_OR_RETURN(const auto picked, pick_sm_version(sm_arch));
  const auto [target, sm_version] = picked;
  // One generation per SM version per process; the lock also serializes first generations. Held
  // across fork() (a fork waits for a generation in progress), so a child never inherits it
  // locked; never destroyed, as a thread may still generate at exit.
  static auto *mutex = new ForkSafeMutex(ForkSafeMutex::Policy::hold_across_fork);
  static std::map<int, std::string> cache;
  const std::lock_guard lock(*mutex);
  if (const auto it = cache.find(sm_version); it != cache.end()) return it->second;
  KILN_ASSIGN_OR_RETURN(std::string ptx, emit_ptx(*target, sm_version));
  cache.emplace(sm_version, ptx);
  return ptx;
}

}  // namespace kiln::runtime
