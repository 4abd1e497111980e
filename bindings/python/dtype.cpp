// kiln.dtype: the enum of element types (f32, f64, i32, i64, exported into the module), with a
// constructor that accepts only values that name a dtype and str(kiln.f32) == "f32".
//
// Threading: called with the GIL held. Errors: InvalidTypeError and InvalidUsageError for
// constructor arguments (conversions.h, error_mapping.h), InvalidTypeError for a call that
// matches no signature (signatures.h).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <fmt/format.h>

#include <algorithm>
#include <string>
#include <utility>

#include "conversions.h"
#include "error_mapping.h"
#include "registration.h"
#include "signatures.h"
#include "kiln_stub_docstrings.h"

namespace kiln::python {
namespace {

/// kiln.dtype(value) (`site` "dtype" or "dtype.__setstate__"): a kiln.dtype, its name ("f32")
/// or its value (0..3). Errors: InvalidTypeError (other types), InvalidUsageError (a name or
/// value that is no dtype).
DataType dtype_from(py::handle value, const char *site) {
  DataType d{};
  if (is_integer(value)) {
    const uint64_t v = to_bytes(value, "value", site);
    d = static_cast<DataType>(std::min<uint64_t>(v, 255));
  } else {
    d = to_dtype(value, site);
  }
  if (!is_valid(d))
    raise_invalid_usage("kiln", site,
                        fmt::format("kiln.dtype({}): not a kiln dtype; the values are 0 "
                                    "(f32), 1 (f64), 2 (i32) and 3 (i64)",
                                    std::string(py::repr(value))));
  return d;
}

/// Whether `other` names dtype `d`: a kiln.dtype, a kiln or numpy dtype name, a numpy dtype or
/// scalar type. False for an int and for anything that names no dtype (never raises for those).
bool same_dtype(DataType d, py::handle other) {
  if (is_integer(other) && !py::isinstance<DataType>(other)) return false;
  try {
    return to_dtype(other, "dtype.__eq__") == d;
  } catch (const py::error_already_set &e) {
    if (e.matches(PyExc_ValueError) || e.matches(PyExc_TypeError)) return false;  // kiln's errors
    throw;
  }
}

/// dtype == other: kiln answers for what can name a dtype (a kiln dtype, a str, an int, a numpy
/// dtype, a type); anything else is left to `other` (NotImplemented), as Python's protocol asks,
/// so that unittest.mock.ANY == kiln.f32 both ways. `equal` false gives !=.
py::object compare_dtype(DataType d, py::handle other, bool equal) {
  const bool comparable = py::isinstance<DataType>(other) || py::isinstance<py::str>(other) ||
                          is_integer(other) || py::isinstance<py::dtype>(other) ||
                          PyType_Check(other.ptr());
  if (!comparable) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
  return py::bool_(same_dtype(d, other) == equal);
}

}  // namespace

void register_dtype(py::module_ &m) {
  py::enum_<DataType> dtype_enum(m, "dtype", doc("dtype"));
  dtype_enum
      .value("f32", DataType::f32)
      .value("f64", DataType::f64)
      .value("i32", DataType::i32)
      .value("i64", DataType::i64)
      .export_values()
      .def_property_readonly("itemsize", [](DataType d) { return itemsize(d); }, doc("dtype.itemsize"))
      .def_property_readonly("numpy", [](DataType d) { return numpy_dtype(d); },
                             doc("dtype.numpy"))
      // numpy's protocol: np.dtype(obj) takes obj.dtype, so np.dtype(kiln.f32) is float32.
      .def_property_readonly("dtype", [](DataType d) { return numpy_dtype(d); },
                             doc("dtype.dtype"));
  // Replaces enum_'s __init__ and __setstate__, which take any int: kiln.dtype(4) would be a
  // dtype that names nothing. Accepts a kiln.dtype, its name ("f32") or its value (0..3).
  // Wrong arity or an unknown keyword: InvalidTypeError (a last overload, as for every kiln
  // function), not pybind11's plain TypeError.
  py::delattr(dtype_enum, "__init__");
  dtype_enum.def(py::init([](py::handle value) { return dtype_from(value, "dtype"); }), py::arg("value"),
                 doc("dtype.__init__"));
  dtype_enum.def(py::init([](py::args args, py::kwargs kwargs) -> DataType {
    raise_signature_mismatch("dtype", "(value)", args, kwargs);
  }));
  // __setstate__ (pickle) as pybind11's pickle support defines it; its __getstate__ overload
  // comes after enum_'s own, which answers first (the same value).
  py::delattr(dtype_enum, "__setstate__");
  dtype_enum.def(py::pickle([](DataType d) { return py::int_(static_cast<int>(d)); },
                            [](const py::int_ &value) { return dtype_from(value, "dtype.__setstate__"); }),
                 doc("dtype.__setstate__"));
  dtype_enum.def("__setstate__", [](py::handle /*self*/, py::args args, py::kwargs kwargs) {
    raise_signature_mismatch("dtype.__setstate__", "(value)", args, kwargs);
  });
  // Replaces enum_'s comparisons: a dtype equals itself, its name ("f32") and the numpy dtype of
  // the same element type (numpy.float32, numpy.dtype("float32"), "float32"), as numpy's own
  // dtypes compare; never an int (kiln.f32 == 0 is False) nor anything else. The hash stays the
  // value's.
  dtype_enum.attr("__eq__") = py::cpp_function([](DataType d, py::handle other) { return compare_dtype(d, other, true); },
                                               py::is_method(dtype_enum), py::arg("other"), doc("dtype.__eq__"));
  dtype_enum.attr("__ne__") = py::cpp_function([](DataType d, py::handle other) { return compare_dtype(d, other, false); },
                                               py::is_method(dtype_enum), py::arg("other"), doc("dtype.__ne__"));
  // Replaces enum_'s own __str__ ("dtype.f32"): str(kiln.f32) == "f32".
  dtype_enum.attr("__str__") = py::cpp_function([](DataType d) { return std::string(to_string(d)); },
                                                py::is_method(dtype_enum), doc("dtype.__str__"));
  // Pickled by name at every protocol, as the module's global kiln._kiln.f32 (the same object
  // back): protocols 0 and 1 would otherwise call copyreg's reconstructor, which makes a
  // pybind11 base object and ends the process.
  dtype_enum.attr("__reduce__") = py::cpp_function([](DataType d) { return std::string(to_string(d)); },
                                                   py::is_method(dtype_enum), doc("dtype.__reduce__"));
  // Wrong arity (kiln.f32.__eq__(), kiln.dtype.__int__()): InvalidTypeError, as for kiln.ndarray.
  typed_mismatch_for_existing(dtype_enum, "kiln.dtype",
                              {{"__eq__", "(other)"}, {"__ne__", "(other)"}, {"__str__", "()"},
                               {"__repr__", "()"}, {"__int__", "()"}, {"__index__", "()"},
                               {"__hash__", "()"}, {"__getstate__", "()"}, {"__reduce__", "()"}});
}

}  // namespace kiln::python
