// The operations: kiln.fill, copy, axpy, reduce_sum, matmul, compact_positive, and their
// registration.
//
// Every operation checks all its arguments (types, then dtypes, shapes and aliasing in the
// executor) before it allocates or copies anything: a usage mistake is never out-of-memory.
// Threading: arguments are read with the GIL held; the kernels run in launch() with the GIL
// released and the arrays marked busy, except a small element-wise launch on the CPU, which
// launch_small runs with the GIL held (ndarray.h). Errors: argument errors come from conversions.h and
// as_array, executor failures from check() (error_mapping.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <fmt/format.h>

#include <array>
#include <span>

#include "conversions.h"
#include "error_mapping.h"
#include "fast_entry.h"
#include "host_input.h"
#include "ndarray.h"
#include "ndarray_type.h"
#include "registration.h"
#include "signatures.h"
#include "kiln_stub_docstrings.h"

namespace kiln::python {
namespace {

void fill(py::handle out_obj, py::handle value) {
  const Operand out = first_operand(out_obj, "fill", "out");
  const Scalar s = to_scalar(value, out.array.dtype(), "fill");
  auto ex = executor_for("fill", {{"out", &out.py}});
  check(launch_small(*ex, out.array.num_elements(), {&out.py}, [&] { return ex->fill(out.array, s); }));
}

void copy(py::handle dst_obj, py::handle src_obj) {
  const auto [dst, src] = first_operands(dst_obj, src_obj, "copy", "dst", "src");
  auto ex = executor_for("copy", {{"dst", &dst.py}, {"src", &src.py}});
  check(launch_small(*ex, dst.array.num_elements(), {&dst.py, &src.py},
                     [&] { return ex->copy(dst.array, src.array); }));
}

/// axpy with x in host memory: checked against y before any copy of it, then staged for the
/// launch.
void axpy_from_host(LlvmRuntimeExecutor &ex, const Scalar &a, py::handle x, PyArray &y,
                    const Ndarray &yy) {
  check(ex.check_usable("axpy", yy));
  auto [input, dtype] = host_input(x, "axpy");
  const std::vector<int64_t> shape(input.shape(), input.shape() + input.ndim());
  if (dtype != yy.dtype() || shape != yy.shape())
    raise_invalid_usage(y.device_name(), "axpy",
                        fmt::format("axpy needs x of y's dtype and shape: x is {}, y is {}",
                                    describe_array(dtype, shape), y.description()));
  const py::array host = contiguous_host_array(input, "axpy");
  const std::span<const std::byte> bytes(static_cast<const std::byte *>(host.data()),
                                         static_cast<std::size_t>(host.nbytes()));
  check(launch({&y}, [&] { return ex.axpy_from_host(a, bytes, yy); }));
}

void axpy(py::handle alpha, py::handle x, py::handle y_obj) {
  const Operand y = first_operand(y_obj, "axpy", "y");
  const Scalar a = to_scalar(alpha, y.array.dtype(), "axpy");
  if (!is_ndarray(x)) return axpy_from_host(*executor_for("axpy", {{"y", &y.py}}), a, x, y.py, y.array);
  PyArray &xa = as_array(x, "axpy", "x");
  const Ndarray &xx = xa.get("axpy");
  auto ex = executor_for("axpy", {{"x", &xa}, {"y", &y.py}});
  check(launch_small(*ex, y.array.num_elements(), {&xa, &y.py}, [&] { return ex->axpy(a, xx, y.array); }));
}

py::object reduce_sum(py::handle x_obj) {
  const Operand x = first_operand(x_obj, "reduce_sum", "x");
  auto ex = executor_for("reduce_sum", {{"x", &x.py}});
  const Scalar sum =
      check(launch_small(*ex, x.array.num_elements(), {&x.py}, [&] { return ex->reduce_sum(x.array); }));
  if (is_floating(x.array.dtype())) return py::float_(sum.f64);
  return py::int_(sum.i64);
}

py::object matmul(py::handle a_obj, py::handle b_obj, py::object out_obj) {
  const auto [a, b] = first_operands(a_obj, b_obj, "matmul", "a", "b");
  const Ndarray &aa = a.array;
  const Ndarray &bb = b.array;
  PyArray *out_array = out_obj.is_none() ? nullptr : &as_array(out_obj, "matmul", "out");
  auto ex = out_array == nullptr ? executor_for("matmul", {{"a", &a.py}, {"b", &b.py}})
                                 : executor_for("matmul", {{"a", &a.py}, {"b", &b.py}, {"out", out_array}});
  // The whole call is checked before the output exists (validation before reservation).
  const std::array<int64_t, 2> shape = check(ex->matmul_output_shape(aa, bb));
  if (out_obj.is_none()) {
    BusyScope operands({&a.py, &b.py});  // an OOM observer may not free them while out is allocated
    out_obj = wrap_array(check(ex->ndarray(aa.dtype(), shape)), *a.py.state, *ex);
  }
  PyArray &c = as_array(out_obj, "matmul", "out");
  const Ndarray &cc = c.get("matmul");  // shape, dtype and aliasing are checked by the executor
  check(launch({&a.py, &b.py, &c}, [&] { return ex->matmul(cc, aa, bb); }));
  return out_obj;
}

py::object compact_positive(py::handle x_obj) {
  const Operand x = first_operand(x_obj, "compact_positive", "x");
  auto ex = executor_for("compact_positive", {{"x", &x.py}});
  Ndarray out = check(launch({&x.py}, [&] { return ex->compact_positive(x.array); }));
  return wrap_array(std::move(out), *x.py.state, *ex);
}

}  // namespace

void register_ops(py::module_ &m) {
  def_typed(m, "fill", "(out, value)", &fill, doc("fill"), py::arg("out"), py::arg("value"),
            guarded());
  def_typed(m, "copy", "(dst, src)", &copy, doc("copy"), py::arg("dst"), py::arg("src"), guarded());
  def_typed(m, "axpy", "(alpha, x, y)", &axpy, doc("axpy"), py::arg("alpha"), py::arg("x"), py::arg("y"),
            guarded());
  def_typed(m, "reduce_sum", "(x)", &reduce_sum, doc("reduce_sum"), py::arg("x"), guarded());
  def_typed(m, "matmul", "(a, b, out=None)", &matmul, doc("matmul"), py::arg("a"), py::arg("b"),
            py::arg("out") = py::none(), guarded());
  def_typed(m, "compact_positive", "(x)", &compact_positive, doc("compact_positive"),
            py::arg("x"), guarded());
  // The element-wise operations on small arrays cost about as much as their call: their common
  // all-positional form skips pybind11's dispatcher (fast_entry.h).
  FastFunction<&fill, 2>::install(m, "fill");
  FastFunction<&copy, 2>::install(m, "copy");
  FastFunction<&axpy, 3>::install(m, "axpy");
  FastFunction<&reduce_sum, 1>::install(m, "reduce_sum");
}

}  // namespace kiln::python
