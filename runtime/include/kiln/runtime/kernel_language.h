// The operation language of ElementwiseKernel and ReductionKernel (CuPy's signatures): a small
// C-like language compiled to a user module (kernel_abi.h's user-kernel ABI) with LLVM's
// IRBuilder, never by a C compiler at run time. The module then goes the way of every user
// module (UserKernel::create): verified, linked with the device runtime, compiled for the device.
//
// The language: statements `T name = expr;`, `name = expr;`, `name op= expr;` (op one of + - * /
// % << >>); C's operators and precedence (?: || && | ^ & == != < <= > >= << >> + - * / % and unary
// - + ! ~); casts `(T)x` and `T(x)`; int literals (int32, int64 when larger), float literals
// (float64; float32 with an f suffix), true and false; `i`, the element's index (int64); and the
// functions of kKernelFunctions. Types: float32 (float), float64 (double), int32 (int), int64
// (long), bool, and the caller's placeholders (`T`). Arithmetic follows C's usual conversions.
// Integer division and remainder by zero give 0 (numpy's answer); INT_MIN / -1 wraps; a float
// converted to an integer saturates (NaN gives 0): no operation traps.
#ifndef KILN_RUNTIME_KERNEL_LANGUAGE_H_
#define KILN_RUNTIME_KERNEL_LANGUAGE_H_

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/rhi/result.h"
#include "kiln/runtime/user_kernel_abi.h"

namespace kiln::runtime {

/// The functions an operation may call (name, arity): float functions take float32 or float64
/// (an integer argument is converted to float64, as C++'s overloads do); abs, min and max take
/// integers too.
inline constexpr std::pair<std::string_view, int> kKernelFunctions[] = {
    {"sqrt", 1},  {"exp", 1},   {"exp2", 1},  {"exp10", 1}, {"log", 1},    {"log2", 1},  {"log10", 1},
    {"sin", 1},   {"cos", 1},   {"tan", 1},   {"asin", 1},  {"acos", 1},   {"atan", 1},  {"sinh", 1},
    {"cosh", 1},  {"tanh", 1},  {"floor", 1}, {"ceil", 1},  {"trunc", 1},  {"round", 1}, {"rint", 1},
    {"fabs", 1},  {"abs", 1},   {"pow", 2},   {"fmod", 2},  {"copysign", 2}, {"min", 2}, {"max", 2},
    {"fmin", 2},  {"fmax", 2},  {"fma", 3},   {"isnan", 1}, {"isinf", 1},  {"isfinite", 1}};

/// One parameter of an operation, in the order of the element function's LLVM parameters.
struct OperationParam {
  std::string name;          ///< its name in the operation
  UserValueType type;        ///< the element type (f32, f64, i32, i64; never ptr)
  bool array = true;         ///< an array (an LLVM `ptr`), else a scalar value
  bool output = false;       ///< written by the operation (out params); read-only otherwise
  /// For an input array that is broadcast: its element stride for each dimension of the launch's
  /// shape (0 where it is broadcast). Empty: the array has one element per index.
  std::vector<int64_t> broadcast_strides;
};

/// An ElementwiseKernel specialized for its argument types.
struct ElementwiseSource {
  std::string name;        ///< the element function's name
  std::string operation;   ///< statements, run once per index `i`
  std::vector<OperationParam> params;
  std::vector<int64_t> shape;  ///< the launch's shape (used by broadcast inputs only)
  /// Type names the operation may use beyond the builtin ones: "T" -> f32.
  std::vector<std::pair<std::string, UserValueType>> type_names;
};

/// The element function of `source`, `void @name(ptr %context, <params>)`, as LLVM bitcode.
/// Errors: invalid_usage (kernel_compile set; site "kernel compile") for text that does not
/// parse or does not type-check, with source_line and source_column and a caret under the place
/// in the message: an unknown name, function or type, a call with the wrong number of
/// arguments, a bool where a number is needed, an assignment to an input or an undeclared name,
/// a name declared twice, an output never assigned is allowed (it keeps its value);
/// invalid_usage for a parameter with no valid type or a broadcast map that does not match the
/// shape. Thread-safe (each call has its own LLVM context).
[[nodiscard]] RhiExpected<std::string> build_elementwise_ir(const ElementwiseSource &source, const char *device);

/// A ReductionKernel specialized for its argument types: map_expr per element, reduce_expr to
/// fold two values `a` and `b` of reduce_type, identity the fold's start, post_map_expr the
/// statements that write the outputs from `a`, the result.
struct ReductionSource {
  std::string name;
  std::string map_expr, reduce_expr, post_map_expr, identity;
  std::vector<OperationParam> inputs;   ///< arrays (read whole) and scalars, in order
  std::vector<OperationParam> outputs;  ///< one element per output index
  UserValueType reduce_type = UserValueType::f64;
  std::vector<std::pair<std::string, UserValueType>> type_names;
};

/// The three element functions of a reduction over an input seen as (outer, K, inner), K the
/// reduced length, each input's elements at o*K*inner + r*inner + j; all are named `name` (each
/// in its own module), so a fault spec kernel=NAME selects every launch:
///   partial(ctx, <inputs>, ptr partial, i64 K, i64 inner, i64 parts, i64 lanes): index
///     (q*parts + p)*lanes + l folds map_expr over the elements r = begin + l, begin + l + lanes,
///     ... below end of part p = [K*p/parts, K*(p+1)/parts) of output q = o*inner + j into
///     partial[index] (lanes 1: the part in order);
///   fold(ctx, ptr in, ptr out, i64 m, i64 lanes): index q*lanes + l folds in[q*m + l],
///     in[q*m + l + lanes], ... below in[q*m + m] into out[index] (reduce_expr only);
///   combine(ctx, ptr partial, <outputs>, <scalar inputs>, i64 parts): index q folds
///     partial[q*parts .. q*parts + parts) and runs post_map_expr with `a` the result.
/// Errors: as build_elementwise_ir, the message naming which expression is wrong.
struct ReductionIr {
  std::string partial, fold, combine;  ///< LLVM bitcode
};
[[nodiscard]] RhiExpected<ReductionIr> build_reduction_ir(const ReductionSource &source, const char *device);

/// Parses `operation` (statements) without types: its syntax errors as build_elementwise_ir
/// reports them, before the types of its parameters are known. `what` names the text in the
/// message ("operation", "map_expr").
[[nodiscard]] RhiStatus check_operation_syntax(std::string_view operation, bool statements, const char *what,
                                               const char *device);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_KERNEL_LANGUAGE_H_
