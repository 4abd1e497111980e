// Python values -> kiln values: integers and byte counts, flags, strings, dtypes, shapes and
// scalars, checked the way every kiln entry point checks them; and the few kiln values that go
// back (numpy dtypes, per-category byte counts).
//
// Errors: a wrong type raises kiln.InvalidTypeError, a wrong value kiln.InvalidUsageError, both
// built by error_mapping.h (an ordinary error raised by the value's own __index__ or __float__
// becomes the new one's __cause__; KeyboardInterrupt, SystemExit and MemoryError go on unchanged).
// Threading: every function here needs the GIL held.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/executor/executor.h"

namespace kiln::python {

namespace py = pybind11;

/// "int", "numpy.ndarray": the type of `value` as a message names it.
[[nodiscard]] std::string type_name(py::handle value);

/// Whether `value` is an integer kiln takes: anything with __index__ (int, numpy integers)
/// except bool and kiln.dtype (an enum with __index__).
[[nodiscard]] bool is_integer(py::handle value);

/// `value` as a uint64 in [0, 2**63-1] (an int, numpy integer or other __index__ object).
/// Errors: InvalidTypeError (not an integer, or a bool), InvalidUsageError (out of range).
uint64_t to_bytes(py::handle value, const char *name, const char *site = "init");

/// `value` (an int, numpy integer or other __index__ object; not a bool) as an int32.
/// Errors: InvalidTypeError (not an integer, or its __index__ raised), InvalidUsageError (beyond
/// int32). `name` names it in the message.
int32_t to_int32(py::handle value, const char *name, const char *site);

/// to_bytes(value, name, site), or nullopt for None.
std::optional<uint64_t> to_optional_bytes(const py::object &value, const char *name, const char *site = "init");

/// A flag: True or False (or a numpy bool). None and ints are refused rather than read as
/// False. Errors: InvalidTypeError.
bool to_flag(py::handle value, const char *name, const char *site);

/// A str argument of `site`. Errors: InvalidTypeError (not a str), InvalidUsageError (a str with
/// a lone surrogate, which has no UTF-8 form).
std::string to_text(py::handle value, const char *name, const char *site);

/// The UTF-8 form of the str `str`, or nullopt when it holds a lone surrogate (no Python error
/// is left set). The view lives as long as `str`. Errors: a MemoryError goes on as it is.
std::optional<std::string_view> utf8_of(py::handle str);

/// A dtype argument: kiln.f32/f64/i32/i64 or their names. Errors: InvalidTypeError for other
/// types (numpy dtypes included), InvalidUsageError for an unknown name or a kiln.dtype made
/// from an integer that names no dtype.
DataType to_dtype(py::handle value, const char *site = "ndarray");

/// A shape argument: an int, or a list, tuple or 1-D integer numpy array of ints (numpy
/// integers too). Errors: InvalidTypeError for other types (bytes, str, floats, bools, nested
/// sequences), InvalidUsageError for a dimension beyond int64. Negative dimensions, more than
/// 32 dimensions and sizes beyond numpy's are refused by compute_shape_info (InvalidUsageError).
/// A shape argument's dimensions, held inline (at most kMaxDimensions): converting the shape of
/// every kiln.ndarray(...) call allocates nothing.
class ShapeArg {
 public:
  /// Appends a dimension; false (and nothing appended) when kMaxDimensions are held already.
  bool push_back(int64_t dim) {
    if (ndim_ == dims_.size()) return false;
    dims_[ndim_++] = dim;
    return true;
  }
  void clear() { ndim_ = 0; }
  [[nodiscard]] std::span<const int64_t> dims() const { return {dims_.data(), ndim_}; }

 private:
  std::array<int64_t, kMaxDimensions> dims_;  // only the first ndim_ are set (no zero-fill)
  std::size_t ndim_ = 0;
};

ShapeArg to_shape(py::handle value);

/// A scalar operand for an array of `dtype`: real numbers (int, float, numpy scalars, 0-d
/// arrays; nan and inf too) for floating dtypes, integers (within the dtype's range) for integer
/// ones. Errors: InvalidTypeError for other types (complex, str, None, arrays of 1 or more
/// dimensions, floats for an integer dtype; with the original error as __cause__ when the
/// value's own __float__ or __index__ raised one), InvalidUsageError for a value out of range.
Scalar to_scalar(py::handle value, DataType dtype, const char *site);

/// The numpy dtype of a kiln dtype.
py::dtype numpy_dtype(DataType dtype);

/// {"ndarray": bytes, ...}: one entry per memory category.
py::dict category_bytes(const CategoryBytes &bytes);

}  // namespace kiln::python
