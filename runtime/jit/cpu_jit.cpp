// CpuJit: the host device-runtime bitcode, optimized for this CPU and compiled with ORC LLJIT.
// Every llvm::Error is consumed here and becomes a Failure; nothing in this file aborts.
#include "kiln/runtime/cpu_jit.h"

#include "llvm_gpu_pipeline.h"
#include "user_module.h"
#include "kiln/runtime/embedded_code.h"

#include <atomic>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/ExecutionEngine/Orc/ObjectTransformLayer.h>
#include <llvm/ExecutionEngine/Orc/ThreadSafeModule.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Target/TargetMachine.h>

namespace kiln::runtime {
namespace {

constexpr const char *kDevice = "cpu";
constexpr const char *kHeapAllocatorName = "runtime_memory_allocate_aligned";

/// Consumes `error` and turns it into a Failure with code `result`.
Failure llvm_failure(llvm::Error error, const char *site, std::string_view what,
                     RhiResult result = RhiResult::error) {
  return make_failure(result, kDevice, site,
                      std::string(what) + ": " + llvm::toString(std::move(error)));
}

/// Initializes the native target, asm printer and asm parser once per process.
/// Returns false if this LLVM build cannot generate code for the host.
bool initialize_native_target() {
  static std::once_flag once;
  static bool ok = false;
  std::call_once(once, [] {
    ok = !llvm::InitializeNativeTarget() && !llvm::InitializeNativeTargetAsmPrinter() &&
         !llvm::InitializeNativeTargetAsmParser();
  });
  return ok;
}

RhiExpected<std::unique_ptr<llvm::Module>> parse_host_bitcode(llvm::LLVMContext &context) {
  const std::span<const uint8_t> bytes = host_runtime_bitcode();
  const llvm::StringRef data(reinterpret_cast<const char *>(bytes.data()), bytes.size());
  auto module = llvm::parseBitcodeFile(llvm::MemoryBufferRef(data, "kiln_device_runtime_host"),
                                       context);
  if (!module) {
    return std::unexpected(llvm_failure(module.takeError(), "CpuJit::create",
                                        "could not parse the embedded host runtime bitcode"));
  }
  return std::move(*module);
}

/// Retargets `module` to exactly this host: triple, data layout, and every function's CPU and
/// features (clang wrote a generic "x86-64" into each function, which would override the JIT's).
RhiStatus retarget_to_host(llvm::Module &module, const llvm::TargetMachine &tm) {
  const llvm::Triple module_triple(module.getTargetTriple());
  if (module_triple.getArch() != tm.getTargetTriple().getArch()) {
    return std::unexpected(make_failure(
        RhiResult::not_supported, kDevice, "CpuJit::create",
        "the embedded runtime bitcode targets " + module_triple.str() + " but the host is " +
            tm.getTargetTriple().str() + "; rebuild kiln on this host"));
  }
  module.setTargetTriple(tm.getTargetTriple().str());
  module.setDataLayout(tm.createDataLayout());
  for (llvm::Function &function : module) {
    if (function.isDeclaration()) continue;
    function.addFnAttr("target-cpu", tm.getTargetCPU());
    function.addFnAttr("target-features", tm.getTargetFeatureString());
    function.removeFnAttr("tune-cpu");
  }
  return {};
}

/// Names of the kernels the module defines: externally visible "kiln_*" function definitions.
std::set<std::string, std::less<>> collect_kernel_names(const llvm::Module &module) {
  std::set<std::string, std::less<>> names;
  for (const llvm::Function &function : module) {
    if (function.isDeclaration() || function.hasLocalLinkage()) continue;
    if (function.getName().starts_with("kiln_")) names.insert(function.getName().str());
  }
  return names;
}

RhiExpected<llvm::orc::JITTargetMachineBuilder> detect_host() {
  auto builder = llvm::orc::JITTargetMachineBuilder::detectHost();
  if (!builder) {
    return std::unexpected(llvm_failure(builder.takeError(), "CpuJit::create",
                                        "could not detect the host CPU", RhiResult::not_supported));
  }
  builder->setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
  return std::move(*builder);
}

}  // namespace

struct CpuJit::Impl {
  std::atomic<uint64_t> code_size_bytes{0};  // declared first: the JIT's transform writes it
  std::set<std::string, std::less<>> kernel_names;
  std::unique_ptr<llvm::orc::LLJIT> jit;

  /// Resolves a symbol the module defines as a `Fn`; failures become `error` Failures.
  template <class Fn>
  RhiExpected<Fn> lookup(std::string_view name, const char *site) {
    auto address = jit->lookup(llvm::StringRef(name.data(), name.size()));
    if (!address) {
      return std::unexpected(llvm_failure(address.takeError(), site,
                                          "could not resolve " + std::string(name)));
    }
    return address->toPtr<Fn>();
  }
};

namespace {

/// Builds the LLJIT: host target machine, object sizes counted. The process's symbols are
/// visible to the module through LLJIT's own "Process" JITDylib (linked by default).
RhiExpected<std::unique_ptr<llvm::orc::LLJIT>> build_lljit(llvm::orc::JITTargetMachineBuilder host,
                                                           std::atomic<uint64_t> *code_size) {
  auto jit = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(std::move(host)).create();
  if (!jit) {
    return std::unexpected(
        llvm_failure(jit.takeError(), "CpuJit::create", "could not create the LLJIT"));
  }
  (*jit)->getObjTransformLayer().setTransform(
      [code_size](std::unique_ptr<llvm::MemoryBuffer> object)
          -> llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>> {
        code_size->fetch_add(object->getBufferSize(), std::memory_order_relaxed);
        return llvm::Expected<std::unique_ptr<llvm::MemoryBuffer>>(std::move(object));
      });
  // Materialization errors are returned by lookup(); do not also print them to stderr.
  (*jit)->getExecutionSession().setErrorReporter([](llvm::Error error) {
    llvm::consumeError(std::move(error));
  });
  return std::move(*jit);
}

/// Parses, retargets and optimizes the embedded module for the host described by `host`.
RhiExpected<std::unique_ptr<llvm::Module>> prepare_module(llvm::LLVMContext &context,
                                                          llvm::orc::JITTargetMachineBuilder &host) {
  auto tm = host.createTargetMachine();
  if (!tm) {
    return std::unexpected(llvm_failure(tm.takeError(), "CpuJit::create",
                                        "could not create a host target machine",
                                        RhiResult::not_supported));
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<llvm::Module> module, parse_host_bitcode(context));
  KILN_RETURN_IF_ERROR(retarget_to_host(*module, **tm));
  gpu::optimize(*module, **tm);  // the same O3 pipeline as the GPU code generators
  if (llvm::verifyModule(*module, nullptr)) {
    return std::unexpected(make_failure(RhiResult::error, kDevice, "CpuJit::create",
                                        "the optimized host runtime module failed verification"));
  }
  return module;
}

RhiStatus check_native_target() {
  if (initialize_native_target()) return {};
  return std::unexpected(make_failure(RhiResult::not_supported, kDevice, "CpuJit::create",
                                      "LLVM cannot generate code for this host CPU"));
}

/// The JIT of `module` (kernels: its kiln_* definitions), compiled eagerly: the whole module is
/// one materialization unit, so one lookup of `first_symbol` compiles it all, surfaces codegen
/// errors here and makes code_size_bytes() meaningful.
RhiExpected<std::unique_ptr<CpuJit::Impl>> compile(llvm::orc::JITTargetMachineBuilder host,
                                                   std::unique_ptr<llvm::LLVMContext> context,
                                                   std::unique_ptr<llvm::Module> module,
                                                   const char *first_symbol) {
  auto impl = std::make_unique<CpuJit::Impl>();
  impl->kernel_names = collect_kernel_names(*module);
  KILN_ASSIGN_OR_RETURN(impl->jit, build_lljit(std::move(host), &impl->code_size_bytes));
  llvm::orc::ThreadSafeModule safe_module(std::move(module), std::move(context));
  if (llvm::Error error = impl->jit->addIRModule(std::move(safe_module))) {
    return std::unexpected(llvm_failure(std::move(error), "CpuJit::create",
                                        "could not add the module to the JIT"));
  }
  KILN_RETURN_IF_ERROR(impl->lookup<void (*)()>(first_symbol, "CpuJit::create"));
  return impl;
}

}  // namespace

RhiExpected<std::unique_ptr<CpuJit>> CpuJit::create() {
  KILN_RETURN_IF_ERROR(check_native_target());
  KILN_ASSIGN_OR_RETURN(llvm::orc::JITTargetMachineBuilder host, detect_host());
  auto context = std::make_unique<llvm::LLVMContext>();
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<llvm::Module> module, prepare_module(*context, host));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl,
                        compile(std::move(host), std::move(context), std::move(module), kHeapAllocatorName));
  return std::unique_ptr<CpuJit>(new CpuJit(std::move(impl)));
}

RhiExpected<std::unique_ptr<CpuJit>> CpuJit::create_user(std::span<const std::byte> ir,
                                                         std::string_view entry,
                                                         std::span<const UserValueType> params,
                                                         const char *device) {
  KILN_RETURN_IF_ERROR(check_native_target());
  KILN_ASSIGN_OR_RETURN(llvm::orc::JITTargetMachineBuilder host, detect_host());
  auto context = std::make_unique<llvm::LLVMContext>();
  auto diagnostics = std::make_unique<gpu::DiagnosticCollector>();
  const gpu::DiagnosticCollector *collected = diagnostics.get();
  context->setDiagnosticHandler(std::move(diagnostics));  // LLVM's own handler exits on an error
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<llvm::Module> runtime, parse_host_bitcode(*context));
  auto module = prepare_user_module(*context, ir, entry, params, std::move(runtime), device);
  if (!module) {
    if (!collected->errors.empty()) module.error().detail += ": " + collected->errors;
    return std::unexpected(std::move(module).error());
  }
  auto tm = host.createTargetMachine();
  if (!tm)
    return std::unexpected(llvm_failure(tm.takeError(), "CpuJit::create",
                                        "could not create a host target machine",
                                        RhiResult::not_supported));
  KILN_RETURN_IF_ERROR(retarget_to_host(**module, **tm));
  gpu::optimize(**module, **tm);
  if (llvm::verifyModule(**module, nullptr))
    return std::unexpected(make_failure(RhiResult::error, device, "CpuJit::create",
                                        "the optimized user module failed verification"));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl,
                        compile(std::move(host), std::move(context), std::move(*module), kUserEntryName));
  return std::unique_ptr<CpuJit>(new CpuJit(std::move(impl)));
}


CpuJit::CpuJit(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CpuJit::~CpuJit() = default;

RhiExpected<KilnKernelFn> CpuJit::lookup_kernel(std::string_view name) {
  if (!impl_->kernel_names.contains(name)) {
    return std::unexpected(invalid_usage(kDevice, "CpuJit::lookup_kernel",
                                         "no kernel named '" + std::string(name) +
                                             "' in the device runtime (expected kiln_<op>_<dtype>)"));
  }
  return impl_->lookup<KilnKernelFn>(name, "CpuJit::lookup_kernel");
}

RhiExpected<KilnHeapAllocateFn> CpuJit::lookup_heap_allocator() {
  return impl_->lookup<KilnHeapAllocateFn>(kHeapAllocatorName, "CpuJit::lookup_heap_allocator");
}

uint64_t CpuJit::code_size_bytes() const {
  return impl_->code_size_bytes.load(std::memory_order_relaxed);
}

}  // namespace kiln::runtime
