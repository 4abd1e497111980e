// build_elementwise_ir, build_reduction_ir, check_operation_syntax (kernel_language.h): the
// element functions around an operation, emitted with IRBuilder and written as bitcode.
#include "kiln/runtime/kernel_language.h"

#include <memory>
#include <set>

#include <fmt/format.h>

#include <llvm/Bitcode/BitcodeWriter.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/Support/raw_ostream.h>

#include "emitter.h"
#include "kiln/rhi/failures.h"
#include "syntax.h"

namespace kiln::runtime {
namespace {

using lang::Binding;
using lang::Emitter;
using lang::Ty;

constexpr const char *kSite = "kernel compile";

/// The failure of text `what` of kernel `name`: where, what, a caret under the place.
Failure compile_failure(const char *device, const std::string &name, const char *what, std::string_view text,
                        const lang::SourceError &error) {
  uint32_t line = 0, column = 0;
  const std::string where = lang::describe(text, error, &line, &column);
  Failure f = invalid_usage(device, kSite, fmt::format("{} of kernel {}: {}", what, name, where));
  f.kernel_compile = true;
  f.source_line = line;
  f.source_column = column;
  return f;
}

/// A text the caller gave, parsed and emitted, or its compile failure.
struct Compiler {
  const char *device;
  const std::string &name;

  RhiExpected<std::vector<lang::Statement>> statements(const char *what, const std::string &text) const {
    auto parsed = lang::parse_statements(text);
    if (!parsed) return std::unexpected(compile_failure(device, name, what, text, parsed.error()));
    return std::move(*parsed);
  }
  RhiExpected<std::unique_ptr<lang::Expr>> expression(const char *what, const std::string &text) const {
    auto parsed = lang::parse_expression(text);
    if (!parsed) return std::unexpected(compile_failure(device, name, what, text, parsed.error()));
    return std::move(*parsed);
  }
  RhiStatus run(const char *what, const std::string &text, Emitter &e, const std::vector<lang::Statement> &list) const {
    auto done = e.statements(list);
    if (!done) return std::unexpected(compile_failure(device, name, what, text, done.error()));
    return {};
  }
  RhiExpected<lang::Typed> value(const char *what, const std::string &text, Emitter &e, const lang::Expr &x) const {
    auto v = e.expr(x);
    if (!v) return std::unexpected(compile_failure(device, name, what, text, v.error()));
    return *v;
  }
};

std::vector<std::pair<std::string, Ty>> type_names(const std::vector<std::pair<std::string, UserValueType>> &names) {
  std::vector<std::pair<std::string, Ty>> result;
  for (const auto &[alias, type] : names) result.emplace_back(alias, lang::ty_of(type));
  return result;
}

/// The parameters' own mistakes (names that collide, a type that is no element type).
RhiStatus check_params(const std::vector<const OperationParam *> &params, const char *device, const std::string &name) {
  std::set<std::string> seen;
  for (const OperationParam *p : params) {
    if (p->type == UserValueType::ptr || static_cast<uint8_t>(p->type) > static_cast<uint8_t>(UserValueType::i64))
      return std::unexpected(invalid_usage(device, kSite, fmt::format("parameter {} of kernel {} has no element type",
                                                                      p->name, name)));
    if (!seen.insert(p->name).second || p->name == "i")
      return std::unexpected(invalid_usage(
          device, kSite, fmt::format("parameter {} of kernel {} is named twice (i is the element's index)", p->name, name)));
  }
  return {};
}

struct ModuleBuilder {
  llvm::LLVMContext context;
  std::unique_ptr<llvm::Module> module;
  llvm::IRBuilder<> b{context};
  llvm::Function *function = nullptr;
  llvm::BasicBlock *entry = nullptr;

  explicit ModuleBuilder(const std::string &module_name) : module(std::make_unique<llvm::Module>(module_name, context)) {}

  /// define void @name(ptr %context, <types>), the builder at its entry block.
  void begin(const std::string &name, const std::vector<llvm::Type *> &types) {
    std::vector<llvm::Type *> all{b.getPtrTy()};
    all.insert(all.end(), types.begin(), types.end());
    function = llvm::Function::Create(llvm::FunctionType::get(b.getVoidTy(), all, false),
                                      llvm::GlobalValue::ExternalLinkage, name, *module);
    entry = llvm::BasicBlock::Create(context, "entry", function);
    b.SetInsertPoint(entry);
  }
  llvm::Value *index() {
    llvm::FunctionCallee f = module->getOrInsertFunction(
        "kiln_index", llvm::FunctionType::get(b.getInt64Ty(), {b.getPtrTy()}, false));
    return b.CreateCall(f, {function->getArg(0)}, "i");
  }
  llvm::Type *element_type(UserValueType type) {
    switch (type) {
      case UserValueType::f32: return b.getFloatTy();
      case UserValueType::f64: return b.getDoubleTy();
      case UserValueType::i32: return b.getInt32Ty();
      default: return b.getInt64Ty();
    }
  }
  /// Runs `body(counter)` for counter = begin, begin + step, ... while below end (step 1 when
  /// null); the builder ends after the loop.
  template <class Body>
  RhiStatus loop(llvm::Value *begin, llvm::Value *end, const char *name, Body &&body, llvm::Value *step = nullptr) {
    llvm::BasicBlock *before = b.GetInsertBlock();
    auto *test = llvm::BasicBlock::Create(context, std::string(name) + ".test", function);
    auto *body_block = llvm::BasicBlock::Create(context, std::string(name) + ".body", function);
    auto *done = llvm::BasicBlock::Create(context, std::string(name) + ".done", function);
    b.CreateBr(test);
    b.SetInsertPoint(test);
    llvm::PHINode *counter = b.CreatePHI(b.getInt64Ty(), 2, name);
    counter->addIncoming(begin, before);
    b.CreateCondBr(b.CreateICmpSLT(counter, end), body_block, done);
    b.SetInsertPoint(body_block);
    KILN_RETURN_IF_ERROR(body(static_cast<llvm::Value *>(counter)));
    counter->addIncoming(b.CreateAdd(counter, step != nullptr ? step : b.getInt64(1)), b.GetInsertBlock());
    b.CreateBr(test);
    b.SetInsertPoint(done);
    return {};
  }
  /// The module, verified, as bitcode. A module that does not verify is kiln's bug: error.
  RhiExpected<std::string> finish(const char *device) {
    b.CreateRetVoid();
    std::string message;
    llvm::raw_string_ostream out(message);
    if (llvm::verifyModule(*module, &out))
      return std::unexpected(make_failure(RhiResult::error, device, kSite,
                                          "kiln emitted a module that does not verify: " + out.str()));
    std::string bitcode;
    llvm::raw_string_ostream bits(bitcode);
    llvm::WriteBitcodeToFile(*module, bits);
    bits.flush();
    return bitcode;
  }
};

/// The offset of a broadcast input's element for index i: its strides over i's coordinates in
/// `shape` (row-major).
llvm::Value *broadcast_offset(llvm::IRBuilder<> &b, llvm::Value *i, const std::vector<int64_t> &shape,
                              const std::vector<int64_t> &strides) {
  llvm::Value *offset = b.getInt64(0), *rest = i;
  for (std::size_t d = shape.size(); d-- > 0;) {
    llvm::Value *extent = b.getInt64(static_cast<uint64_t>(shape[d]));
    if (strides[d] != 0)
      offset = b.CreateAdd(offset, b.CreateMul(b.CreateURem(rest, extent), b.getInt64(static_cast<uint64_t>(strides[d]))));
    rest = b.CreateUDiv(rest, extent);
  }
  return offset;
}

}  // namespace

RhiExpected<std::string> build_elementwise_ir(const ElementwiseSource &source, const char *device) {
  std::vector<const OperationParam *> all;
  for (const OperationParam &p : source.params) all.push_back(&p);
  KILN_RETURN_IF_ERROR(check_params(all, device, source.name));
  for (const OperationParam &p : source.params)
    if (!p.broadcast_strides.empty() && (p.broadcast_strides.size() != source.shape.size() || p.output || !p.array))
      return std::unexpected(invalid_usage(device, kSite, fmt::format("the broadcast of {} does not match the "
                                                                      "launch's {} dimensions",
                                                                      p.name, source.shape.size())));
  const Compiler compiler{device, source.name};
  KILN_ASSIGN_OR_RETURN(auto statements, compiler.statements("operation", source.operation));
  ModuleBuilder m(source.name);
  std::vector<llvm::Type *> types;
  for (const OperationParam &p : source.params) types.push_back(p.array ? m.b.getPtrTy() : m.element_type(p.type));
  m.begin(source.name, types);
  Emitter e(m.b, m.entry, type_names(source.type_names));
  llvm::Value *i = m.index();
  e.bind("i", Binding{Ty::i64, i, nullptr, false, "the element's index"});
  for (std::size_t k = 0; k < source.params.size(); ++k) {
    const OperationParam &p = source.params[k];
    llvm::Value *arg = m.function->getArg(static_cast<unsigned>(k + 1));
    const Ty t = lang::ty_of(p.type);
    if (!p.array) {
      e.bind(p.name, Binding{t, arg, nullptr, false, "a scalar input"});
      continue;
    }
    llvm::Value *offset = p.broadcast_strides.empty() ? i : broadcast_offset(m.b, i, source.shape, p.broadcast_strides);
    llvm::Value *element = m.b.CreateInBoundsGEP(m.element_type(p.type), arg, offset, p.name + ".at");
    e.bind(p.name, Binding{t, nullptr, element, p.output, p.output ? "an output" : "an input"});
  }
  KILN_RETURN_IF_ERROR(compiler.run("operation", source.operation, e, statements));
  return m.finish(device);
}

namespace {

/// acc = reduce_expr(a = acc, b = value), in reduce_type.
RhiStatus fold(const Compiler &compiler, const ReductionSource &source, ModuleBuilder &m, const lang::Expr &reduce,
               llvm::Value *acc, lang::Typed value) {
  const Ty rt = lang::ty_of(source.reduce_type);
  Emitter e(m.b, m.entry, type_names(source.type_names));
  e.bind("a", Binding{rt, m.b.CreateLoad(m.element_type(source.reduce_type), acc), nullptr, false, "the accumulator"});
  e.bind("b", Binding{rt, e.convert(value, rt).value, nullptr, false, "the value folded in"});
  // The fold may be reassociated (a reduction's order is unspecified, as CuPy's): the loop
  // vectorizer can then keep several partial sums, where a strict order is one add per latency.
  llvm::FastMathFlags reassociate;
  reassociate.setAllowReassoc();
  const llvm::IRBuilderBase::FastMathFlagGuard keep(m.b);
  m.b.setFastMathFlags(reassociate);
  KILN_ASSIGN_OR_RETURN(const lang::Typed folded, compiler.value("reduce_expr", source.reduce_expr, e, reduce));
  m.b.CreateStore(e.convert(folded, rt).value, acc);
  return {};
}

/// A new accumulator holding identity.
RhiExpected<llvm::Value *> start(const Compiler &compiler, const ReductionSource &source, ModuleBuilder &m) {
  const Ty rt = lang::ty_of(source.reduce_type);
  KILN_ASSIGN_OR_RETURN(auto identity, compiler.expression("identity", source.identity));
  Emitter e(m.b, m.entry, type_names(source.type_names));
  KILN_ASSIGN_OR_RETURN(const lang::Typed v, compiler.value("identity", source.identity, e, *identity));
  llvm::Value *acc = e.local(rt, "acc");
  m.b.CreateStore(e.convert(v, rt).value, acc);
  return acc;
}

RhiExpected<std::string> build_partial(const ReductionSource &source, const char *device) {
  const Compiler compiler{device, source.name};
  KILN_ASSIGN_OR_RETURN(auto map, compiler.expression("map_expr", source.map_expr));
  KILN_ASSIGN_OR_RETURN(auto reduce, compiler.expression("reduce_expr", source.reduce_expr));
  ModuleBuilder m(source.name + "_partial");
  std::vector<llvm::Type *> types;
  for (const OperationParam &p : source.inputs) types.push_back(p.array ? m.b.getPtrTy() : m.element_type(p.type));
  llvm::Type *i64 = m.b.getInt64Ty();
  types.insert(types.end(), {m.b.getPtrTy(), i64, i64, i64, i64});
  m.begin(source.name, types);
  const auto n = static_cast<unsigned>(source.inputs.size());
  llvm::Value *partial = m.function->getArg(n + 1), *k = m.function->getArg(n + 2);
  llvm::Value *inner = m.function->getArg(n + 3), *parts = m.function->getArg(n + 4);
  llvm::Value *lanes = m.function->getArg(n + 5);
  llvm::Value *j = m.index();
  llvm::Value *lane = m.b.CreateURem(j, lanes), *run = m.b.CreateUDiv(j, lanes);
  llvm::Value *q = m.b.CreateUDiv(run, parts), *p = m.b.CreateURem(run, parts);
  llvm::Value *base = m.b.CreateAdd(m.b.CreateMul(m.b.CreateMul(m.b.CreateUDiv(q, inner), k), inner), m.b.CreateURem(q, inner));
  llvm::Value *begin = m.b.CreateUDiv(m.b.CreateMul(k, p), parts);
  llvm::Value *end = m.b.CreateUDiv(m.b.CreateMul(k, m.b.CreateAdd(p, m.b.getInt64(1))), parts);
  KILN_ASSIGN_OR_RETURN(llvm::Value *acc, start(compiler, source, m));
  const auto element = [&](llvm::Value *r) -> RhiStatus {
    llvm::Value *at = m.b.CreateAdd(base, m.b.CreateMul(r, inner));
    Emitter e(m.b, m.entry, type_names(source.type_names));
    for (unsigned a = 0; a < n; ++a) {
      const OperationParam &in = source.inputs[a];
      llvm::Value *arg = m.function->getArg(a + 1);
      const Ty t = lang::ty_of(in.type);
      llvm::Value *v = in.array ? m.b.CreateLoad(m.element_type(in.type),
                                                 m.b.CreateInBoundsGEP(m.element_type(in.type), arg, at), in.name)
                                : arg;
      e.bind(in.name, Binding{t, v, nullptr, false, in.array ? "an input" : "a scalar input"});
    }
    KILN_ASSIGN_OR_RETURN(const lang::Typed mapped, compiler.value("map_expr", source.map_expr, e, *map));
    return fold(compiler, source, m, *reduce, acc, mapped);
  };
  // One lane walks its part in order (the CPU's plan: a loop the vectorizer widens); several
  // lanes interleave (the GPUs' plan: neighbouring threads read neighbouring elements).
  auto *contiguous = llvm::BasicBlock::Create(m.context, "contiguous", m.function);
  auto *interleaved = llvm::BasicBlock::Create(m.context, "interleaved", m.function);
  auto *store = llvm::BasicBlock::Create(m.context, "store", m.function);
  m.b.CreateCondBr(m.b.CreateICmpEQ(lanes, m.b.getInt64(1)), contiguous, interleaved);
  m.b.SetInsertPoint(contiguous);
  KILN_RETURN_IF_ERROR(m.loop(begin, end, "r", element));
  m.b.CreateBr(store);
  m.b.SetInsertPoint(interleaved);
  KILN_RETURN_IF_ERROR(m.loop(m.b.CreateAdd(begin, lane), end, "s", element, lanes));
  m.b.CreateBr(store);
  m.b.SetInsertPoint(store);
  llvm::Type *rt = m.element_type(source.reduce_type);
  m.b.CreateStore(m.b.CreateLoad(rt, acc), m.b.CreateInBoundsGEP(rt, partial, j));
  return m.finish(device);
}

/// fold(ptr in, ptr out, i64 m, i64 lanes): index q*lanes + l folds in[q*m + l], in[q*m + l +
/// lanes], ... below in[q*m + m] into out[index] (a GPU's middle level between partial and combine).
RhiExpected<std::string> build_fold(const ReductionSource &source, const char *device) {
  const Compiler compiler{device, source.name};
  KILN_ASSIGN_OR_RETURN(auto reduce, compiler.expression("reduce_expr", source.reduce_expr));
  ModuleBuilder m(source.name + "_fold");
  llvm::Type *i64 = m.b.getInt64Ty();
  m.begin(source.name, {m.b.getPtrTy(), m.b.getPtrTy(), i64, i64});
  llvm::Value *in = m.function->getArg(1), *out = m.function->getArg(2);
  llvm::Value *count = m.function->getArg(3), *lanes = m.function->getArg(4);
  llvm::Value *j = m.index();
  llvm::Value *q = m.b.CreateUDiv(j, lanes), *lane = m.b.CreateURem(j, lanes);
  llvm::Value *base = m.b.CreateMul(q, count);
  llvm::Type *rt = m.element_type(source.reduce_type);
  KILN_ASSIGN_OR_RETURN(llvm::Value *acc, start(compiler, source, m));
  KILN_RETURN_IF_ERROR(m.loop(lane, count, "t", [&](llvm::Value *t) -> RhiStatus {
    llvm::Value *at = m.b.CreateAdd(base, t);
    const lang::Typed value{m.b.CreateLoad(rt, m.b.CreateInBoundsGEP(rt, in, at)), lang::ty_of(source.reduce_type)};
    return fold(compiler, source, m, *reduce, acc, value);
  }, lanes));
  m.b.CreateStore(m.b.CreateLoad(rt, acc), m.b.CreateInBoundsGEP(rt, out, j));
  return m.finish(device);
}

RhiExpected<std::string> build_combine(const ReductionSource &source, const char *device) {
  const Compiler compiler{device, source.name};
  KILN_ASSIGN_OR_RETURN(auto reduce, compiler.expression("reduce_expr", source.reduce_expr));
  KILN_ASSIGN_OR_RETURN(auto post, compiler.statements("post_map_expr", source.post_map_expr));
  ModuleBuilder m(source.name + "_combine");
  std::vector<llvm::Type *> types{m.b.getPtrTy()};
  for (std::size_t k = 0; k < source.outputs.size(); ++k) types.push_back(m.b.getPtrTy());
  std::vector<const OperationParam *> scalars;
  for (const OperationParam &p : source.inputs)
    if (!p.array) {
      scalars.push_back(&p);
      types.push_back(m.element_type(p.type));
    }
  types.push_back(m.b.getInt64Ty());
  m.begin(source.name, types);
  llvm::Value *partial = m.function->getArg(1);
  llvm::Value *parts = m.function->getArg(static_cast<unsigned>(types.size()));
  llvm::Value *q = m.index();
  llvm::Type *rt = m.element_type(source.reduce_type);
  KILN_ASSIGN_OR_RETURN(llvm::Value *acc, start(compiler, source, m));
  KILN_RETURN_IF_ERROR(m.loop(m.b.getInt64(0), parts, "p", [&](llvm::Value *p) -> RhiStatus {
    llvm::Value *at = m.b.CreateAdd(m.b.CreateMul(q, parts), p);
    const lang::Typed value{m.b.CreateLoad(rt, m.b.CreateInBoundsGEP(rt, partial, at)), lang::ty_of(source.reduce_type)};
    return fold(compiler, source, m, *reduce, acc, value);
  }));
  Emitter e(m.b, m.entry, type_names(source.type_names));
  e.bind("a", Binding{lang::ty_of(source.reduce_type), m.b.CreateLoad(rt, acc), nullptr, false, "the reduction's result"});
  for (std::size_t k = 0; k < source.outputs.size(); ++k) {
    const OperationParam &out = source.outputs[k];
    llvm::Value *element = m.b.CreateInBoundsGEP(m.element_type(out.type), m.function->getArg(static_cast<unsigned>(k + 2)), q);
    e.bind(out.name, Binding{lang::ty_of(out.type), nullptr, element, true, "an output"});
  }
  for (std::size_t k = 0; k < scalars.size(); ++k)
    e.bind(scalars[k]->name, Binding{lang::ty_of(scalars[k]->type),
                                     m.function->getArg(static_cast<unsigned>(2 + source.outputs.size() + k)), nullptr,
                                     false, "a scalar input"});
  KILN_RETURN_IF_ERROR(compiler.run("post_map_expr", source.post_map_expr, e, post));
  return m.finish(device);
}

}  // namespace

RhiExpected<ReductionIr> build_reduction_ir(const ReductionSource &source, const char *device) {
  std::vector<const OperationParam *> all;
  for (const OperationParam &p : source.inputs) all.push_back(&p);
  for (const OperationParam &p : source.outputs) all.push_back(&p);
  KILN_RETURN_IF_ERROR(check_params(all, device, source.name));
  for (const OperationParam *p : all)
    if (p->name == "a" || p->name == "b")
      return std::unexpected(invalid_usage(device, kSite, fmt::format("parameter {} of kernel {}: a and b are the "
                                                                      "values reduce_expr folds; rename it",
                                                                      p->name, source.name)));
  KILN_ASSIGN_OR_RETURN(std::string partial, build_partial(source, device));
  KILN_ASSIGN_OR_RETURN(std::string fold, build_fold(source, device));
  KILN_ASSIGN_OR_RETURN(std::string combine, build_combine(source, device));
  return ReductionIr{std::move(partial), std::move(fold), std::move(combine)};
}

RhiStatus check_operation_syntax(std::string_view operation, bool statements, const char *what, const char *device) {
  const std::string name = "(not yet specialized)";
  lang::Parsed<void> parsed;
  if (statements) {
    auto s = lang::parse_statements(operation);
    if (!s) parsed = std::unexpected(s.error());
  } else {
    auto x = lang::parse_expression(operation);
    if (!x) parsed = std::unexpected(x.error());
  }
  if (parsed) return {};
  uint32_t line = 0, column = 0;
  const std::string where = lang::describe(operation, parsed.error(), &line, &column);
  Failure f = invalid_usage(device, kSite, fmt::format("{}: {}", what, where));
  f.kernel_compile = true;
  f.source_line = line;
  f.source_column = column;
  return std::unexpected(std::move(f));
}

}  // namespace kiln::runtime
