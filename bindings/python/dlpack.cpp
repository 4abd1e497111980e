// DLPack, both ways, over Debian's <dlpack/dlpack.h> (DLPack 0.6: the unversioned "dltensor"
// capsule; the versioned v1 structs are not in that header, so max_version is accepted and an
// unversioned capsule returned, as the Python specification allows).
//
//   ndarray.__dlpack__(*, stream, max_version, dl_device, copy)  export, zero-copy
//   ndarray.__dlpack_device__()                                   (device_type, device_id)
//   kiln.from_dlpack(x)                                           import, zero-copy
//
// Lifetimes. An exported capsule holds a strong reference to the kiln.ndarray and counts as one
// of its exports (as a buffer view does): free() refuses while a capsule or the array its
// consumer made from it lives, and the memory (with its executor's device) stays alive until the
// consumer calls the deleter. An imported tensor becomes a kiln.ndarray over the producer's
// memory (LlvmRuntimeExecutor::wrap_external, not charged to kiln's budget); the capsule is
// renamed "used_dltensor" only once the array owns it, and the tensor's deleter runs exactly
// once, when that array is freed or garbage-collected. A capsule never consumed calls its
// deleter when it dies. Every check (device, dtype, lanes, strides, alignment) runs before the
// capsule is consumed: a refused tensor is left to its producer and nothing leaks.
//
// Threading: called with the GIL held. A deleter may be called by a consumer on any thread; it
// takes the GIL (and does nothing to Python objects once the interpreter is finalizing on
// another thread: the reference is leaked rather than touched without a GIL).
// Errors (error_mapping.h): InvalidTypeError (an object without __dlpack__, wrong argument
// types), InvalidUsageError (a dtype, lanes, strides, alignment or device kiln cannot take; a
// consumed capsule; a freed array), NotSupportedError (a device type kiln has no executor for),
// BufferError where the DLPack specification asks for it (dl_device another device).
#include <dlpack/dlpack.h>
#include <pybind11/pybind11.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "conversions.h"
#include "error_mapping.h"
#include "dlpack_common.h"
#include "ndarray.h"
#include "ndarray_type.h"
#include "registration.h"
#include "signatures.h"
#include "kiln_stub_docstrings.h"

namespace kiln::python {
namespace {

using namespace dlpack;

// ----------------------------------------------------------------------------------------------
// Export.

/// What an exported capsule owns: the tensor description and a strong reference to the array.
struct ExportContext {
  DLManagedTensor managed{};
  std::vector<int64_t> shape, strides;  // in elements
  PyObject *owner = nullptr;            // the kiln.ndarray (a strong reference)
  PyArray *array = nullptr;             // its PyArray, valid while `owner` is held
};

/// The deleter of an exported tensor: ends the export and drops the reference to the array.
void delete_export(DLManagedTensor *managed) {
  auto *context = static_cast<ExportContext *>(managed->manager_ctx);
  with_gil([context] {
    --context->array->exports;
    Py_DECREF(context->owner);
  });
  delete context;
}

/// `stream` checked for `device`: None for host memory (the DLPack specification's only value
/// there); None or any int for CUDA and ROCm. kiln's launches have finished when they return
/// (they wait for the device), so its memory is ready on every stream: nothing is synchronized,
/// and an int the specification reserves (0 on CUDA, 1 and 2 on ROCm) is accepted rather than
/// failing a consumer that passes it. Errors: InvalidTypeError, InvalidUsageError.
void check_stream(py::handle stream, DLDevice device, const std::string &kiln_device) {
  if (stream.is_none()) return;
  if (!is_integer(stream))
    raise_invalid_type("__dlpack__", fmt::format("__dlpack__: stream must be None or an int, got {} {}",
                                                 type_name(stream), std::string(py::repr(stream))));
  if (device.device_type == kDLCPU)
    raise_invalid_usage(kiln_device, "__dlpack__",
                        fmt::format("__dlpack__: stream must be None for an array in host memory "
                                    "({}), got {}",
                                    kiln_device, std::string(py::repr(stream))));
}

/// `dl_device` (None or a (device_type, device_id) pair) must be the array's own device: kiln
/// does not copy across devices on export. Errors: InvalidTypeError (not a tuple of two ints),
/// InvalidUsageError (an int beyond int32); BufferError (the specification's answer) for another
/// device.
void check_requested_device(py::handle dl_device, DLDevice device) {
  if (dl_device.is_none()) return;
  const DevicePair requested = to_dl_device(dl_device, "dl_device", "__dlpack__");
  const int type = requested.type;
  const int id = requested.id;
  if (type != static_cast<int>(device.device_type) || id != device.device_id) {
    PyErr_SetString(PyExc_BufferError,
                    fmt::format("kiln.ndarray on {} cannot be exported to {}: kiln exports "
                                "only to the array's own device",
                                describe_device(device), describe_device(requested))
                        .c_str());
    throw py::error_already_set();
  }
}

/// `max_version`: None or a (major, minor) tuple of ints. Errors: InvalidTypeError.
void check_max_version(py::handle max_version) {
  if (max_version.is_none()) return;
  if (!py::isinstance<py::tuple>(max_version) || py::len(max_version) != 2 ||
      !is_integer(max_version[py::int_(0)]) || !is_integer(max_version[py::int_(1)]))
    raise_invalid_type("__dlpack__", fmt::format("__dlpack__: max_version must be None or a "
                                                 "(major, minor) tuple of ints, got {}",
                                                 std::string(py::repr(max_version))));
}

/// The data pointer of `array` for a tensor on `device`: its device address, or for an empty
/// array on the host a static, aligned byte (consumers may refuse a null pointer).
void *export_address(const Ndarray &array, DLDevice device) {
  alignas(64) static char empty_buffer[64];
  const uint64_t address = check(array.device_address("__dlpack__"));
  if (address == 0 && device.device_type == kDLCPU) return empty_buffer;
  return reinterpret_cast<void *>(address);
}

/// A new "dltensor" capsule over `self`'s memory (no copy). Errors: see the file comment.
py::object export_dlpack(py::handle self, py::handle stream, py::handle max_version,
                         py::handle dl_device, py::handle copy) {
  PyArray &a = as_array(self, "__dlpack__", "self");
  const Ndarray &array = a.get("__dlpack__");
  const DLDevice device = dl_device_of(a.device_name());
  check_stream(stream, device, a.device_name());
  check_max_version(max_version);
  check_requested_device(dl_device, device);
  if (!copy.is_none() && to_flag(copy, "copy", "__dlpack__"))  // a new array, exported alone
    return export_dlpack(self.attr("__copy__")(), stream, max_version, dl_device, py::none());
  void *data = export_address(array, device);

  auto context = std::make_unique<ExportContext>();
  context->shape = a.shape();
  context->strides = array.strides();
  DLTensor &t = context->managed.dl_tensor;
  t.data = data;
  t.device = device;
  t.ndim = static_cast<int>(a.shape().size());
  t.dtype = dl_dtype_of(a.dtype);
  t.shape = context->shape.data();
  t.strides = context->strides.data();
  t.byte_offset = 0;
  context->managed.manager_ctx = context.get();
  context->managed.deleter = &delete_export;
  PyObject *capsule = PyCapsule_New(&context->managed, kCapsuleName, &delete_unconsumed_capsule);
  if (capsule == nullptr) throw py::error_already_set();  // context is freed; nothing was held
  context->owner = py::handle(self).inc_ref().ptr();
  context->array = &a;
  ++a.exports;
  context.release();  // owned by the capsule (its deleter) from here on
  return py::reinterpret_steal<py::object>(capsule);
}

py::tuple dlpack_device(py::handle self) {
  const DLDevice device = dl_device_of(as_array(self, "__dlpack_device__", "self").device_name());
  return py::make_tuple(static_cast<int>(device.device_type), device.device_id);
}

}  // namespace

void register_dlpack(py::module_ &m) {
  const py::object cls = m.attr("ndarray");
  def_method(cls, "__dlpack__", &export_dlpack, doc("ndarray.__dlpack__"), py::kw_only(),
          py::arg("stream") = py::none(),
          py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
          py::arg("copy") = py::none(), guarded());
  def_method(cls, "__dlpack_device__", &dlpack_device, doc("ndarray.__dlpack_device__"), guarded());
  typed_method_mismatch(cls, "__dlpack__", "(*, stream=None, max_version=None, dl_device=None, copy=None)");
  typed_method_mismatch(cls, "__dlpack_device__", "()");
  def_typed(m, "from_dlpack", "(x)", &from_dlpack, doc("from_dlpack"), py::arg("x"), guarded());
}

}  // namespace kiln::python