// Host (numpy) inputs of from_numpy and axpy (see host_input.h).
//
// Threading: the GIL is held. Errors are raised through error_mapping.h.
#include "host_input.h"

#include <fmt/format.h>

#include <optional>
#include <string>
#include <string_view>

#include "conversions.h"
#include "error_mapping.h"

namespace kiln::python {
namespace {

/// np.asarray(value) for an array-like that is not a numpy array. Errors: HostOutOfMemoryError,
/// InvalidUsageError for anything numpy refuses; a KeyboardInterrupt or SystemExit raised by the
/// value's own code (__array__, __len__, ...) goes on unchanged.
py::array as_numpy(py::handle value, const char *site) {
  try {
    return py::module_::import("numpy").attr("asarray")(value);
  } catch (py::error_already_set &e) {
    if (e.matches(PyExc_MemoryError))
      raise_host_oom("host", site, 0, "converting the input to a numpy array");
    if (!e.matches(PyExc_Exception)) throw;  // KeyboardInterrupt, SystemExit: not a usage mistake
    raise_invalid_usage("kiln", site,
                        fmt::format("{} needs a numpy array (f32, f64, i32 or i64), got {}: {}",
                                    site, type_name(value), e.what()));
  }
}

/// The kiln dtype of numpy dtype `dt`, if it has one.
std::optional<DataType> kiln_dtype_of(const py::dtype &dt) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'f' && size == 4) return DataType::f32;
  if (kind == 'f' && size == 8) return DataType::f64;
  if (kind == 'i' && size == 4) return DataType::i32;
  if (kind == 'i' && size == 8) return DataType::i64;
  return std::nullopt;
}

}  // namespace

std::pair<py::array, DataType> host_input(py::handle value, const char *site) {
  if (py::isinstance(value, py::module_::import("numpy").attr("ma").attr("MaskedArray")))
    raise_invalid_type(site, fmt::format("{}: a numpy masked array's mask would be ignored; pass "
                                         "a.filled(value) or a.data",
                                         site));
  const bool is_numpy = py::isinstance<py::array>(value);
  py::array arr = is_numpy ? py::reinterpret_borrow<py::array>(value) : as_numpy(value, site);
  const py::dtype dt = arr.dtype();
  // Something that is not numbers at all (None, a str, a dict): a wrong type, not a wrong dtype.
  if (!is_numpy && std::string_view("OSUV").find(dt.kind()) != std::string_view::npos)
    raise_invalid_type(site, fmt::format("{} needs a numpy array or a sequence of numbers (f32, "
                                         "f64, i32 or i64), got {} {}",
                                         site, type_name(value), std::string(py::repr(value)).substr(0, 80)));
  const std::optional<DataType> kiln_dtype = kiln_dtype_of(dt);
  if (!kiln_dtype)
    raise_invalid_usage("kiln", site,
                        fmt::format("numpy dtype {} is not supported; kiln has f32, f64, i32, i64 "
                                    "(convert first, e.g. a.astype(numpy.float32))",
                                    std::string(py::str(static_cast<const py::handle &>(dt)))));
  return {arr, *kiln_dtype};
}

py::array contiguous_host_array(py::array arr, const char *site) {
  const py::dtype dt = arr.dtype();
  const uint64_t nbytes = static_cast<uint64_t>(arr.nbytes());
  try {
    if (!py::bool_(dt.attr("isnative")))
      arr = arr.attr("astype")(dt.attr("newbyteorder")("="));
    if (!(arr.flags() & py::array::c_style))
      arr = py::module_::import("numpy").attr("ascontiguousarray")(arr);
  } catch (py::error_already_set &e) {
    if (!e.matches(PyExc_MemoryError)) throw;
    raise_host_oom("host", site, nbytes, "copying the input to a contiguous host array");
  }
  return arr;
}

}  // namespace kiln::python
