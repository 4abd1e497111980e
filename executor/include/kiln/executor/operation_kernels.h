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

/// The two kernels of a reduction (runtime::build_reduction_ir):
///   partial(<inputs: arrays raw in, scalars>, out <reduce type> _partial, i64 _k, i64 _inner, i64 _parts)
///   combine(raw in <reduce type> _partial, <outputs: out>, <scalar inputs>, i64 _parts)
/// launched as partial over outputs * parts indices, then combine over the outputs; both entries
/// are source.name.
struct ReductionKernels {
  std::shared_ptr<UserKernel> partial, combine;
};
/// Errors: those of runtime::build_reduction_ir, then those of UserKernel::create. Thread-safe.
[[nodiscard]] RhiExpected<ReductionKernels> compile_reduction(LlvmRuntimeExecutor &executor,
                                                              const runtime::ReductionSource &source);

/// The DataType of an element type (f32, f64, i32, i64; ptr has none: i64).
[[nodiscard]] DataType dtype_of(runtime::UserValueType type);

}  // namespace kiln

#endif  // KILN_EXECUTOR_OPERATION_KERNELS_H_
