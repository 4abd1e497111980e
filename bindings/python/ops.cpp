// The operations: kiln.fill, copy, axpy, reduce_sum, matmul, compact_positive, and their
// registration.
//
// Every operation checks all its arguments (types, then dtypes, shapes and aliasing in the
// executor) before it allocates or copies anything: a usage mistake is never out-of-memory.
// Threading: arguments are read with the GIL held; the kernels run in launch() with the GIL
// released and the arrays marked busy. Errors: argument errors come from conversions.h and
// as_array, executor failures from check() (error_mapping.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <fmt/format.h>

#include <array>
#include <span>

#include "conversions.h"
#include "error_mapping.h"
#include "host_input.h"
#include "ndarray.h"
#include "registration.h"
#include "signatures.h"

namespace kiln::python {
namespace {

void fill(py::handle out_obj, py::handle value) {
  check_not_in_observer("fill");
  PyArray &out = as_array(out_obj, "fill", "out");
  const Ndarray &o = out.get("fill");
  const Scalar s = to_scalar(value, o.dtype(), "fill");
  auto ex = executor();
  check(launch({&out}, [&] { return ex->fill(o, s); }));
}

void copy(py::handle dst_obj, py::handle src_obj) {
  check_not_in_observer("copy");
  PyArray &dst = as_array(dst_obj, "copy", "dst");
  PyArray &src = as_array(src_obj, "copy", "src");
  const Ndarray &d = dst.get("copy");
  const Ndarray &s = src.get("copy");
  auto ex = executor();
  check(launch({&dst, &src}, [&] { return ex->copy(d, s); }));
}

/// axpy with x in host memory: checked against y before any copy of it, then staged for the
/// launch.
void axpy_from_host(LlvmRuntimeExecutor &ex, const Scalar &a, py::handle x, PyArray &y,
                    const Ndarray &yy) {
  check(ex.check_usable("axpy", yy));
  auto [input, dtype] = host_input(x, "axpy");
  const std::vector<int64_t> shape(input.shape(), input.shape() + input.ndim());
  if (dtype != yy.dtype() || shape != yy.shape())
    raise_invalid_usage(y.device, "axpy",
                        fmt::format("axpy needs x of y's dtype and shape: x is {}, y is {}",
                                    describe_array(dtype, shape), y.description));
  const py::array host = contiguous_host_array(input, "axpy");
  const std::span<const std::byte> bytes(static_cast<const std::byte *>(host.data()),
                                         static_cast<std::size_t>(host.nbytes()));
  check(launch({&y}, [&] { return ex.axpy_from_host(a, bytes, yy); }));
}

void axpy(py::handle alpha, py::handle x, py::handle y_obj) {
  check_not_in_observer("axpy");
  PyArray &y = as_array(y_obj, "axpy", "y");
  const Ndarray &yy = y.get("axpy");
  const Scalar a = to_scalar(alpha, yy.dtype(), "axpy");
  auto ex = executor();
  if (!py::isinstance<PyArray>(x)) return axpy_from_host(*ex, a, x, y, yy);
  PyArray &xa = as_array(x, "axpy", "x");
  const Ndarray &xx = xa.get("axpy");
  check(launch({&xa, &y}, [&] { return ex->axpy(a, xx, yy); }));
}

py::object reduce_sum(py::handle x_obj) {
  check_not_in_observer("reduce_sum");
  PyArray &x = as_array(x_obj, "reduce_sum", "x");
  const Ndarray &xx = x.get("reduce_sum");
  auto ex = executor();
  const Scalar sum = check(launch({&x}, [&] { return ex->reduce_sum(xx); }));
  if (is_floating(xx.dtype())) return py::float_(sum.f64);
  return py::int_(sum.i64);
}

py::object matmul(py::handle a_obj, py::handle b_obj, py::object out_obj) {
  check_not_in_observer("matmul");
  PyArray &a = as_array(a_obj, "matmul", "a");
  PyArray &b = as_array(b_obj, "matmul", "b");
  const Ndarray &aa = a.get("matmul");
  const Ndarray &bb = b.get("matmul");
  auto ex = executor();
  // The whole call is checked before the output exists (validation before reservation).
  const std::array<int64_t, 2> shape = check(ex->matmul_output_shape(aa, bb));
  if (out_obj.is_none()) {
    BusyScope operands({&a, &b});  // an OOM observer may not free them while out is allocated
    out_obj = py::cast(PyArray(check(ex->ndarray(aa.dtype(), shape)), ex));
  }
  PyArray &c = as_array(out_obj, "matmul", "out");
  const Ndarray &cc = c.get("matmul");  // shape, dtype and aliasing are checked by the executor
  check(launch({&a, &b, &c}, [&] { return ex->matmul(cc, aa, bb); }));
  return out_obj;
}

PyArray compact_positive(py::handle x_obj) {
  check_not_in_observer("compact_positive");
  PyArray &x = as_array(x_obj, "compact_positive", "x");
  const Ndarray &xx = x.get("compact_positive");
  auto ex = executor();
  Ndarray out = check(launch({&x}, [&] { return ex->compact_positive(xx); }));
  return PyArray(std::move(out), ex);
}

}  // namespace

void register_ops(py::module_ &m) {
  m.def("fill", &fill, py::arg("out"), py::arg("value"), guarded());
  m.def("copy", &copy, py::arg("dst"), py::arg("src"), guarded());
  m.def("axpy", &axpy, py::arg("alpha"), py::arg("x"), py::arg("y"), guarded());
  m.def("reduce_sum", &reduce_sum, py::arg("x"), guarded());
  m.def("matmul", &matmul, py::arg("a"), py::arg("b"), py::arg("out") = py::none(), guarded());
  m.def("compact_positive", &compact_positive, py::arg("x"), guarded());
  typed_mismatch(m, "fill", "(out, value)");
  typed_mismatch(m, "copy", "(dst, src)");
  typed_mismatch(m, "axpy", "(alpha, x, y)");
  typed_mismatch(m, "reduce_sum", "(x)");
  typed_mismatch(m, "matmul", "(a, b, out=None)");
  typed_mismatch(m, "compact_positive", "(x)");
}

}  // namespace kiln::python
