// The built-in operations: each validates its operands, builds a LaunchSpec and launches.
#include <bit>
#include <cstring>

#include <fmt/format.h>

#include "kiln/executor/executor.h"
#include "kiln/executor/launcher.h"

namespace kiln {
namespace {

/// "kiln_<op>_<dtype>", by appending (fmt's formatting cost a tenth of a 1-element launch).
std::string kernel_name(std::string_view op, DataType dtype) {
  std::string name = "kiln_";
  name.append(op).append("_").append(to_string(dtype));
  return name;
}

void set_scalar(KilnKernelArgs &args, Scalar value) {
  args.scalar_f64 = value.f64;
  args.scalar_i64 = value.i64;
}

}  // namespace

RhiStatus LlvmRuntimeExecutor::fill(const Ndarray &out, Scalar value) {
  KILN_RETURN_IF_ERROR(check_usable("fill", out));
  if (out.num_elements() == 0) return {};
  LaunchSpec spec;
  spec.kernel = kernel_name("fill", out.dtype());
  KILN_ASSIGN_OR_RETURN(spec.args.ptr[0], out.device_address("fill"));
  spec.args.num_elements = out.num_elements();
  set_scalar(spec.args, value);
  spec.iteration_size = static_cast<int64_t>(out.num_elements());
  KILN_ASSIGN_OR_RETURN(auto result, launcher_->launch(spec));
  return {};
}

RhiStatus LlvmRuntimeExecutor::copy(const Ndarray &dst, const Ndarray &src) {
  KILN_RETURN_IF_ERROR(check_same("copy", dst, src));
  if (dst.num_elements() == 0) return {};
  LaunchSpec spec;
  spec.kernel = kernel_name("copy", dst.dtype());
  KILN_ASSIGN_OR_RETURN(spec.args.ptr[0], dst.device_address("copy"));
  KILN_ASSIGN_OR_RETURN(spec.args.ptr[1], src.device_address("copy"));
  spec.args.num_elements = dst.num_elements();
  spec.iteration_size = static_cast<int64_t>(dst.num_elements());
  KILN_ASSIGN_OR_RETURN(auto result, launcher_->launch(spec));
  return {};
}

RhiStatus LlvmRuntimeExecutor::axpy(Scalar alpha, const Ndarray &x, const Ndarray &y) {
  KILN_RETURN_IF_ERROR(check_same("axpy", x, y));
  if (y.num_elements() == 0) return {};
  LaunchSpec spec;
  spec.kernel = kernel_name("axpy", y.dtype());
  KILN_ASSIGN_OR_RETURN(spec.args.ptr[0], y.device_address("axpy"));
  KILN_ASSIGN_OR_RETURN(spec.args.ptr[1], x.device_address("axpy"));
  spec.args.num_elements = y.num_elements();
  set_scalar(spec.args, alpha);
  spec.iteration_size = static_cast<int64_t>(y.num_elements());
  KILN_ASSIGN_OR_RETURN(auto result, launcher_->launch(spec));
  return {};
}

RhiStatus LlvmRuntimeExecutor::axpy_from_host(Scalar alpha, std::span<const std::byte> x_host,
                                              const Ndarray &y) {
  KILN_RETURN_IF_ERROR(check_usable("axpy_from_host", y));
  if (x_host.size() != y.nbytes())
    return std::unexpected(invalid_usage(
        device().name(), "axpy_from_host",
        fmt::format("host x has {} bytes, y {} has {}", x_host.size(), y.describe(), y.nbytes())));
  if (y.num_elements() == 0) return {};
  LaunchSpec spec;
  spec.kernel = kernel_name("axpy", y.dtype());
  KILN_ASSIGN_OR_RETURN(spec.args.ptr[0], y.device_address("axpy_from_host"));
  spec.host_operands.push_back(HostOperand{1, x_host});
  spec.args.num_elements = y.num_elements();
  set_scalar(spec.args, alpha);
  spec.iteration_size = static_cast<int64_t>(y.num_elements());
  KILN_ASSIGN_OR_RETURN(auto result, launcher_->launch(spec));
  return {};
}

RhiExpected<Scalar> LlvmRuntimeExecutor::reduce_sum(const Ndarray &x) {
  KILN_RETURN_IF_ERROR(check_usable("reduce_sum", x));
  if (x.num_elements() == 0) return Scalar{};
  LaunchSpec spec;
  spec.kernel = kernel_name("reduce_sum", x.dtype());
  KILN_ASSIGN_OR_RETURN(spec.args.ptr[0], x.device_address("reduce_sum"));
  spec.args.num_elements = x.num_elements();
  spec.iteration_size = static_cast<int64_t>(x.num_elements());
  spec.wants_task_results = true;
  KILN_ASSIGN_OR_RETURN(const LaunchResult result, launcher_->launch(spec));
  Scalar sum;
  uint64_t int_sum = 0;  // integers wrap: sum in unsigned
  for (const KilnTaskResult &r : result.task_results) {
    sum.f64 += std::bit_cast<double>(r.value_bits);
    int_sum += r.value_bits;
  }
  if (is_floating(x.dtype())) {
    sum.i64 = Scalar::of(sum.f64).i64;
  } else {
    sum.i64 = static_cast<int64_t>(int_sum);
    sum.f64 = static_cast<double>(sum.i64);
  }
  return sum;
}

RhiExpected<std::array<int64_t, 2>> LlvmRuntimeExecutor::matmul_output_shape(const Ndarray &a,
                                                                             const Ndarray &b) const {
  for (const Ndarray *m : {&a, &b}) KILN_RETURN_IF_ERROR(check_usable("matmul", *m));
  const auto bad = [&](std::string_view why) {
    return std::unexpected(invalid_usage(
        device().name(), "matmul", fmt::format("matmul {} @ {}: {}", a.describe(), b.describe(), why)));
  };
  if (a.shape().size() != 2 || b.shape().size() != 2) return bad("operands must be 2-D");
  if (a.dtype() != b.dtype()) return bad("operands must share a dtype");
  if (b.shape()[0] != a.shape()[1]) return bad("shapes do not agree (need (m,k) @ (k,n) -> (m,n))");
  return std::array<int64_t, 2>{a.shape()[0], b.shape()[1]};
}

RhiStatus LlvmRuntimeExecutor::matmul(const Ndarray &c, const Ndarray &a, const Ndarray &b) {
  KILN_RETURN_IF_ERROR(check_usable("matmul", c));
  KILN_ASSIGN_OR_RETURN(const auto out_shape, matmul_output_shape(a, b));
  const auto bad = [&](std::string why) -> RhiStatus {
    return std::unexpected(invalid_usage(device().name(), "matmul",
                                         fmt::format("matmul {} = {} @ {}: {}", c.describe(),
                                                     a.describe(), b.describe(), why)));
  };
  if (c.dtype() != a.dtype()) return bad("the output must have the operands' dtype");
  if (c.shape().size() != 2 || c.shape()[0] != out_shape[0] || c.shape()[1] != out_shape[1])
    return bad("the output must be (m, n) for (m,k) @ (k,n)");
  if (c.same_as(a) || c.same_as(b)) return bad("the output must not be an operand");
  const int64_t m = out_shape[0], k = a.shape()[1], n = out_shape[1];
  if (c.num_elements() == 0) return {};
  if (k == 0) return fill(c, Scalar{});
  LaunchSpec spec;
  spec.kernel = kernel_name("matmul", c.dtype());
  KILN_ASSIGN_OR_RETURN(spec.args.ptr[0], c.device_address("matmul"));
  KILN_ASSIGN_OR_RETURN(spec.args.ptr[1], a.device_address("matmul"));
  KILN_ASSIGN_OR_RETURN(spec.args.ptr[2], b.device_address("matmul"));
  spec.args.dims[0] = static_cast<uint64_t>(m);
  spec.args.dims[1] = static_cast<uint64_t>(n);
  spec.args.dims[2] = static_cast<uint64_t>(k);
  spec.iteration_size = m;
  spec.min_elements_per_task = std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(1, n * k));
  KILN_ASSIGN_OR_RETURN(auto result, launcher_->launch(spec));
  return {};
}

RhiExpected<Ndarray> LlvmRuntimeExecutor::compact_positive(const Ndarray &x) {
  KILN_RETURN_IF_ERROR(check_usable("compact_positive", x));
  const int64_t zero_shape[1] = {0};
  if (x.num_elements() == 0) return ndarray(x.dtype(), zero_shape);
  LaunchSpec spec;
  spec.kernel = kernel_name("compact_positive", x.dtype());
  KILN_ASSIGN_OR_RETURN(spec.args.ptr[0], x.device_address("compact_positive"));
  spec.args.num_elements = x.num_elements();
  spec.iteration_size = static_cast<int64_t>(x.num_elements());
  spec.wants_task_results = true;
  // The heap blocks live until the next launch: the launcher's lock is not enough, so hold the
  // launch and the copy-out together.
  std::lock_guard lock(compact_mutex_);
  KILN_ASSIGN_OR_RETURN_CONTEXT(const LaunchResult launched, launcher_->launch(spec),
                                "compacting {}", x.describe());
  uint64_t count = 0;
  for (const KilnTaskResult &r : launched.task_results) count += r.count;
  const int64_t out_shape[1] = {static_cast<int64_t>(count)};
  KILN_ASSIGN_OR_RETURN(Ndarray out, ndarray(x.dtype(), out_shape));
  uint64_t heap_base = 0;
  if (heap_alloc_) {
    KILN_ASSIGN_OR_RETURN(heap_base, device().device_address(*heap_alloc_));
  }
  uint64_t offset = 0;
  for (const KilnTaskResult &r : launched.task_results) {
    if (r.count == 0) continue;
    const uint64_t bytes = r.count * itemsize(x.dtype());
    KILN_RETURN_IF_ERROR(device().memcpy_device_to_device(*out.state_->alloc, offset, *heap_alloc_,
                                                          r.address - heap_base, bytes));
    offset += bytes;
  }
  return out;
}

}  // namespace kiln
