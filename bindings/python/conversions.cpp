// Python values -> kiln values (see conversions.h): integers, byte counts, flags, strings,
// dtypes, shapes and scalars; and numpy dtypes and category byte counts back.
//
// Errors are raised through error_mapping.h (InvalidTypeError for a wrong type, InvalidUsageError
// for a wrong value). Threading: the GIL is held throughout.
#include "conversions.h"

#include <pybind11/numpy.h>

#include <fmt/format.h>

#include <climits>
#include <iterator>
#include <string>
#include <string_view>

#include "error_mapping.h"

namespace kiln::python {
namespace {

/// What every call compares against, looked up once by register_conversions (at import, GIL
/// held) and kept for the life of the process (never released: no destructor runs at exit).
struct CachedTypes {
  PyObject *numpy_bool = nullptr;              // numpy.bool_
  PyObject *numpy_complexfloating = nullptr;   // numpy.complexfloating
  PyObject *dtypes[std::size(kAllDataTypes)] = {};  // kiln.f32, f64, i32, i64, as kAllDataTypes
};
CachedTypes g_types;

bool is_numpy_bool(py::handle value) { return py::isinstance(value, g_types.numpy_bool); }

/// Whether a Python error raised by user code must go on unchanged rather than become a kiln
/// error: KeyboardInterrupt, SystemExit (not an Exception) and MemoryError.
bool passes_through(const py::error_already_set &error) {
  return !error.matches(PyExc_Exception) || error.matches(PyExc_MemoryError);
}

/// operator.index(value), for a value is_integer() accepted. Errors: InvalidTypeError when the
/// value's own __index__ raises an ordinary error (which becomes the new one's __cause__); a
/// MemoryError, KeyboardInterrupt or SystemExit it raises goes on unchanged.
py::int_ index_of(py::handle value, const char *site) {
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr()));
  if (i) return i;
  py::error_already_set cause;  // fetches and clears the error __index__ raised
  if (passes_through(cause)) throw cause;
  raise_invalid_type_from(cause, site,
                          fmt::format("{}: {}.__index__() raised {}", site, type_name(value),
                                      std::string(py::repr(cause.value()))));
}

/// `i` as a long long; `*fits` says whether it fits.
long long to_long_long(const py::int_ &i, bool *fits) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  *fits = overflow == 0;
  return v;
}

[[noreturn]] void raise_wrong_shape_type(py::handle shape) {
  raise_invalid_type("ndarray", fmt::format("ndarray: shape must be an int or a sequence of ints, "
                                            "got {} {}",
                                            type_name(shape), std::string(py::repr(shape))));
}

/// One dimension `d` of `shape`. Errors: InvalidTypeError (not an integer), InvalidUsageError
/// (beyond int64).
int64_t dimension_of(py::handle d, py::handle shape) {
  if (!is_integer(d)) raise_wrong_shape_type(shape);
  py::int_ i = index_of(d, "ndarray");
  bool fits = false;
  const long long v = to_long_long(i, &fits);
  if (!fits)
    raise_invalid_usage("kiln", "ndarray",
                        fmt::format("dimension {} of shape {} is outside int64's range",
                                    std::string(py::str(i)), std::string(py::repr(shape))));
  return v;
}

/// The dimensions of a shape argument, not checked against kMaxDimensions yet.
std::vector<int64_t> dimensions_of(py::handle value) {
  std::vector<int64_t> shape;
  const auto each = [&] {
    for (py::handle d : value) {
      shape.push_back(dimension_of(d, value));
      if (shape.size() > kMaxDimensions) break;  // to_shape refuses it; an endless sequence ends
    }
  };
  if (py::isinstance<py::array>(value)) {
    const auto arr = py::reinterpret_borrow<py::array>(value);
    if (arr.ndim() > 1 || (arr.size() != 0 && arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u'))
      raise_wrong_shape_type(value);
    if (arr.ndim() == 0) {
      shape.push_back(dimension_of(value, value));
    } else {
      each();
    }
  } else if (is_integer(value)) {
    shape.push_back(dimension_of(value, value));
  } else if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    each();
  } else {
    raise_wrong_shape_type(value);  // bytes, str, None, floats, dicts, generators, ...
  }
  return shape;
}

/// "fill: f32 needs a real number, got str 'x'": the detail of a scalar of the wrong type.
std::string wrong_scalar_detail(py::handle value, DataType dtype, const char *site,
                                std::string_view needs) {
  return fmt::format("{}: {} needs {}, got {} {}", site, to_string(dtype), needs, type_name(value),
                     std::string(py::repr(value)));
}

[[noreturn]] void raise_wrong_scalar(py::handle value, DataType dtype, const char *site,
                                     std::string_view needs) {
  raise_invalid_type(site, wrong_scalar_detail(value, dtype, site, needs));
}

/// A scalar for a floating `dtype` (not a bool, not an array of 1 or more dimensions). An
/// ordinary error raised by the value's __float__ (or __index__) becomes InvalidTypeError's
/// __cause__; an OverflowError is InvalidUsageError (out of range); KeyboardInterrupt,
/// SystemExit and MemoryError go on unchanged.
Scalar real_scalar(py::handle value, DataType dtype, const char *site, bool is_array) {
  if (PyComplex_Check(value.ptr()) || py::isinstance(value, g_types.numpy_complexfloating) ||
      (is_array && py::reinterpret_borrow<py::array>(value).dtype().kind() == 'c'))
    raise_wrong_scalar(value, dtype, site, "a real number");
  if (!PyFloat_Check(value.ptr()) && !PyIndex_Check(value.ptr()) && !PyNumber_Check(value.ptr()))
    raise_wrong_scalar(value, dtype, site, "a real number");
  Scalar s;
  s.f64 = PyFloat_AsDouble(value.ptr());
  if (s.f64 == -1.0 && PyErr_Occurred()) {
    py::error_already_set cause;  // fetches and clears the error __float__ or __index__ raised
    if (passes_through(cause)) throw cause;
    if (cause.matches(PyExc_OverflowError))
      raise_invalid_usage("kiln", site, fmt::format("{}: {} is out of {}'s range", site,
                                                    std::string(py::repr(value)), to_string(dtype)));
    raise_invalid_type_from(cause, site, wrong_scalar_detail(value, dtype, site, "a real number"));
  }
  s.i64 = Scalar::of(s.f64).i64;
  return s;
}

/// A scalar for an integer `dtype`, within its range.
Scalar integer_scalar(py::handle value, DataType dtype, const char *site) {
  if (!is_integer(value)) raise_wrong_scalar(value, dtype, site, "an int");
  py::int_ i = index_of(value, site);
  bool fits = false;
  const long long v = to_long_long(i, &fits);
  fits = fits && (dtype == DataType::i64 || (v >= INT32_MIN && v <= INT32_MAX));
  if (!fits)
    raise_invalid_usage("kiln", site, fmt::format("{}: {} does not fit in {}", site,
                                                  std::string(py::str(i)), to_string(dtype)));
  Scalar s;
  s.i64 = v;
  s.f64 = static_cast<double>(v);
  return s;
}

}  // namespace

std::string type_name(py::handle value) {
  py::handle type = py::type::handle_of(value);
  const std::string module = py::str(type.attr("__module__"));
  const std::string name = py::str(type.attr("__qualname__"));
  return module == "builtins" ? name : module + "." + name;
}

bool is_integer(py::handle value) {
  if (PyLong_CheckExact(value.ptr())) return true;  // the common case: not a bool, not a dtype
  if (py::isinstance<py::array>(value)) {  // numpy arrays have __index__, only 0-d integer ones work
    const auto arr = py::reinterpret_borrow<py::array>(value);
    return arr.ndim() == 0 && (arr.dtype().kind() == 'i' || arr.dtype().kind() == 'u');
  }
  if (is_numpy_bool(value)) return false;
  return PyIndex_Check(value.ptr()) && !PyBool_Check(value.ptr()) && !py::isinstance<DataType>(value);
}

namespace {

/// `value` as an integer in [min, max]. Errors: InvalidTypeError ("{name} must be {kind}"),
/// InvalidUsageError ("{name} must {range}").
long long integer_in(py::handle value, const char *name, const char *site, long long min,
                     long long max, const char *kind, const char *range) {
  if (!is_integer(value))
    raise_invalid_type(site, fmt::format("{}: {} must be {}, got {} {}", site, name, kind,
                                         type_name(value), std::string(py::repr(value))));
  py::int_ i = index_of(value, site);
  bool fits = false;
  const long long v = to_long_long(i, &fits);
  if (!fits || v < min || v > max)
    raise_invalid_usage("kiln", site, fmt::format("{}: {} must {}, got {}", site, name, range,
                                                  std::string(py::str(i))));
  return v;
}

}  // namespace

uint64_t to_bytes(py::handle value, const char *name, const char *site) {
  return static_cast<uint64_t>(integer_in(value, name, site, 0, LLONG_MAX, "a non-negative int",
                                          "be between 0 and 2**63-1"));
}

int32_t to_int32(py::handle value, const char *name, const char *site) {
  return static_cast<int32_t>(integer_in(value, name, site, INT32_MIN, INT32_MAX, "an int", "fit in 32 bits"));
}

std::optional<uint64_t> to_optional_bytes(const py::object &value, const char *name, const char *site) {
  if (value.is_none()) return std::nullopt;
  return to_bytes(value, name, site);
}

bool to_flag(py::handle value, const char *name, const char *site) {
  if (PyBool_Check(value.ptr())) return value.ptr() == Py_True;
  if (is_numpy_bool(value)) return PyObject_IsTrue(value.ptr()) == 1;
  raise_invalid_type(site, fmt::format("{}: {} must be True or False, got {} {}", site, name,
                                       type_name(value), std::string(py::repr(value))));
}

std::string to_text(py::handle value, const char *name, const char *site) {
  if (!py::isinstance<py::str>(value))
    raise_invalid_type(site, fmt::format("{}: {} must be a str, got {} {}", site, name,
                                         type_name(value), std::string(py::repr(value))));
  const std::optional<std::string_view> utf8 = utf8_of(value);
  if (!utf8)
    raise_invalid_usage("kiln", site, fmt::format("{}: {} {} is not valid text (it holds a lone "
                                                  "surrogate, which has no UTF-8 form)",
                                                  site, name, std::string(py::repr(value))));
  return std::string(*utf8);
}

std::optional<std::string_view> utf8_of(py::handle str) {
  Py_ssize_t length = 0;
  const char *utf8 = PyUnicode_AsUTF8AndSize(str.ptr(), &length);
  if (utf8 == nullptr) {
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) throw py::error_already_set();  // MemoryError
    PyErr_Clear();  // a lone surrogate
    return std::nullopt;
  }
  return std::string_view(utf8, static_cast<std::size_t>(length));
}

namespace {

/// The kiln dtype of a numpy dtype of native byte order: float32, float64, int32, int64.
/// Errors: InvalidUsageError naming a numpy dtype kiln has no arrays of (float16, uint8, ...).
DataType from_numpy_dtype(const py::dtype &dt, const char *site) {
  const char kind = dt.kind();
  const auto bytes = dt.itemsize();
  const bool native = dt.attr("isnative").cast<bool>();
  if (native && kind == 'f' && bytes == 4) return DataType::f32;
  if (native && kind == 'f' && bytes == 8) return DataType::f64;
  if (native && kind == 'i' && bytes == 4) return DataType::i32;
  if (native && kind == 'i' && bytes == 8) return DataType::i64;
  raise_invalid_usage("kiln", site,
                      fmt::format("{}: kiln has no {} arrays; its dtypes are f32, f64, i32 and i64 "
                                  "(numpy float32, float64, int32, int64)",
                                  site, std::string(py::str(static_cast<py::handle>(dt)))));
}

/// Whether `value` is a numpy dtype or a concrete numpy scalar type (numpy.float32; not an
/// abstract one such as numpy.floating, which numpy itself deprecates as a dtype): what numpy
/// users pass as a dtype.
bool is_numpy_dtype_like(py::handle value) {
  if (py::isinstance<py::dtype>(value)) return true;
  if (!PyType_Check(value.ptr())) return false;
  const py::object concrete = py::module_::import("numpy").attr("sctypeDict").attr("values")();
  return PySequence_Contains(concrete.ptr(), value.ptr()) == 1;
}

}  // namespace

DataType to_dtype(py::handle value, const char *site) {
  for (std::size_t i = 0; i < std::size(kAllDataTypes); ++i)  // kiln.f32 itself: nothing to convert
    if (value.ptr() == g_types.dtypes[i]) return kAllDataTypes[i];
  if (py::isinstance<DataType>(value)) {
    const DataType d = value.cast<DataType>();
    if (!is_valid(d))
      raise_invalid_usage("kiln", site,
                          fmt::format("{}: kiln.dtype value {} is not a kiln dtype (f32, f64, "
                                      "i32, i64)",
                                      site, static_cast<int>(d)));
    return d;
  }
  if (py::isinstance<py::str>(value)) {
    const std::optional<std::string_view> utf8 = utf8_of(value);
    if (!utf8)  // a lone surrogate: no dtype's name
      raise_invalid_usage("kiln", site, fmt::format("{}: {} names no dtype", site, std::string(py::repr(value))));
    auto parsed = parse_dtype(std::string(*utf8));  // "f32"; then numpy's ("float32")
    if (parsed) return *parsed;
    py::dtype numpy_dtype;
    try {
      numpy_dtype = py::dtype::from_args(py::reinterpret_borrow<py::object>(value));
    } catch (const py::error_already_set &e) {
      // numpy's parser answers a malformed name ("f4,,") with TypeError, ValueError or even
      // SyntaxError; an interrupt or a MemoryError goes on.
      if (passes_through(e)) throw;
      return check(std::move(parsed));  // neither kiln's nor numpy's name: its error
    }
    return from_numpy_dtype(numpy_dtype, site);
  }
  if (is_numpy_dtype_like(value))
    return from_numpy_dtype(py::dtype::from_args(py::reinterpret_borrow<py::object>(value)), site);
  raise_invalid_type(site, fmt::format("{}: dtype must be kiln.f32, f64, i32 or i64 (or numpy's "
                                       "float32, float64, int32, int64), got {} {}",
                                       site, type_name(value), std::string(py::repr(value))));
}

namespace {

/// The common shapes, an int or an exact tuple or list of ints that each fit in int64, without
/// the iterator protocol; false for anything else (and for a dimension beyond int64), which
/// dimensions_of then converts or refuses with its error. No Python error is left set.
bool fast_dimensions(py::handle value, ShapeArg &shape) {
  PyObject *obj = value.ptr();
  const auto one = [&shape](PyObject *d) {
    if (!PyLong_CheckExact(d)) return false;
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(d, &overflow);
    return overflow == 0 && shape.push_back(v);
  };
  if (PyLong_CheckExact(obj)) return one(obj);
  if (!PyTuple_CheckExact(obj) && !PyList_CheckExact(obj)) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(obj);
  if (n > static_cast<Py_ssize_t>(kMaxDimensions)) return false;
  PyObject **items = PySequence_Fast_ITEMS(obj);
  for (Py_ssize_t i = 0; i < n; ++i)
    if (!one(items[i])) return false;
  return true;
}

}  // namespace

ShapeArg to_shape(py::handle value) {
  ShapeArg shape;  // the only object returned: built in the caller's (no copy of 264 bytes)
  if (fast_dimensions(value, shape)) return shape;
  const std::vector<int64_t> dims = dimensions_of(value);
  if (dims.size() > kMaxDimensions)  // before anything is allocated or formatted per dimension
    raise_invalid_usage("kiln", "ndarray",
                        fmt::format("ndarray: shape has {} dimensions; kiln arrays have at most {} "
                                    "(numpy's limit)",
                                    dims.size(), kMaxDimensions));
  shape.clear();  // fast_dimensions may have taken some dimensions before it gave up
  for (const int64_t d : dims) shape.push_back(d);
  return shape;
}

Scalar to_scalar(py::handle value, DataType dtype, const char *site) {
  if (PyFloat_CheckExact(value.ptr()) && is_floating(dtype)) {  // the common case: 1.0
    Scalar s;
    s.f64 = PyFloat_AS_DOUBLE(value.ptr());
    s.i64 = Scalar::of(s.f64).i64;
    return s;
  }
  const bool is_array = py::isinstance<py::array>(value);
  if (is_array && py::reinterpret_borrow<py::array>(value).ndim() != 0)
    raise_wrong_scalar(value, dtype, site, "a scalar");
  if (PyBool_Check(value.ptr()) || is_numpy_bool(value))
    raise_wrong_scalar(value, dtype, site, "a number, not a bool");
  if (is_floating(dtype)) return real_scalar(value, dtype, site, is_array);
  return integer_scalar(value, dtype, site);
}

py::dtype numpy_dtype(DataType dtype) {
  switch (dtype) {
    case DataType::f32: return py::dtype::of<float>();
    case DataType::f64: return py::dtype::of<double>();
    case DataType::i32: return py::dtype::of<int32_t>();
    case DataType::i64: return py::dtype::of<int64_t>();
  }
  return py::dtype::of<double>();
}

py::dict category_bytes(const CategoryBytes &bytes) {
  py::dict out;
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    out[py::str(std::string(to_string(static_cast<MemoryCategory>(i))))] = bytes[i];
  return out;
}

void register_conversions(py::module_ &m) {
  const py::module_ numpy = py::module_::import("numpy");
  g_types.numpy_bool = py::object(numpy.attr("bool_")).release().ptr();
  g_types.numpy_complexfloating = py::object(numpy.attr("complexfloating")).release().ptr();
  for (std::size_t i = 0; i < std::size(kAllDataTypes); ++i)
    g_types.dtypes[i] = py::object(m.attr(std::string(to_string(kAllDataTypes[i])).c_str())).release().ptr();
}

}  // namespace kiln::python
