// prepare_user_module (user_module.h): a user's LLVM IR, checked whole before it is compiled.
#include "user_module.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <llvm/AsmParser/Parser.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/InstrTypes.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Linker/Linker.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/raw_ostream.h>

#include "kiln/runtime/kernel_abi.h"

namespace kiln::runtime {
namespace {

constexpr const char *kSite = "user kernel";

/// The functions of the device runtime a user module may call (kernel_abi.h).
constexpr std::string_view kAbiFunctions[] = {"kiln_index", "kiln_count", "kiln_heap_allocate",
                                              "kiln_assert"};

/// A failure of the module's code (KernelCompileError in Python).
Failure usage(const char *device, std::string detail) {
  Failure f = invalid_usage(device, kSite, std::move(detail));
  f.kernel_compile = true;
  return f;
}

/// "line 3, column 7: expected type\n  %x = fadd flaot %a, %b\n            ^": where the text
/// does not parse, with the line and a caret under the column.
std::string parse_failure(const llvm::SMDiagnostic &diagnostic) {
  std::string where = fmt::format("line {}, column {}: {}", diagnostic.getLineNo(),
                                  diagnostic.getColumnNo() + 1, diagnostic.getMessage().str());
  const std::string line = diagnostic.getLineContents().str();
  if (!line.empty() && diagnostic.getColumnNo() >= 0)
    where += fmt::format("\n  {}\n  {}^", line, std::string(static_cast<std::size_t>(diagnostic.getColumnNo()), ' '));
  return where;
}

RhiExpected<std::unique_ptr<llvm::Module>> parse(llvm::LLVMContext &context,
                                                 std::span<const std::byte> ir, const char *device) {
  const auto *begin = reinterpret_cast<const unsigned char *>(ir.data());
  if (llvm::isBitcode(begin, begin + ir.size())) {
    const llvm::StringRef data(reinterpret_cast<const char *>(ir.data()), ir.size());
    auto module = llvm::parseBitcodeFile(llvm::MemoryBufferRef(data, "user module"), context);
    if (!module)
      return std::unexpected(usage(device, "the bitcode does not parse: " +
                                               llvm::toString(module.takeError())));
    return std::move(*module);
  }
  const std::string text(reinterpret_cast<const char *>(ir.data()), ir.size());  // NUL-terminated
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos)
    return std::unexpected(usage(device, fmt::format("the IR text holds a NUL byte at offset {} (neither "
                                                     "LLVM IR text nor bitcode)",
                                                     nul)));
  llvm::SMDiagnostic diagnostic;
  std::unique_ptr<llvm::Module> module = llvm::parseAssemblyString(text, diagnostic, context);
  if (!module) {
    Failure f = usage(device, "the IR does not parse: " + parse_failure(diagnostic));
    f.source_line = static_cast<uint32_t>(std::max(diagnostic.getLineNo(), 0));
    f.source_column = static_cast<uint32_t>(std::max(diagnostic.getColumnNo() + 1, 0));
    return std::unexpected(std::move(f));
  }
  return module;
}

RhiStatus verify(const llvm::Module &module, const char *device) {
  std::string message;
  llvm::raw_string_ostream out(message);
  if (!llvm::verifyModule(module, &out)) return {};
  out.flush();
  const std::size_t end = message.find('\n');
  return std::unexpected(usage(device, "the module does not verify: " + message.substr(0, end)));
}

llvm::Type *llvm_type(llvm::LLVMContext &context, UserValueType type) {
  switch (type) {
    case UserValueType::ptr: return llvm::PointerType::get(context, 0);
    case UserValueType::f32: return llvm::Type::getFloatTy(context);
    case UserValueType::f64: return llvm::Type::getDoubleTy(context);
    case UserValueType::i32: return llvm::Type::getInt32Ty(context);
    case UserValueType::i64: return llvm::Type::getInt64Ty(context);
  }
  return nullptr;
}

std::string type_text(const llvm::Type *type) {
  std::string text;
  llvm::raw_string_ostream out(text);
  type->print(out);
  return out.str();
}

/// "void (ptr, ptr, float)": the signature `params` declare.
std::string declared_signature(std::span<const UserValueType> params) {
  std::string text = "void (ptr";
  for (const UserValueType p : params) text.append(", ").append(llvm_spelling(p));
  return text + ")";
}

RhiExpected<llvm::Function *> check_entry(llvm::Module &module, std::string_view entry,
                                          std::span<const UserValueType> params, const char *device) {
  llvm::Function *f = module.getFunction(llvm::StringRef(entry.data(), entry.size()));
  if (f == nullptr || f->isDeclaration()) {
    std::string defined;
    for (const llvm::Function &g : module)
      if (!g.isDeclaration()) defined += (defined.empty() ? "@" : ", @") + g.getName().str();
    return std::unexpected(usage(device, fmt::format("the module defines no function @{}{}", entry,
                                                     defined.empty() ? "" : "; it defines " + defined)));
  }
  llvm::FunctionType *type = f->getFunctionType();
  bool matches = !type->isVarArg() && type->getReturnType()->isVoidTy() &&
                 type->getNumParams() == params.size() + 1 && type->getParamType(0)->isPointerTy();
  for (std::size_t i = 0; matches && i < params.size(); ++i)
    matches = type->getParamType(static_cast<unsigned>(i + 1)) == llvm_type(module.getContext(), params[i]);
  if (!matches)
    return std::unexpected(usage(device, fmt::format("@{} has type {}, but its parameters declare {} (the "
                                                     "first parameter is the element's context)",
                                                     entry, type_text(type), declared_signature(params))));
  return f;
}

/// Whether `f` calls inline assembly (native code kiln cannot check).
bool calls_inline_asm(const llvm::Function &f) {
  for (const llvm::BasicBlock &block : f)
    for (const llvm::Instruction &instruction : block)
      if (const auto *call = llvm::dyn_cast<llvm::CallBase>(&instruction); call != nullptr && call->isInlineAsm())
        return true;
  return false;
}

/// What the module may call: the ABI's functions (declared with the runtime's types) and LLVM's
/// target-independent intrinsics other than the traps; what it may not declare: an external
/// global (the CPU JIT would bind it to any symbol of the process); and what it may not define: a
/// name of the runtime's, kiln_user_entry, an ifunc, module-level or inline assembly.
RhiStatus check_symbols(const llvm::Module &module, const llvm::Module &runtime, const char *device) {
  if (!module.getModuleInlineAsm().empty())
    return std::unexpected(usage(device, "the module holds module-level assembly, which kiln cannot check; a user "
                                         "kernel is LLVM IR only"));
  if (!module.ifunc_empty())
    return std::unexpected(usage(device, fmt::format("the module defines the ifunc @{}; a user kernel defines "
                                                     "plain functions only",
                                                     module.ifuncs().begin()->getName().str())));
  for (const llvm::GlobalVariable &g : module.globals()) {
    if (g.isDeclaration())  // resolved by the JIT from the process: any host symbol, even a function
      return std::unexpected(usage(device, fmt::format("the module declares the external global @{}; a user "
                                                       "kernel defines its globals (kiln provides none)",
                                                       g.getName().str())));
    if (!g.hasLocalLinkage() && runtime.getNamedValue(g.getName()) != nullptr)
      return std::unexpected(usage(device, fmt::format("the module defines @{}, a name of kiln's device runtime; "
                                                       "rename it",
                                                       g.getName().str())));
  }
  for (const llvm::Function &f : module) {
    if (f.getIntrinsicID() == llvm::Intrinsic::trap || f.getIntrinsicID() == llvm::Intrinsic::debugtrap ||
        f.getIntrinsicID() == llvm::Intrinsic::ubsantrap)
      return std::unexpected(usage(device, fmt::format("the module calls @{}, which would end the process; "
                                                       "report a failure with kiln_assert instead",
                                                       f.getName().str())));
    if (!f.isDeclaration() && calls_inline_asm(f))
      return std::unexpected(usage(device, fmt::format("@{} holds inline assembly, which kiln cannot check; "
                                                       "a user kernel is LLVM IR only",
                                                       f.getName().str())));
    const std::string name = f.getName().str();
    const llvm::Function *theirs = runtime.getFunction(f.getName());
    if (!f.isDeclaration()) {
      if (name == kUserEntryName || (theirs != nullptr && !theirs->isDeclaration()))
        return std::unexpected(usage(device, fmt::format("the module defines @{}, a name of kiln's device "
                                                         "runtime; rename it",
                                                         name)));
      continue;
    }
    if (f.isIntrinsic()) {
      if (f.getIntrinsicID() == llvm::Intrinsic::not_intrinsic)
        return std::unexpected(usage(device, fmt::format("the module calls @{}, which is no LLVM 19 intrinsic",
                                                         name)));
      if (f.isTargetIntrinsic())  // nvvm, amdgcn, x86...: one back end's only, and the fakes run the host's
        return std::unexpected(usage(device, fmt::format("the module calls @{}, an intrinsic of one target; a user "
                                                         "kernel runs on every device, so it uses kiln_index, "
                                                         "kiln_count and target-independent intrinsics only",
                                                         name)));
      continue;
    }
    if (std::find(std::begin(kAbiFunctions), std::end(kAbiFunctions), name) == std::end(kAbiFunctions))
      return std::unexpected(usage(device, fmt::format("the module calls @{}, which kiln does not provide: a "
                                                       "user kernel may call kiln_index, kiln_count, "
                                                       "kiln_heap_allocate, kiln_assert and LLVM "
                                                       "intrinsics (@llvm.sqrt.f32, ...)",
                                                       name)));
    if (theirs == nullptr || theirs->getFunctionType() != f.getFunctionType())
      return std::unexpected(usage(device, fmt::format("@{} is declared {}; kiln's is {}", name,
                                                       type_text(f.getFunctionType()),
                                                       theirs ? type_text(theirs->getFunctionType()) : "?")));
  }
  return {};
}

/// Gives every integer division and remainder of the user's functions a defined result where
/// LLVM leaves it undefined and a CPU traps (SIGFPE): by 0 the result is 0, and a signed
/// INT_MIN / -1 wraps (-x; remainder 0), as the operation language defines them.
void guard_integer_division(llvm::Module &module) {
  std::vector<llvm::BinaryOperator *> divisions;
  for (llvm::Function &f : module)
    for (llvm::BasicBlock &block : f)
      for (llvm::Instruction &instruction : block)
        if (auto *op = llvm::dyn_cast<llvm::BinaryOperator>(&instruction))
          if (op->getOpcode() == llvm::Instruction::SDiv || op->getOpcode() == llvm::Instruction::UDiv ||
              op->getOpcode() == llvm::Instruction::SRem || op->getOpcode() == llvm::Instruction::URem)
            divisions.push_back(op);
  for (llvm::BinaryOperator *op : divisions) {
    const bool is_signed = op->getOpcode() == llvm::Instruction::SDiv || op->getOpcode() == llvm::Instruction::SRem;
    const bool is_division = op->getOpcode() == llvm::Instruction::SDiv || op->getOpcode() == llvm::Instruction::UDiv;
    llvm::Value *x = op->getOperand(0), *d = op->getOperand(1);
    llvm::Type *type = op->getType();
    llvm::IRBuilder<> b(op);
    llvm::Value *zero = b.CreateICmpEQ(d, llvm::Constant::getNullValue(type));
    llvm::Value *minus_one = is_signed ? b.CreateICmpEQ(d, llvm::Constant::getAllOnesValue(type)) : nullptr;
    llvm::Value *unsafe = minus_one != nullptr ? b.CreateOr(zero, minus_one) : zero;
    llvm::Value *divisor = b.CreateSelect(unsafe, llvm::ConstantInt::get(type, 1), d);
    llvm::Value *result = b.CreateBinOp(op->getOpcode(), x, divisor);  // by 1: x, remainder 0
    if (minus_one != nullptr && is_division) result = b.CreateSelect(minus_one, b.CreateNeg(x), result);
    result = b.CreateSelect(zero, llvm::Constant::getNullValue(type), result);
    op->replaceAllUsesWith(result);
    op->eraseFromParent();
  }
}

/// One user argument, read from args->user_args[slot] and converted to `type`.
llvm::Value *load_argument(llvm::IRBuilder<> &b, llvm::Value *args, std::size_t slot, UserValueType type) {
  const uint64_t offset = offsetof(KilnKernelArgs, user_args) + slot * sizeof(uint64_t);
  llvm::Value *bits = b.CreateLoad(b.getInt64Ty(), b.CreateConstInBoundsGEP1_64(b.getInt8Ty(), args, offset));
  switch (type) {
    case UserValueType::ptr: return b.CreateIntToPtr(bits, b.getPtrTy());
    case UserValueType::f32: return b.CreateBitCast(b.CreateTrunc(bits, b.getInt32Ty()), b.getFloatTy());
    case UserValueType::f64: return b.CreateBitCast(bits, b.getDoubleTy());
    case UserValueType::i32: return b.CreateTrunc(bits, b.getInt32Ty());
    case UserValueType::i64: return bits;
  }
  return bits;
}

/// The blocks of an entry point's loop over indices: start -> test -> body -> test ... -> done.
struct LoopBlocks {
  llvm::BasicBlock *start, *test, *body, *done;
};

LoopBlocks add_loop_blocks(llvm::Function &function) {
  llvm::LLVMContext &context = function.getContext();
  return {llvm::BasicBlock::Create(context, "start", &function), llvm::BasicBlock::Create(context, "test", &function),
          llvm::BasicBlock::Create(context, "body", &function), llvm::BasicBlock::Create(context, "done", &function)};
}

/// Ends blocks.start and emits the rest of the loop: i from `first` while `less`(i, end), each
/// round `body`(i) (emitted in blocks.body, no new blocks) returning the next i; then ret void.
template <class Body>
void emit_index_loop(llvm::IRBuilder<> &b, const LoopBlocks &blocks, llvm::Value *first,
                     llvm::CmpInst::Predicate less, llvm::Value *end, Body body) {
  b.CreateBr(blocks.test);

  b.SetInsertPoint(blocks.test);
  llvm::PHINode *i = b.CreatePHI(b.getInt64Ty(), 2, "i");
  i->addIncoming(first, blocks.start);
  b.CreateCondBr(b.CreateICmp(less, i, end), blocks.body, blocks.done);

  b.SetInsertPoint(blocks.body);
  i->addIncoming(body(i), blocks.body);
  b.CreateBr(blocks.test);

  b.SetInsertPoint(blocks.done);
  b.CreateRetVoid();
}

/// args->num_elements (i64).
llvm::Value *load_num_elements(llvm::IRBuilder<> &b, llvm::Value *args) {
  return b.CreateLoad(b.getInt64Ty(),
                      b.CreateConstInBoundsGEP1_64(b.getInt8Ty(), args, offsetof(KilnKernelArgs, num_elements)));
}

/// define void @kiln_user_entry(ptr %runtime, ptr %args, i64 %begin, i64 %end, i64 %task): the
/// context {runtime, i, count}, then element(context, args...) for i in [begin, end).
void make_entry_wrapper(llvm::Module &module, llvm::Function &element, std::span<const UserValueType> params) {
  llvm::LLVMContext &context = module.getContext();
  llvm::IRBuilder<> b(context);
  llvm::Type *i64 = b.getInt64Ty();
  llvm::FunctionType *type = llvm::FunctionType::get(b.getVoidTy(), {b.getPtrTy(), b.getPtrTy(), i64, i64, i64}, false);
  llvm::Function *wrapper = llvm::Function::Create(type, llvm::GlobalValue::ExternalLinkage, kUserEntryName, module);
  llvm::Value *runtime = wrapper->getArg(0), *args = wrapper->getArg(1);
  llvm::Value *begin = wrapper->getArg(2), *end = wrapper->getArg(3);
  const LoopBlocks blocks = add_loop_blocks(*wrapper);

  b.SetInsertPoint(blocks.start);
  llvm::StructType *context_type = llvm::StructType::get(context, {b.getPtrTy(), i64, i64});  // KilnUserContext
  // In the data layout's alloca address space (AMDGPU: private, 5), seen by the element function
  // as a generic pointer.
  const unsigned alloca_space = module.getDataLayout().getAllocaAddrSpace();
  llvm::Value *element_context =
      b.CreateAddrSpaceCast(b.CreateAlloca(context_type, alloca_space, nullptr), b.getPtrTy());
  b.CreateStore(runtime, b.CreateStructGEP(context_type, element_context, 0));
  llvm::Value *count = load_num_elements(b, args);
  b.CreateStore(count, b.CreateStructGEP(context_type, element_context, 2));
  std::vector<llvm::Value *> call_args{element_context};
  for (std::size_t k = 0; k < params.size(); ++k) call_args.push_back(load_argument(b, args, k, params[k]));
  emit_index_loop(b, blocks, begin, llvm::CmpInst::ICMP_SLT, end, [&](llvm::Value *i) {
    b.CreateStore(i, b.CreateStructGEP(context_type, element_context, 1));
    llvm::CallInst *call = b.CreateCall(&element, call_args);
    call->setCallingConv(element.getCallingConv());
    return b.CreateAdd(i, b.getInt64(1), "next", /*HasNUW=*/true, /*HasNSW=*/true);
  });
}

/// define void @kiln_user_entry_gpu(ptr %runtime, ptr %args): a grid-stride loop calling
/// kiln_user_entry(runtime, args, i, i + 1, 0) for i = first, first + G, ... below
/// args->num_elements, first and G from the GPU runtime (kiln_grid_first_index, kiln_grid_threads).
void make_gpu_entry(llvm::Module &module) {
  llvm::LLVMContext &context = module.getContext();
  llvm::IRBuilder<> b(context);
  llvm::Type *i64 = b.getInt64Ty();
  llvm::Function *range = module.getFunction(kUserEntryName);
  llvm::FunctionCallee first_index = module.getOrInsertFunction("kiln_grid_first_index", i64);
  llvm::FunctionCallee grid_threads = module.getOrInsertFunction("kiln_grid_threads", i64);
  auto *entry = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), {b.getPtrTy(), b.getPtrTy()}, false),
                                       llvm::GlobalValue::ExternalLinkage, kUserGpuEntryName, module);
  llvm::Value *runtime = entry->getArg(0), *args = entry->getArg(1);
  const LoopBlocks blocks = add_loop_blocks(*entry);
  b.SetInsertPoint(blocks.start);
  llvm::Value *first = b.CreateCall(first_index);
  llvm::Value *stride = b.CreateCall(grid_threads);
  llvm::Value *count = load_num_elements(b, args);
  emit_index_loop(b, blocks, first, llvm::CmpInst::ICMP_ULT, count, [&](llvm::Value *i) {
    b.CreateCall(range, {runtime, args, i, b.CreateAdd(i, b.getInt64(1)), b.getInt64(0)});
    return b.CreateAdd(i, stride);
  });
}

/// Everything but kiln_user_entry (and the GPU entry point) internal, so the optimizer inlines the element function and
/// the runtime's into the loop and drops what it does not use.
void internalize(llvm::Module &module) {
  for (llvm::Function &f : module)
    if (!f.isDeclaration() && f.getName() != kUserEntryName && f.getName() != kUserGpuEntryName)
      f.setLinkage(llvm::GlobalValue::InternalLinkage);
  for (llvm::GlobalVariable &g : module.globals())
    if (!g.isDeclaration()) g.setLinkage(llvm::GlobalValue::InternalLinkage);
}

}  // namespace

RhiExpected<std::unique_ptr<llvm::Module>> prepare_user_module(
    llvm::LLVMContext &context, std::span<const std::byte> ir, std::string_view entry,
    std::span<const UserValueType> params, std::unique_ptr<llvm::Module> runtime,
    const char *device, bool gpu_entry) {
  if (params.size() > KILN_MAX_USER_PARAMS)
    return std::unexpected(usage(device, fmt::format("{} parameters; a user kernel has at most {}",
                                                     params.size(), KILN_MAX_USER_PARAMS)));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<llvm::Module> module, parse(context, ir, device));
  KILN_RETURN_IF_ERROR(verify(*module, device));
  KILN_ASSIGN_OR_RETURN(llvm::Function * element, check_entry(*module, entry, params, device));
  KILN_RETURN_IF_ERROR(check_symbols(*module, *runtime, device));
  guard_integer_division(*module);  // the user's functions only: the runtime is linked below
  module->setTargetTriple(runtime->getTargetTriple());
  module->setDataLayout(runtime->getDataLayout());  // before the wrapper: its alloca's address space
  make_entry_wrapper(*module, *element, params);
  if (gpu_entry) make_gpu_entry(*module);  // before linking: it names the runtime's geometry functions
  if (llvm::Linker::linkModules(*module, std::move(runtime), llvm::Linker::Flags::LinkOnlyNeeded))
    return std::unexpected(make_failure(RhiResult::error, device, kSite,
                                        "could not link the user module with kiln's device runtime "
                                        "(the context's diagnostic handler has LLVM's words)"));
  internalize(*module);
  return module;
}

}  // namespace kiln::runtime
