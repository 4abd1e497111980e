// ndarray.__cuda_array_interface__: the CUDA Array Interface, version 3 (Numba's specification,
// which CuPy, PyTorch, JAX and Numba consume), on arrays of a CUDA executor only.
//
// On cpu, mock and amdgpu arrays the attribute raises AttributeError, so hasattr() is False and
// consumers take another path (np.asarray / the buffer protocol on host memory, DLPack with
// kDLROCM on AMD GPUs). There is no standard ROCm equivalent: CuPy's ROCm build reads
// __cuda_array_interface__ from HIP arrays, but a HIP pointer under a CUDA-named protocol would
// be taken for a CUDA pointer by any CUDA consumer in the same process, so kiln offers DLPack
// (which names the device type) for HIP instead.
//
// "stream" is None: kiln's launches wait for the device before they return, so the memory is
// ready on every stream and the consumer need not synchronize. Lifetime: as with numpy's
// __array_interface__, the consumer holds a reference to the kiln.ndarray (keeping its memory
// alive); the interface has no release hook, so once the dictionary was read, a.free() is
// refused for good (InvalidUsageError): a consumer may still use the pointer, and kiln cannot
// know when it stops. The memory goes back when the array is garbage-collected (use DLPack for
// an export that ends).
//
// Threading: called with the GIL held. Errors: AttributeError (not a CUDA array),
// InvalidUsageError (a freed array).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include <string>

#include "conversions.h"
#include "error_mapping.h"
#include "ndarray.h"
#include "ndarray_type.h"
#include "registration.h"
#include "kiln_stub_docstrings.h"

namespace kiln::python {
namespace {

/// Whether `device` (a kiln device name) is a CUDA device ("cuda:0").
bool is_cuda_device(const std::string &device) { return device.starts_with("cuda:"); }

/// The version-3 dictionary for a CUDA array: shape, typestr, data (pointer, read-only flag),
/// version, strides (None: C-contiguous) and stream (None: no synchronization needed).
py::dict cuda_array_interface(py::handle self) {
  PyArray &a = as_array(self, "__cuda_array_interface__", "self");
  if (!is_cuda_device(a.device_name()))
    throw py::attribute_error(fmt::format("kiln.ndarray on {} has no __cuda_array_interface__ (only "
                                          "arrays of a CUDA executor do; use DLPack, or "
                                          "np.asarray on cpu and mock)",
                                          a.device_name()));
  const uint64_t address = check(a.get("__cuda_array_interface__").device_address("__cuda_array_interface__"));
  a.pointer_shared = true;  // no release hook: free() refuses from now on
  py::dict d;
  d["shape"] = py::tuple(py::cast(a.shape()));
  d["typestr"] = numpy_dtype(a.dtype).attr("str");
  d["data"] = py::make_tuple(py::int_(address), false);
  d["version"] = 3;
  d["strides"] = py::none();
  d["stream"] = py::none();
  return d;
}

}  // namespace

void register_cuda_array_interface(py::module_ &m) {
  const py::object cls = m.attr("ndarray");
  def_property(cls, "__cuda_array_interface__", &cuda_array_interface, doc("ndarray.__cuda_array_interface__"),
               guarded());
}

}  // namespace kiln::python
