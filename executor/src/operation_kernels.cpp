// compile_elementwise, compile_reduction (operation_kernels.h): the operation language's
// modules, compiled as user kernels.
#include "kiln/executor/operation_kernels.h"

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "kiln/executor/executor.h"

namespace kiln {
namespace {

std::span<const std::byte> bytes(const std::string &bitcode) {
  return std::as_bytes(std::span(bitcode.data(), bitcode.size()));
}

KernelParam param_of(const runtime::OperationParam &p) {
  if (!p.array) return {p.name, ParamKind::scalar, dtype_of(p.type)};
  return {p.name, p.output ? ParamKind::out : ParamKind::in, dtype_of(p.type), !p.broadcast_strides.empty()};
}

KernelParam index_param(const char *name) { return {name, ParamKind::scalar, DataType::i64}; }

}  // namespace

DataType dtype_of(runtime::UserValueType type) {
  switch (type) {
    case runtime::UserValueType::f32: return DataType::f32;
    case runtime::UserValueType::f64: return DataType::f64;
    case runtime::UserValueType::i32: return DataType::i32;
    case runtime::UserValueType::i64:
    case runtime::UserValueType::ptr: break;
  }
  return DataType::i64;
}

RhiExpected<std::shared_ptr<UserKernel>> compile_elementwise(LlvmRuntimeExecutor &executor,
                                                             const runtime::ElementwiseSource &source) {
  KILN_ASSIGN_OR_RETURN(const std::string bitcode,
                        runtime::build_elementwise_ir(source, executor.device().name().c_str()));
  std::vector<KernelParam> params;
  for (const runtime::OperationParam &p : source.params) params.push_back(param_of(p));
  return UserKernel::create(executor, bytes(bitcode), source.name, std::move(params));
}

RhiExpected<ReductionKernels> compile_reduction(LlvmRuntimeExecutor &executor, const runtime::ReductionSource &source) {
  KILN_ASSIGN_OR_RETURN(const runtime::ReductionIr ir,
                        runtime::build_reduction_ir(source, executor.device().name().c_str()));
  const DataType reduce_dtype = dtype_of(source.reduce_type);
  std::vector<KernelParam> partial;
  for (const runtime::OperationParam &p : source.inputs) {
    KernelParam k = param_of(p);
    k.raw = p.array;  // the kernel walks the reduced axis itself
    partial.push_back(k);
  }
  partial.push_back({"_partial", ParamKind::out, reduce_dtype});
  for (const char *name : {"_k", "_inner", "_parts"}) partial.push_back(index_param(name));
  std::vector<KernelParam> combine{{"_partial", ParamKind::in, reduce_dtype, /*raw=*/true}};
  for (const runtime::OperationParam &p : source.outputs) combine.push_back({p.name, ParamKind::out, dtype_of(p.type)});
  for (const runtime::OperationParam &p : source.inputs)
    if (!p.array) combine.push_back(param_of(p));
  combine.push_back(index_param("_parts"));
  ReductionKernels kernels;
  KILN_ASSIGN_OR_RETURN(kernels.partial, UserKernel::create(executor, bytes(ir.partial), source.name,
                                                            std::move(partial)));
  KILN_ASSIGN_OR_RETURN(kernels.combine, UserKernel::create(executor, bytes(ir.combine), source.name,
                                                            std::move(combine)));
  kernels.partial->set_min_indices_per_task(1);  // each index folds a run of the input
  kernels.combine->set_min_indices_per_task(256);
  return kernels;
}

}  // namespace kiln
