// User kernels from the operation language (runtime/kernel_language.h): an ElementwiseKernel or a
// ReductionKernel specialized for its argument types, compiled for an executor's device as
// UserKernels, launched with LlvmRuntimeExecutor::launch like any user kernel.
#ifndef KILN_EXECUTOR_OPERATION_KERNELS_H_
#define KILN_EXECUTOR_OPERATION_KERNELS_H_

#include <memory>

#include "kiln/executor/user_kernel.h"
#include "kiln/runtime/kernel_language.h"

namespace kiln {

/// The kernel of `source`: its parameters are source.params in order (an array is `in`, or
/// `out` when it is an output, and `raw` when it is broadcast; a scalar is `scalar`).
/// Errors: those of runtime::build_elementwise_ir (invalid_usage with kernel_compile, line and
/// column), then those of UserKernel::create. Thread-safe.
[[nodiscard]] RhiExpected<std::shared_ptr<UserKernel>> compile_elementwise(LlvmRuntimeExecutor &executor,
                                                                           const runtime::ElementwiseSource &source);

/// The kernels of a reduction (runtime::build_reduction_ir):
///   partial(<inputs: arrays raw in, scalars>, out <reduce type> _partial, i64 _k, i64 _inner,
///           i64 _parts, i64 _lanes)
///   fold(raw in <reduce type> _in, out <reduce type> _out, i64 _m, i64 _lanes)   (GPUs only)
///   combine(raw in <reduce type> _partial, <outputs: out>, <scalar inputs>, i64 _parts)
/// launched as a ReductionPlan says; every entry is source.name. `fold` is null on cpu and mock.
struct ReductionKernels {
  std::shared_ptr<UserKernel> partial, fold, combine;
};
/// Errors: those of runtime::build_reduction_ir, then those of UserKernel::create. Thread-safe.
[[nodiscard]] RhiExpected<ReductionKernels> compile_reduction(LlvmRuntimeExecutor &executor,
                                                              const runtime::ReductionSource &source);

/// How a reduction of `outputs` values, each over k elements (the input seen as (outer, k,
/// inner), outputs = outer * inner), is split into launches:
///   1. partial over outputs * parts * lanes indices into a staging array of as many values;
///   2. when fold_lanes > 0 (GPUs), fold with m = parts * lanes and lanes = fold_lanes into a
///      second staging array of outputs * fold_lanes values;
///   3. combine over the outputs with _parts = combine_parts().
/// On cpu and mock each part is one contiguous run (lanes 1), at most 256 parts per reduction,
/// a part only for 4,096 elements or more (the thread pool's tasks). On GPUs the parts' lanes
/// interleave, so a warp reads neighbouring elements (the grid-stride pattern of reduce_sum's
/// first phase), with up to 2^18 threads of at least 64 elements each; the tree above them is
/// launches of fan-in 256 (fold, then combine) rather than reduce_sum's shared-memory tree, since
/// a user kernel's element function is the unit the fake drivers run.
struct ReductionPlan {
  int64_t parts = 1, lanes = 1, fold_lanes = 0;
  [[nodiscard]] int64_t partial_values(int64_t outputs) const { return outputs * parts * lanes; }
  [[nodiscard]] int64_t combine_parts() const { return fold_lanes > 0 ? fold_lanes : parts * lanes; }
};
/// The plan on a GPU (`gpu`: kernels.fold is set) or on cpu and mock; k, outputs >= 0, inner >= 1.
[[nodiscard]] ReductionPlan plan_reduction(bool gpu, int64_t k, int64_t outputs, int64_t inner);

/// The DataType of an element type (f32, f64, i32, i64; ptr has none: i64).
[[nodiscard]] DataType dtype_of(runtime::UserValueType type);

}  // namespace kiln

#endif  // KILN_EXECUTOR_OPERATION_KERNELS_H_
