// compile_elementwise, compile_reduction (operation_kernels.h): the operation language's
// modules, compiled as user kernels.
#include "kiln/executor/operation_kernels.h"

#include <algorithm>
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
  for (const char *name : {"_k", "_inner", "_parts", "_lanes"}) partial.push_back(index_param(name));
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
  if (codegen_arch(executor.device()) != CodegenArch::host) {
    std::vector<KernelParam> fold{{"_in", ParamKind::in, reduce_dtype, /*raw=*/true},
                                  {"_out", ParamKind::out, reduce_dtype},
                                  index_param("_m"),
                                  index_param("_lanes")};
    KILN_ASSIGN_OR_RETURN(kernels.fold, UserKernel::create(executor, bytes(ir.fold), source.name, std::move(fold)));
  }
  return kernels;
}

ReductionPlan plan_reduction(bool gpu, int64_t k, int64_t outputs, int64_t inner) {
  ReductionPlan plan;
  if (outputs <= 0 || k <= 0) return plan;
  if (!gpu) {  // cpu, mock: a part per pool task, whole runs
    if (k >= 8192 && outputs < 64) plan.parts = std::max<int64_t>(1, std::min(k / 4096, (256 + outputs - 1) / outputs));
    return plan;
  }
  constexpr int64_t kGridThreads = int64_t{1} << 18, kMinElements = 64, kFanIn = 256;
  const int64_t threads = std::min(k / kMinElements, (kGridThreads + outputs - 1) / outputs);
  if (threads < 2) return plan;
  if (inner > 1) {  // neighbouring outputs are neighbouring elements already
    plan.parts = std::min(threads, kFanIn);
    return plan;
  }
  plan.lanes = std::min(threads, kFanIn);
  plan.parts = threads / plan.lanes;
  if (plan.parts * plan.lanes > kFanIn) plan.fold_lanes = kFanIn;
  return plan;
}

}  // namespace kiln
