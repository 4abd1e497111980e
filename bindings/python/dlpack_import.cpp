// kiln.from_dlpack: a kiln.ndarray over another library's DLPack tensor, no copy (lifetimes and
// errors: dlpack.cpp). Every check runs before the capsule is consumed.
#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "conversions.h"
#include "dlpack_common.h"
#include "error_mapping.h"
#include "ndarray.h"
#include "ndarray_type.h"

namespace kiln::python::dlpack {
namespace {

/// Whether kiln has an executor kind for DLPack device type `type`.
bool kiln_has_device_type(int type) { return type == kDLCPU || type == kDLCUDA || type == kDLROCM; }

/// A tensor on `tensor` (a DLPack device) must be on the current executor's device `here`.
/// Errors: NotSupportedError (a device type kiln has no executor for), InvalidUsageError
/// (another kiln device: make the tensor's device current first).
void check_device(DevicePair tensor, DLDevice here, const std::string &kiln_device) {
  if (!kiln_has_device_type(tensor.type))
    raise_failure(make_failure(RhiResult::not_supported, kiln_device, "from_dlpack",
                               fmt::format("from_dlpack: the tensor is on {}; kiln has executors "
                                           "for cpu (and mock), cuda and amdgpu (rocm) memory only",
                                           describe_device(tensor))));
  if (tensor.type != static_cast<int32_t>(here.device_type) || tensor.id != here.device_id)
    raise_invalid_usage(kiln_device, "from_dlpack",
                        fmt::format("from_dlpack: the tensor is on {} but kiln's current device is {} "
                                    "({}); import it inside `with kiln.device(...)` of the tensor's "
                                    "device, or copy it there",
                                    describe_device(tensor), kiln_device, describe_device(here)));
}

/// `x`'s attribute `name` (a DLPack protocol method). Errors: InvalidTypeError when it is not
/// callable; what the attribute's own lookup raises goes on.
py::object protocol_method(py::handle x, const char *name) {
  py::object method = x.attr(name);
  if (!PyCallable_Check(method.ptr()))
    raise_invalid_type("from_dlpack", fmt::format("from_dlpack: {}.{} is {} {}, not a method",
                                                  type_name(x), name, type_name(method),
                                                  std::string(py::repr(method))));
  return method;
}

/// The capsule of `x`: `x` itself, or what its __dlpack__ gives. When `x` has
/// __dlpack_device__, its device is checked first (nothing is exported for a device kiln
/// cannot take), and a GPU producer is asked for the stream kiln's launches use (the legacy
/// default stream: 1 for CUDA, 0 for ROCm). Errors: InvalidTypeError, those of check_device and
/// of the producer's __dlpack__ (numpy: BufferError for a read-only array).
py::object capsule_of(py::handle x, DLDevice here, const std::string &kiln_device) {
  if (PyCapsule_CheckExact(x.ptr())) return py::reinterpret_borrow<py::object>(x);
  if (!py::hasattr(x, "__dlpack__"))
    raise_invalid_type("from_dlpack", fmt::format("from_dlpack: x must have __dlpack__ (a numpy "
                                                  "array, a torch or cupy tensor, ...) or be a "
                                                  "DLPack capsule, got {}",
                                                  type_name(x)));
  const py::object export_fn = protocol_method(x, "__dlpack__");
  py::object capsule;
  if (py::hasattr(x, "__dlpack_device__")) {
    // What the producer's own method raises goes on as it is; what it returns is checked.
    const py::object device = protocol_method(x, "__dlpack_device__")();
    const DevicePair dl = to_dl_device(device, "what " + type_name(x) + ".__dlpack_device__() returned",
                                       "from_dlpack");
    check_device(dl, here, kiln_device);
    if (dl.type == kDLCUDA) capsule = export_fn(py::arg("stream") = 1);
    else if (dl.type == kDLROCM) capsule = export_fn(py::arg("stream") = 0);
  }
  if (!capsule) capsule = export_fn();
  if (!PyCapsule_CheckExact(capsule.ptr()))
    raise_invalid_type("from_dlpack", fmt::format("from_dlpack: {}.__dlpack__() returned {}, not a "
                                                  "DLPack capsule",
                                                  type_name(x), type_name(capsule)));
  return capsule;
}

/// The tensor in `capsule`. Errors: InvalidUsageError (already consumed), InvalidTypeError (a
/// capsule of another kind).
DLManagedTensor *tensor_of(const py::object &capsule, const std::string &kiln_device) {
  if (PyCapsule_IsValid(capsule.ptr(), kUsedCapsuleName))
    raise_invalid_usage(kiln_device, "from_dlpack",
                        "from_dlpack: the DLPack capsule was already consumed (\"used_dltensor\"); "
                        "a capsule can be imported once");
  if (!PyCapsule_IsValid(capsule.ptr(), kCapsuleName))
    raise_invalid_type("from_dlpack", "from_dlpack: the capsule is not a DLPack tensor (its name is not \"dltensor\")");
  return static_cast<DLManagedTensor *>(PyCapsule_GetPointer(capsule.ptr(), kCapsuleName));
}

/// What a kiln.ndarray over a DLPack tensor is made of.
struct ImportSpec {
  DataType dtype;
  std::vector<int64_t> shape;
  uint64_t address;  // data + byte_offset
};

/// Whether `t`'s strides (in elements; null means compact) are row-major and contiguous. The
/// stride of a dimension of size 1 is irrelevant, and an empty tensor addresses nothing.
/// A negative dimension, or one whose element count overflows, is left to the shape check
/// (wrap_external names it): true.
bool is_row_major(const DLTensor &t) {
  if (t.strides == nullptr) return true;
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] <= 0) return true;
  int64_t expected = 1;
  for (int i = t.ndim; i-- > 0;) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    if (__builtin_mul_overflow(expected, t.shape[i], &expected)) return true;
  }
  return true;
}

/// The address of `t`'s first element (data + byte_offset), checked so that the tensor's bytes
/// do not wrap past the end of the address space. A tensor with a negative dimension, or whose
/// element count overflows, is left to the shape check (wrap_external names it).
/// Errors: InvalidUsageError.
uint64_t checked_address(const DLTensor &t, DataType dtype, const std::string &kiln_device) {
  const uint64_t data = reinterpret_cast<uint64_t>(t.data);
  uint64_t address = 0;
  if (__builtin_add_overflow(data, t.byte_offset, &address))
    raise_invalid_usage(kiln_device, "from_dlpack",
                        fmt::format("from_dlpack: the tensor's data pointer {:#x} plus its "
                                    "byte_offset {} is beyond the address space",
                                    data, t.byte_offset));
  uint64_t nbytes = itemsize(dtype);
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] < 0 || __builtin_mul_overflow(nbytes, static_cast<uint64_t>(t.shape[i]), &nbytes))
      return address;
  uint64_t end = 0;
  if (__builtin_add_overflow(address, nbytes, &end))
    raise_invalid_usage(kiln_device, "from_dlpack",
                        fmt::format("from_dlpack: the tensor's {} bytes at {:#x} run past the end "
                                    "of the address space",
                                    nbytes, address));
  return address;
}

/// `t` checked against what a kiln.ndarray on `here` can be: its device, one lane of a kiln
/// dtype, at most kMaxDimensions dimensions, row-major contiguous. Negative dimensions and a
/// misaligned address are refused by wrap_external. Errors: see the file comment.
ImportSpec check_tensor(const DLTensor &t, DLDevice here, const std::string &kiln_device) {
  check_device(pair_of(t.device), here, kiln_device);
  const std::optional<DataType> dtype = kiln_dtype_of(t.dtype);
  if (t.dtype.lanes != 1)
    raise_invalid_usage(kiln_device, "from_dlpack",
                        fmt::format("from_dlpack: the tensor's dtype {} has {} lanes; kiln arrays "
                                    "have one lane per element",
                                    describe_dtype(t.dtype), t.dtype.lanes));
  if (!dtype)
    raise_invalid_usage(kiln_device, "from_dlpack",
                        fmt::format("from_dlpack: kiln has no {} arrays; its dtypes are f32, f64, "
                                    "i32 and i64 (float32, float64, int32, int64)",
                                    describe_dtype(t.dtype)));
  if (t.ndim < 0 || static_cast<std::size_t>(t.ndim) > kMaxDimensions || (t.ndim > 0 && t.shape == nullptr))
    raise_invalid_usage(kiln_device, "from_dlpack",
                        fmt::format("from_dlpack: the tensor has {} dimensions; kiln arrays have "
                                    "0 to {}",
                                    t.ndim, kMaxDimensions));
  std::vector<int64_t> shape(t.shape, t.shape + t.ndim);
  if (!is_row_major(t))
    raise_invalid_usage(kiln_device, "from_dlpack",
                        fmt::format("from_dlpack: the tensor of shape {} has strides {} (in "
                                    "elements): not row-major contiguous, which kiln arrays "
                                    "always are; pass a contiguous copy (numpy.ascontiguousarray, "
                                    "tensor.contiguous())",
                                    shape, std::vector<int64_t>(t.strides, t.strides + t.ndim)));
  const uint64_t address = checked_address(t, *dtype, kiln_device);
  return ImportSpec{*dtype, std::move(shape), address};
}

/// Calls the deleter of an imported tensor (once: wrap_external's release).
void delete_imported(DLManagedTensor *managed) {
  if (managed->deleter == nullptr) return;
  with_gil([managed] { managed->deleter(managed); });
}

}  // namespace

/// kiln.from_dlpack(x): a kiln.ndarray over `x`'s memory on the current device.
py::object from_dlpack(py::handle x) {
  check_not_in_observer("from_dlpack");
  DeviceState &state = current_device();
  auto ex = executor_of(state);
  const std::string kiln_device = ex->device().name();
  const DLDevice here = dl_device_of(kiln_device);
  const py::object capsule = capsule_of(x, here, kiln_device);
  DLManagedTensor *managed = tensor_of(capsule, kiln_device);
  const ImportSpec spec = check_tensor(managed->dl_tensor, here, kiln_device);
  RhiExpected<Ndarray> wrapped =
      ex->wrap_external(spec.dtype, spec.shape, spec.address, [managed] { delete_imported(managed); });
  // The array owns the tensor now: the capsule must not call the deleter too.
  if (wrapped) PyCapsule_SetName(capsule.ptr(), kUsedCapsuleName);
  return wrap_array(check(std::move(wrapped)), state, *ex);
}

}  // namespace kiln::python::dlpack
