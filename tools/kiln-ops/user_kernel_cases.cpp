// The user-kernel cases: kernels kiln compiles from the user's text at run time, launched through
// the same launcher, budget and device heap as the built-in ones.
//   user_elementwise/<dtype>/<size>  z = (x - y) * (x - y), CuPy's squared difference
//   user_reduction/<dtype>/<size>    the sum of squares (a ReductionKernel: partial folds, then a
//                                    combine), in float64 or int64
//   user_ir_heap/i64/<size>          LLVM IR that takes 8 bytes of device heap per element,
//                                    writes x*x there and copies it out
#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>

#include <fmt/format.h>

#include "case_support.h"
#include "kiln/executor/operation_kernels.h"
#include "suite.h"

namespace kiln::ops {
namespace {

using runtime::UserValueType;

template <class T>
constexpr UserValueType value_type_for() {
  if constexpr (std::is_same_v<T, float>) return UserValueType::f32;
  else if constexpr (std::is_same_v<T, double>) return UserValueType::f64;
  else if constexpr (std::is_same_v<T, int32_t>) return UserValueType::i32;
  else return UserValueType::i64;
}

/// The reduction's accumulator: float64 for floats, int64 for integers.
template <class T>
using Wide = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;

/// An array parameter of an operation: an input, or an output.
runtime::OperationParam array_param(std::string name, UserValueType type, bool output = false) {
  runtime::OperationParam p;
  p.name = std::move(name);
  p.type = type;
  p.output = output;
  return p;
}

template <class T>
CaseOutcome case_elementwise(LlvmRuntimeExecutor &ex, uint64_t n) {
  const UserValueType type = value_type_for<T>();
  runtime::ElementwiseSource source;
  source.name = "squared_diff";
  source.operation = "z = (x - y) * (x - y)";
  source.params = {array_param("x", type), array_param("y", type), array_param("z", type, true)};
  KILN_ASSIGN_OR_RETURN(const std::shared_ptr<UserKernel> kernel, compile_elementwise(ex, source));
  const std::vector<T> x = random_values<T>(n, n + 29), y = random_values<T>(n, n + 31);
  const int64_t shape[1] = {static_cast<int64_t>(n)};
  KILN_ASSIGN_OR_RETURN(Ndarray dx, upload<T>(ex, x, shape));
  KILN_ASSIGN_OR_RETURN(Ndarray dy, upload<T>(ex, y, shape));
  KILN_ASSIGN_OR_RETURN(Ndarray dz, ex.ndarray(dtype_for<T>(), shape));
  const KernelArg args[] = {KernelArg::of(dx), KernelArg::of(dy), KernelArg::of(dz)};
  KILN_RETURN_IF_ERROR(ex.launch(*kernel, args));
  KILN_ASSIGN_OR_RETURN(const std::vector<T> got, download<T>(ex, dz));
  std::vector<T> want(n);
  for (uint64_t i = 0; i < n; ++i) want[i] = static_cast<T>((x[i] - y[i]) * (x[i] - y[i]));
  return compare(got, want, std::is_floating_point_v<T> ? 1e-6 : 0.0);
}

template <class T>
CaseOutcome case_reduction(LlvmRuntimeExecutor &ex, uint64_t n) {
  const UserValueType wide = value_type_for<Wide<T>>();
  runtime::ReductionSource source;
  source.name = "sum_of_squares";
  source.map_expr = "x * x";
  source.reduce_expr = "a + b";
  source.post_map_expr = "y = a";
  source.identity = "0";
  source.inputs = {array_param("x", value_type_for<T>())};
  source.outputs = {array_param("y", wide, true)};
  source.reduce_type = wide;
  KILN_ASSIGN_OR_RETURN(const ReductionKernels kernels, compile_reduction(ex, source));
  const std::vector<T> x = random_values<T>(n, n + 37);
  const int64_t shape[1] = {static_cast<int64_t>(n)}, one[1] = {1};
  const ReductionPlan plan = plan_reduction(kernels.fold != nullptr, static_cast<int64_t>(n), 1, 1);
  const int64_t partial_shape[1] = {plan.partial_values(1)}, folded_shape[1] = {plan.fold_lanes};
  KILN_ASSIGN_OR_RETURN(Ndarray dx, upload<T>(ex, x, shape));
  KILN_ASSIGN_OR_RETURN(Ndarray partial, ex.ndarray(dtype_of(wide), partial_shape));
  KILN_ASSIGN_OR_RETURN(Ndarray dy, ex.ndarray(dtype_of(wide), one));
  const auto i64 = [](int64_t v) { return KernelArg::of(Scalar::of_int(v)); };
  // partial(x, partial, K = n, inner = 1, parts, lanes); on GPUs fold(partial, folded, m,
  // fold_lanes); combine(partial or folded, y, parts), as plan_reduction says.
  const KernelArg partial_args[] = {KernelArg::of(dx), KernelArg::of(partial), i64(static_cast<int64_t>(n)), i64(1),
                                    i64(plan.parts), i64(plan.lanes)};
  KILN_RETURN_IF_ERROR(ex.launch(*kernels.partial, partial_args));
  std::optional<Ndarray> folded;
  if (plan.fold_lanes > 0) {
    KILN_ASSIGN_OR_RETURN(folded, ex.ndarray(dtype_of(wide), folded_shape));
    const KernelArg fold_args[] = {KernelArg::of(partial), KernelArg::of(*folded), i64(plan.parts * plan.lanes),
                                   i64(plan.fold_lanes)};
    KILN_RETURN_IF_ERROR(ex.launch(*kernels.fold, fold_args));
  }
  const KernelArg combine_args[] = {KernelArg::of(folded ? *folded : partial), KernelArg::of(dy),
                                    i64(plan.combine_parts())};
  KILN_RETURN_IF_ERROR(ex.launch(*kernels.combine, combine_args));
  KILN_ASSIGN_OR_RETURN(const std::vector<Wide<T>> got, download<Wide<T>>(ex, dy));
  long double want = 0;
  for (const T v : x) want += static_cast<long double>(v) * v;
  // Every term is >= 0, so the error of a float sum in any order is relative to the sum: float32
  // squares carry float32 rounding; float64 sums of up to 131,072 terms per part (the large
  // size) stay near 1.5e-11.
  const double relative = std::is_same_v<T, float> ? 1e-6 : std::is_same_v<T, double> ? 1e-10 : 0.0;
  const double tolerance = relative * static_cast<double>(want);
  if (std::fabs(static_cast<double>(got[0]) - static_cast<double>(want)) > tolerance)
    return std::optional<std::string>(fmt::format("sum of squares {} differs from {} by more than {}",
                                                  got[0], static_cast<double>(want), tolerance));
  return std::optional<std::string>();
}

/// Each element takes 8 bytes of device heap, stores x*x there and reads it back into y; a null
/// block (the heap ran dry) returns, and the launch fails with the heap's figures.
constexpr const char *kHeapSquareIr = R"(
declare i64 @kiln_index(ptr)
declare ptr @kiln_heap_allocate(ptr, i64, i64)
define void @heap_square(ptr %ctx, ptr %x, ptr %y) {
  %i = call i64 @kiln_index(ptr %ctx)
  %block = call ptr @kiln_heap_allocate(ptr %ctx, i64 8, i64 8)
  %null = icmp eq ptr %block, null
  br i1 %null, label %done, label %use
use:
  %px = getelementptr i64, ptr %x, i64 %i
  %v = load i64, ptr %px
  %square = mul i64 %v, %v
  store volatile i64 %square, ptr %block
  %back = load volatile i64, ptr %block
  %py = getelementptr i64, ptr %y, i64 %i
  store i64 %back, ptr %py
  ret void
done:
  ret void
}
)";

CaseOutcome case_ir_heap(LlvmRuntimeExecutor &ex, uint64_t n) {
  const std::string_view ir(kHeapSquareIr);
  std::vector<KernelParam> params{{"x", ParamKind::in, DataType::i64}, {"y", ParamKind::out, DataType::i64}};
  KILN_ASSIGN_OR_RETURN(const std::shared_ptr<UserKernel> kernel,
                        UserKernel::create(ex, std::as_bytes(std::span(ir.data(), ir.size())), "heap_square",
                                           std::move(params)));
  const std::vector<int64_t> x = random_values<int64_t>(n, n + 41);
  const int64_t shape[1] = {static_cast<int64_t>(n)};
  KILN_ASSIGN_OR_RETURN(Ndarray dx, upload<int64_t>(ex, x, shape));
  KILN_ASSIGN_OR_RETURN(Ndarray dy, ex.ndarray(DataType::i64, shape));
  const KernelArg args[] = {KernelArg::of(dx), KernelArg::of(dy)};
  KILN_RETURN_IF_ERROR(ex.launch(*kernel, args));
  KILN_ASSIGN_OR_RETURN(const std::vector<int64_t> got, download<int64_t>(ex, dy));
  std::vector<int64_t> want(n);
  for (uint64_t i = 0; i < n; ++i) want[i] = x[i] * x[i];
  return compare(got, want);
}

template <class T>
void add_for(std::vector<Case> &cases, uint64_t max_bytes) {
  const std::string dt(to_string(dtype_for<T>()));
  for (const Size &s : kSizes) {
    const uint64_t n = s.elements_of(sizeof(T)), bytes = n * sizeof(T);
    if (bytes > max_bytes) continue;
    cases.push_back({fmt::format("user_elementwise/{}/{}", dt, s.name), bytes,
                     [n](LlvmRuntimeExecutor &ex) { return case_elementwise<T>(ex, n); }});
    cases.push_back({fmt::format("user_reduction/{}/{}", dt, s.name), bytes,
                     [n](LlvmRuntimeExecutor &ex) { return case_reduction<T>(ex, n); }});
  }
}

}  // namespace

std::span<const std::string> user_kernel_case_names() {
  static const std::string kNames[] = {"squared_diff", "sum_of_squares", "heap_square"};
  return kNames;
}

void add_user_kernel_cases(std::vector<Case> &cases, uint64_t max_array_bytes) {
  add_for<float>(cases, max_array_bytes);
  add_for<double>(cases, max_array_bytes);
  add_for<int32_t>(cases, max_array_bytes);
  add_for<int64_t>(cases, max_array_bytes);
  // 8 bytes of heap (and its bookkeeping) per element: up to the small size, well inside the
  // default 16 MiB device heap.
  for (const Size &s : kSizes) {
    const uint64_t n = s.elements_of(sizeof(int64_t)), bytes = n * sizeof(int64_t);
    if (n > 4099 || bytes > max_array_bytes) continue;
    cases.push_back({fmt::format("user_ir_heap/i64/{}", s.name), bytes,
                     [n](LlvmRuntimeExecutor &ex) { return case_ir_heap(ex, n); }});
  }
}

}  // namespace kiln::ops
