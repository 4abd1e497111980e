// What kiln's DLPack export (dlpack.cpp) and import (dlpack_import.cpp) share: the capsule
// names, DLPack devices and dtypes as kiln names them, and calling into Python from a deleter.
// DLPack 0.6 (Debian's <dlpack/dlpack.h>); see dlpack.cpp for the lifetimes and errors.
#ifndef KILN_BINDINGS_PYTHON_DLPACK_COMMON_H_
#define KILN_BINDINGS_PYTHON_DLPACK_COMMON_H_

#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ndarray.h"

namespace kiln::python::dlpack {

namespace py = pybind11;

inline constexpr const char *kCapsuleName = "dltensor";
inline constexpr const char *kUsedCapsuleName = "used_dltensor";

/// The DLPack device of a kiln device name: "cpu" and "mock" are host memory (kDLCPU, 0);
/// "cuda:N" is (kDLCUDA, N); "amdgpu:N" is (kDLROCM, N).
[[nodiscard]] DLDevice dl_device_of(const std::string &device_name);
/// A DLPack device as plain ints: what a user object gave, which may be no DLDeviceType at all
/// (a cast of such an int to the enum would be undefined).
struct DevicePair {
  int32_t type = 0;
  int32_t id = 0;
};
[[nodiscard]] inline DevicePair pair_of(DLDevice d) { return {static_cast<int32_t>(d.device_type), d.device_id}; }

/// "cpu", "cuda:0", "rocm:1", "DLPack device type 4:0": a DLPack device as messages name it.
[[nodiscard]] std::string describe_device(DevicePair device);
[[nodiscard]] inline std::string describe_device(DLDevice device) { return describe_device(pair_of(device)); }
/// The one-lane DLPack dtype of a kiln dtype.
[[nodiscard]] DLDataType dl_dtype_of(DataType dtype);
/// The kiln dtype of a one-lane DLPack dtype, or nullopt when kiln has none.
[[nodiscard]] std::optional<DataType> kiln_dtype_of(DLDataType t);
/// "float16", "uint8", "bool8", "complex64x4": a DLPack dtype as messages name it.
[[nodiscard]] std::string describe_dtype(DLDataType t);

/// The DLPack device in `value`: a tuple of exactly two ints (device_type, device_id; not
/// bools), each within int32. `what` says where `value` came from in the message
/// ("dl_device", "what Tensor.__dlpack_device__() returned"). Errors: InvalidTypeError (another
/// type, another length, an element that is not an int), InvalidUsageError (beyond int32).
[[nodiscard]] DevicePair to_dl_device(py::handle value, const std::string &what, const char *site);

/// Runs `fn` with the GIL held, whichever thread calls it, keeping any pending Python error.
/// Once the interpreter is gone or finalizing (and this thread does not hold the GIL), `fn` is
/// skipped: what it would release is leaked, never touched without a GIL. Never throws.
template <class Fn>
void with_gil(Fn &&fn) noexcept {
  if (!Py_IsInitialized()) return;
#if PY_VERSION_HEX >= 0x030D0000  // Python 3.13 made it public (and removed the private name)
  if (!PyGILState_Check() && Py_IsFinalizing()) return;
#else
  if (!PyGILState_Check() && _Py_IsFinalizing()) return;
#endif
  const PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  fn();
  PyErr_Restore(type, value, traceback);
  PyGILState_Release(gil);
}

/// The destructor of a "dltensor" capsule (exported by kiln, or handed to from_dlpack): the
/// tensor's deleter runs only if no consumer took it (renamed "used_dltensor").
void delete_unconsumed_capsule(PyObject *capsule);

/// kiln.from_dlpack(x): a kiln.ndarray over `x`'s memory on the current executor (no copy).
/// Errors: see dlpack.cpp.
[[nodiscard]] py::object from_dlpack(py::handle x);

}  // namespace kiln::python::dlpack

#endif  // KILN_BINDINGS_PYTHON_DLPACK_COMMON_H_
