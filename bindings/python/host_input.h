// Host (numpy) inputs of from_numpy and axpy: a numpy array or array-like of a kiln dtype,
// checked whole before any copy, then made native-order and C-contiguous.
//
// Threading: the GIL is held. Errors are raised through error_mapping.h: InvalidTypeError,
// InvalidUsageError, and HostOutOfMemoryError where numpy would raise MemoryError.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <utility>

#include "kiln/executor/executor.h"

namespace kiln::python {

namespace py = pybind11;

/// `value` as a numpy array of a kiln dtype, not copied yet (np.asarray for array-likes that are
/// not numpy arrays), so that a call can be checked whole before any copy of a large input.
/// Errors: InvalidUsageError for numpy arrays of other dtypes (float16, bool, object,
/// structured, ...), InvalidTypeError for masked arrays (their mask would be ignored) and for
/// values that are not numbers (None, str, bytes, objects numpy cannot read as numbers).
std::pair<py::array, DataType> host_input(py::handle value, const char *site);

/// `arr` (from host_input) in native byte order and C order, copied only when it is not so
/// already. Errors: HostOutOfMemoryError when the copy cannot be had.
py::array contiguous_host_array(py::array arr, const char *site);

}  // namespace kiln::python
