// Emitter (emitter.h): types and LLVM IR for the operation language, C's rules, no trapping
// instruction (integer division is guarded, float-to-int conversion saturates).
#include "emitter.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include <llvm/IR/Intrinsics.h>

#include "kiln/runtime/kernel_language.h"

namespace kiln::runtime::lang {
namespace {

bool is_float(Ty t) { return t == Ty::f32 || t == Ty::f64; }
bool is_int(Ty t) { return t == Ty::i32 || t == Ty::i64 || t == Ty::b1; }

/// C's usual arithmetic conversions over kiln's types (bool takes part as int32).
Ty common(Ty a, Ty b) {
  if (a == Ty::f64 || b == Ty::f64) return Ty::f64;
  if (a == Ty::f32 || b == Ty::f32) return Ty::f32;
  if (a == Ty::i64 || b == Ty::i64) return Ty::i64;
  return Ty::i32;
}

std::unexpected<SourceError> fail(uint32_t offset, std::string message) {
  return std::unexpected(SourceError{offset, std::move(message)});
}

struct FloatFunction {
  std::string_view name;
  llvm::Intrinsic::ID id;
};
constexpr FloatFunction kUnaryIntrinsics[] = {
    {"sqrt", llvm::Intrinsic::sqrt},   {"exp", llvm::Intrinsic::exp},     {"exp2", llvm::Intrinsic::exp2},
    {"exp10", llvm::Intrinsic::exp10}, {"log", llvm::Intrinsic::log},     {"log2", llvm::Intrinsic::log2},
    {"log10", llvm::Intrinsic::log10}, {"sin", llvm::Intrinsic::sin},     {"cos", llvm::Intrinsic::cos},
    {"tan", llvm::Intrinsic::tan},     {"asin", llvm::Intrinsic::asin},   {"acos", llvm::Intrinsic::acos},
    {"atan", llvm::Intrinsic::atan},   {"sinh", llvm::Intrinsic::sinh},   {"cosh", llvm::Intrinsic::cosh},
    {"tanh", llvm::Intrinsic::tanh},   {"floor", llvm::Intrinsic::floor}, {"ceil", llvm::Intrinsic::ceil},
    {"trunc", llvm::Intrinsic::trunc}, {"round", llvm::Intrinsic::round}, {"rint", llvm::Intrinsic::rint},
    {"fabs", llvm::Intrinsic::fabs}};

}  // namespace

const char *name_of(Ty type) {
  switch (type) {
    case Ty::b1: return "bool";
    case Ty::i32: return "int32";
    case Ty::i64: return "int64";
    case Ty::f32: return "float32";
    case Ty::f64: return "float64";
  }
  return "?";
}

Ty ty_of(UserValueType type) {
  switch (type) {
    case UserValueType::f32: return Ty::f32;
    case UserValueType::f64: return Ty::f64;
    case UserValueType::i32: return Ty::i32;
    case UserValueType::i64:
    case UserValueType::ptr: break;
  }
  return Ty::i64;
}

Emitter::Emitter(llvm::IRBuilder<> &b, llvm::BasicBlock *entry, std::vector<std::pair<std::string, Ty>> type_names)
    : b_(b), entry_(entry), type_names_(std::move(type_names)) {}

llvm::Type *Emitter::llvm_type(Ty type) const {
  switch (type) {
    case Ty::b1: return b_.getInt1Ty();
    case Ty::i32: return b_.getInt32Ty();
    case Ty::i64: return b_.getInt64Ty();
    case Ty::f32: return b_.getFloatTy();
    case Ty::f64: return b_.getDoubleTy();
  }
  return b_.getInt64Ty();
}

llvm::Value *Emitter::local(Ty type, const std::string &name) {
  llvm::IRBuilder<> at_entry(entry_, entry_->getFirstInsertionPt());
  return at_entry.CreateAlloca(llvm_type(type), nullptr, name);
}

Parsed<Ty> Emitter::resolve_type(const std::string &name, uint32_t offset) const {
  if (name == "float" || name == "float32") return Ty::f32;
  if (name == "double" || name == "float64") return Ty::f64;
  if (name == "int" || name == "int32") return Ty::i32;
  if (name == "long" || name == "int64") return Ty::i64;
  if (name == "bool") return Ty::b1;
  for (const auto &[alias, type] : type_names_)
    if (alias == name) return type;
  return fail(offset, fmt::format("unknown type {}: the types are float32 (float), float64 (double), int32 "
                                  "(int), int64 (long), bool{}",
                                  name, type_names_.empty() ? "" : " and the parameters' type names"));
}

Typed Emitter::convert(Typed v, Ty to) {
  if (v.type == to) return v;
  llvm::Type *target = llvm_type(to);
  if (to == Ty::b1) return to_bool(v);
  if (v.type == Ty::b1) return {is_float(to) ? b_.CreateUIToFP(v.value, target) : b_.CreateZExt(v.value, target), to};
  if (is_int(v.type) && is_int(to)) return {b_.CreateSExtOrTrunc(v.value, target), to};
  if (is_int(v.type)) return {b_.CreateSIToFP(v.value, target), to};
  if (is_float(to)) return {b_.CreateFPCast(v.value, target), to};
  // Saturating: NaN gives 0, out-of-range values the nearest bound (never poison).
  return {b_.CreateIntrinsic(llvm::Intrinsic::fptosi_sat, {target, v.value->getType()}, {v.value}), to};
}

Typed Emitter::to_bool(Typed v) {
  if (v.type == Ty::b1) return v;
  llvm::Value *zero = llvm::Constant::getNullValue(v.value->getType());
  return {is_float(v.type) ? b_.CreateFCmpUNE(v.value, zero) : b_.CreateICmpNE(v.value, zero), Ty::b1};
}

std::string Emitter::known_names() const {
  std::string list;
  for (const auto &[name, binding] : names_) list += (list.empty() ? "" : ", ") + name;
  return list.empty() ? std::string("none") : list;
}

Parsed<Typed> Emitter::expr(const Expr &e) {
  switch (e.kind) {
    case Expr::Kind::int_literal:
      if (e.int_value >= std::numeric_limits<int32_t>::min() && e.int_value <= std::numeric_limits<int32_t>::max())
        return Typed{b_.getInt32(static_cast<uint32_t>(e.int_value)), Ty::i32};
      return Typed{b_.getInt64(static_cast<uint64_t>(e.int_value)), Ty::i64};
    case Expr::Kind::float_literal:
      if (e.float32) return Typed{llvm::ConstantFP::get(b_.getFloatTy(), e.float_value), Ty::f32};
      return Typed{llvm::ConstantFP::get(b_.getDoubleTy(), e.float_value), Ty::f64};
    case Expr::Kind::bool_literal: return Typed{b_.getInt1(e.int_value != 0), Ty::b1};
    case Expr::Kind::name: return name(e);
    case Expr::Kind::unary: return unary(e);
    case Expr::Kind::binary: return binary(e);
    case Expr::Kind::ternary: return ternary(e);
    case Expr::Kind::call: return call(e);
    case Expr::Kind::cast: {
      auto to = resolve_type(e.text, e.offset);
      if (!to) return std::unexpected(to.error());
      auto v = expr(*e.operands[0]);
      if (!v) return v;
      return convert(*v, *to);
    }
  }
  return fail(e.offset, "unknown expression");
}

Parsed<Typed> Emitter::name(const Expr &e) {
  const auto found = names_.find(e.text);
  if (found == names_.end()) {
    if (is_builtin_type_name(e.text) || std::any_of(type_names_.begin(), type_names_.end(),
                                                     [&](const auto &t) { return t.first == e.text; }))
      return fail(e.offset, fmt::format("{} is a type, not a value (a cast is written {}(x))", e.text, e.text));
    return fail(e.offset, fmt::format("unknown name {}: the names here are {}", e.text, known_names()));
  }
  const Binding &bound = found->second;
  if (bound.value != nullptr) return Typed{bound.value, bound.type};
  return Typed{b_.CreateLoad(llvm_type(bound.type), bound.pointer, e.text), bound.type};
}

Parsed<Typed> Emitter::numeric(Typed v, uint32_t offset, const std::string &op) {
  (void)offset;
  (void)op;
  if (v.type == Ty::b1) return convert(v, Ty::i32);  // C promotes bool to int
  return v;
}

Parsed<Typed> Emitter::unary(const Expr &e) {
  auto operand = expr(*e.operands[0]);
  if (!operand) return operand;
  if (e.text == "!") {
    const Typed b = to_bool(*operand);
    return Typed{b_.CreateNot(b.value), Ty::b1};
  }
  auto v = numeric(*operand, e.offset, e.text);
  if (!v) return v;
  if (e.text == "+") return v;
  if (e.text == "-") return Typed{is_float(v->type) ? b_.CreateFNeg(v->value) : b_.CreateNeg(v->value), v->type};
  if (is_float(v->type)) return fail(e.offset, fmt::format("operator ~ needs an integer, got {}", name_of(v->type)));
  return Typed{b_.CreateNot(v->value), v->type};
}

Parsed<Typed> Emitter::binary(const Expr &e) {
  auto left = expr(*e.operands[0]);
  if (!left) return left;
  auto right = expr(*e.operands[1]);
  if (!right) return right;
  return binary_values(e.text, *left, *right, e.offset);
}

Typed Emitter::int_divide(bool remainder, Typed l, Typed r) {
  // x / 0 and x % 0 give 0 (numpy's answer), MIN / -1 wraps to MIN and MIN % -1 is 0: every
  // user module's divisions are guarded so (guard_integer_division, runtime/jit/user_module.cpp),
  // this module's included, so the plain instruction is emitted here.
  return {remainder ? b_.CreateSRem(l.value, r.value) : b_.CreateSDiv(l.value, r.value), l.type};
}

Parsed<Typed> Emitter::binary_values(const std::string &op, Typed l, Typed r, uint32_t offset) {
  if (op == "&&" || op == "||") {
    const Typed a = to_bool(l), c = to_bool(r);
    return Typed{op == "&&" ? b_.CreateAnd(a.value, c.value) : b_.CreateOr(a.value, c.value), Ty::b1};
  }
  if (op == "<<" || op == ">>" || op == "&" || op == "|" || op == "^") {
    if (is_float(l.type) || is_float(r.type))
      return fail(offset, fmt::format("operator {} needs integers, got {} and {}", op, name_of(l.type), name_of(r.type)));
    if (op == "<<" || op == ">>") {  // C: the left operand's promoted type; the count masked to its width
      const Ty t = common(l.type, Ty::i32);
      const Typed a = convert(l, t);
      llvm::Value *count = convert(r, t).value;
      count = b_.CreateAnd(count, llvm::ConstantInt::get(count->getType(), t == Ty::i64 ? 63 : 31));
      return Typed{op == "<<" ? b_.CreateShl(a.value, count) : b_.CreateAShr(a.value, count), t};
    }
    const Ty t = common(l.type, r.type);
    const Typed a = convert(l, t), c = convert(r, t);
    llvm::Value *v = op == "&" ? b_.CreateAnd(a.value, c.value)
                     : op == "|" ? b_.CreateOr(a.value, c.value) : b_.CreateXor(a.value, c.value);
    return Typed{v, t};
  }
  const Ty t = common(l.type, r.type);
  const Typed a = convert(l, t), c = convert(r, t);
  const bool fp = is_float(t);
  if (op == "+") return Typed{fp ? b_.CreateFAdd(a.value, c.value) : b_.CreateAdd(a.value, c.value), t};
  if (op == "-") return Typed{fp ? b_.CreateFSub(a.value, c.value) : b_.CreateSub(a.value, c.value), t};
  if (op == "*") return Typed{fp ? b_.CreateFMul(a.value, c.value) : b_.CreateMul(a.value, c.value), t};
  if (op == "/") return fp ? Typed{b_.CreateFDiv(a.value, c.value), t} : int_divide(false, a, c);
  if (op == "%") return fp ? Typed{b_.CreateFRem(a.value, c.value), t} : int_divide(true, a, c);
  using P = llvm::CmpInst::Predicate;
  struct Cmp { std::string_view op; P fp, integer; };
  static constexpr Cmp kCompare[] = {{"==", P::FCMP_OEQ, P::ICMP_EQ},  {"!=", P::FCMP_UNE, P::ICMP_NE},
                                     {"<", P::FCMP_OLT, P::ICMP_SLT},  {"<=", P::FCMP_OLE, P::ICMP_SLE},
                                     {">", P::FCMP_OGT, P::ICMP_SGT},  {">=", P::FCMP_OGE, P::ICMP_SGE}};
  for (const Cmp &cmp : kCompare)
    if (cmp.op == op)
      return Typed{fp ? b_.CreateFCmp(cmp.fp, a.value, c.value) : b_.CreateICmp(cmp.integer, a.value, c.value), Ty::b1};
  return fail(offset, fmt::format("unknown operator {}", op));
}

Parsed<Typed> Emitter::ternary(const Expr &e) {
  auto condition = expr(*e.operands[0]);
  if (!condition) return condition;
  auto then = expr(*e.operands[1]);
  if (!then) return then;
  auto otherwise = expr(*e.operands[2]);
  if (!otherwise) return otherwise;
  const Ty t = then->type == otherwise->type ? then->type : common(then->type, otherwise->type);
  const Typed a = convert(*then, t), c = convert(*otherwise, t);
  return Typed{b_.CreateSelect(to_bool(*condition).value, a.value, c.value), t};
}

Parsed<Typed> Emitter::call(const Expr &e) {
  const std::string &f = e.text;
  const auto known = std::find_if(std::begin(kKernelFunctions), std::end(kKernelFunctions),
                                  [&](const auto &entry) { return entry.first == f; });
  const bool is_type = is_builtin_type_name(f) || std::any_of(type_names_.begin(), type_names_.end(),
                                                               [&](const auto &t) { return t.first == f; });
  if (known == std::end(kKernelFunctions) && !is_type) {
    std::string list;
    for (const auto &[name, arity] : kKernelFunctions) list += (list.empty() ? "" : " ") + std::string(name);
    return fail(e.offset, fmt::format("unknown function {}: the functions are {}", f, list));
  }
  const std::size_t arity = is_type ? 1 : static_cast<std::size_t>(known->second);
  if (e.operands.size() != arity)
    return fail(e.offset, fmt::format("{} takes {} argument{}, got {}", f, arity, arity == 1 ? "" : "s",
                                      e.operands.size()));
  std::vector<Typed> args;
  for (const auto &operand : e.operands) {
    auto v = expr(*operand);
    if (!v) return v;
    args.push_back(*v);
  }
  if (is_type) {
    auto to = resolve_type(f, e.offset);
    if (!to) return std::unexpected(to.error());
    return convert(args[0], *to);
  }
  Ty t = args[0].type == Ty::b1 ? Ty::i32 : args[0].type;
  for (const Typed &a : args) t = common(t, a.type);
  const bool int_ok = f == "abs" || f == "min" || f == "max";
  if (!is_float(t) && !int_ok) t = Ty::f64;  // sqrt(2) is sqrt(2.0), as C++'s overloads have it
  for (Typed &a : args) a = convert(a, t);
  llvm::Type *lt = llvm_type(t);
  const auto intrinsic = [&](llvm::Intrinsic::ID id) {
    std::vector<llvm::Value *> values;
    for (const Typed &a : args) values.push_back(a.value);
    return Typed{b_.CreateIntrinsic(id, {lt}, values), t};
  };
  if (!is_float(t)) {  // abs, min, max on integers
    if (f == "abs") return Typed{b_.CreateIntrinsic(llvm::Intrinsic::abs, {lt}, {args[0].value, b_.getFalse()}), t};
    return intrinsic(f == "min" ? llvm::Intrinsic::smin : llvm::Intrinsic::smax);
  }
  for (const FloatFunction &ff : kUnaryIntrinsics)
    if (ff.name == f) return intrinsic(ff.id);
  if (f == "abs") return intrinsic(llvm::Intrinsic::fabs);
  if (f == "min" || f == "fmin") return intrinsic(llvm::Intrinsic::minnum);
  if (f == "max" || f == "fmax") return intrinsic(llvm::Intrinsic::maxnum);
  if (f == "pow") return intrinsic(llvm::Intrinsic::pow);
  if (f == "copysign") return intrinsic(llvm::Intrinsic::copysign);
  if (f == "fma") return intrinsic(llvm::Intrinsic::fma);
  if (f == "fmod") return Typed{b_.CreateFRem(args[0].value, args[1].value), t};
  if (f == "isnan") return Typed{b_.CreateFCmpUNO(args[0].value, args[0].value), Ty::b1};
  llvm::Value *magnitude = b_.CreateIntrinsic(llvm::Intrinsic::fabs, {lt}, {args[0].value});
  llvm::Value *inf = llvm::ConstantFP::getInfinity(lt);
  if (f == "isinf") return Typed{b_.CreateFCmpOEQ(magnitude, inf), Ty::b1};
  return Typed{b_.CreateFCmpOLT(magnitude, inf), Ty::b1};  // isfinite
}

Parsed<void> Emitter::statement(const Statement &s) {
  auto value = expr(*s.value);
  if (!value) return std::unexpected(value.error());
  if (!s.type_name.empty()) {
    auto type = resolve_type(s.type_name, s.offset);
    if (!type) return std::unexpected(type.error());
    if (names_.contains(s.name)) {
      const std::string_view what = names_.at(s.name).what;
      return fail(s.offset, fmt::format("{} is already {}; choose another name", s.name,
                                        what == "a local" || what == "a const local" ? "declared" : what));
    }
    llvm::Value *slot = local(*type, s.name);
    b_.CreateStore(convert(*value, *type).value, slot);
    names_[s.name] = Binding{*type, nullptr, slot, !s.constant, s.constant ? "a const local" : "a local"};
    return {};
  }
  const auto found = names_.find(s.name);
  if (found == names_.end())
    return fail(s.offset, fmt::format("unknown name {}: declare it first (float {} = ...) or make it an "
                                      "output; the names here are {}",
                                      s.name, s.name, known_names()));
  const Binding &target = found->second;
  if (!target.writable)
    return fail(s.offset, fmt::format("{} is {} and cannot be assigned (an array the kernel writes is an "
                                      "output parameter; a local is declared: float t = ...)",
                                      s.name, target.what));
  Typed result = *value;
  if (s.op != "=") {
    const Typed current{b_.CreateLoad(llvm_type(target.type), target.pointer), target.type};
    auto combined = binary_values(s.op.substr(0, s.op.size() - 1), current, *value, s.offset);
    if (!combined) return std::unexpected(combined.error());
    result = *combined;
  }
  b_.CreateStore(convert(result, target.type).value, target.pointer);
  return {};
}

Parsed<void> Emitter::statements(const std::vector<Statement> &list) {
  for (const Statement &s : list) {
    auto done = statement(s);
    if (!done) return done;
  }
  return {};
}

}  // namespace kiln::runtime::lang
