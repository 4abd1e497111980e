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
#include "ndarray.h"
#include "registration.h"
#include "signatures.h"

namespace kiln::python {
namespace {

constexpr const char *kCapsuleName = "dltensor";
constexpr const char *kUsedCapsuleName = "used_dltensor";

// ----------------------------------------------------------------------------------------------
// Devices and dtypes.

/// The DLPack device of a kiln device name: "cpu" and "mock" are host memory (kDLCPU, 0);
/// "cuda:N" is (kDLCUDA, N); "amdgpu:N" is (kDLROCM, N).
DLDevice dl_device_of(const std::string &device_name) {
  const std::size_t colon = device_name.find(':');
  const std::string backend = device_name.substr(0, colon);
  const int ordinal = colon == std::string::npos ? 0 : std::atoi(device_name.c_str() + colon + 1);
  if (backend == "cuda") return DLDevice{kDLCUDA, ordinal};
  if (backend == "amdgpu") return DLDevice{kDLROCM, ordinal};
  return DLDevice{kDLCPU, 0};
}

/// "cpu", "cuda:0", "rocm:1", "device type 4 (OpenCL):0": a DLPack device as messages name it.
std::string describe_device(DLDevice device) {
  switch (static_cast<int>(device.device_type)) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return fmt::format("cuda:{}", device.device_id);
    case kDLROCM: return fmt::format("rocm:{}", device.device_id);
    default: return fmt::format("DLPack device type {}:{}", static_cast<int>(device.device_type), device.device_id);
  }
}

DLDataType dl_dtype_of(DataType dtype) {
  switch (dtype) {
    case DataType::f32: return DLDataType{kDLFloat, 32, 1};
    case DataType::f64: return DLDataType{kDLFloat, 64, 1};
    case DataType::i32: return DLDataType{kDLInt, 32, 1};
    case DataType::i64: return DLDataType{kDLInt, 64, 1};
  }
  return DLDataType{kDLOpaqueHandle, 0, 1};
}

/// The kiln dtype of a one-lane DLPack dtype, or nullopt when kiln has none.
std::optional<DataType> kiln_dtype_of(DLDataType t) {
  for (DataType d : {DataType::f32, DataType::f64, DataType::i32, DataType::i64}) {
    const DLDataType dl = dl_dtype_of(d);
    if (dl.code == t.code && dl.bits == t.bits) return d;
  }
  return std::nullopt;
}

/// "float16", "uint8", "bool8", "complex64x4": a DLPack dtype as messages name it.
std::string describe_dtype(DLDataType t) {
  static constexpr const char *kCodes[] = {"int", "uint", "float", "opaque", "bfloat", "complex"};
  const std::string code = t.code < std::size(kCodes) ? kCodes[t.code] : fmt::format("code{}", t.code);
  return t.lanes == 1 ? fmt::format("{}{}", code, t.bits) : fmt::format("{}{}x{}", code, t.bits, t.lanes);
}

// ----------------------------------------------------------------------------------------------
// Calling into Python from a deleter.

/// Runs `fn` with the GIL held, whichever thread calls it, keeping any pending Python error.
/// Once the interpreter is gone or finalizing (and this thread does not hold the GIL), `fn` is
/// skipped: what it would release is leaked, never touched without a GIL. Never throws.
template <class Fn>
void with_gil(Fn &&fn) noexcept {
  if (!Py_IsInitialized()) return;
  if (!PyGILState_Check() && _Py_IsFinalizing()) return;
  const PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  fn();
  PyErr_Restore(type, value, traceback);
  PyGILState_Release(gil);
}

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

/// The destructor of a "dltensor" capsule (exported by kiln, or handed to from_dlpack): the
/// tensor's deleter runs only if no consumer took it (renamed "used_dltensor").
void delete_unconsumed_capsule(PyObject *capsule) {
  if (PyCapsule_IsValid(capsule, kUsedCapsuleName)) return;
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  auto *managed = static_cast<DLManagedTensor *>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed == nullptr) {
    PyErr_WriteUnraisable(capsule);
  } else if (managed->deleter != nullptr) {
    managed->deleter(managed);
  }
  PyErr_Restore(type, value, traceback);
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
/// does not copy across devices on export. Errors: InvalidTypeError; BufferError (the
/// specification's answer) for another device.
void check_requested_device(py::handle dl_device, DLDevice device) {
  if (dl_device.is_none()) return;
  if (!py::isinstance<py::tuple>(dl_device) || py::len(dl_device) != 2 ||
      !is_integer(dl_device[py::int_(0)]) || !is_integer(dl_device[py::int_(1)]))
    raise_invalid_type("__dlpack__",
                       fmt::format("__dlpack__: dl_device must be None or a (device_type, "
                                   "device_id) tuple of ints, got {}",
                                   std::string(py::repr(dl_device))));
  const int type = dl_device[py::int_(0)].cast<int>();
  const int id = dl_device[py::int_(1)].cast<int>();
  if (type != static_cast<int>(device.device_type) || id != device.device_id) {
    PyErr_SetString(PyExc_BufferError,
                    fmt::format("kiln.ndarray on {} cannot be exported to {}: kiln exports "
                                "only to the array's own device",
                                describe_device(device), describe_device(DLDevice{static_cast<DLDeviceType>(type), id}))
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
  const DLDevice device = dl_device_of(a.device);
  check_stream(stream, device, a.device);
  check_max_version(max_version);
  check_requested_device(dl_device, device);
  if (!copy.is_none() && to_flag(copy, "copy", "__dlpack__"))  // a new array, exported alone
    return export_dlpack(self.attr("__copy__")(), stream, max_version, dl_device, py::none());
  void *data = export_address(array, device);

  auto context = std::make_unique<ExportContext>();
  context->shape = a.shape;
  context->strides = array.strides();
  DLTensor &t = context->managed.dl_tensor;
  t.data = data;
  t.device = device;
  t.ndim = static_cast<int>(a.shape.size());
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
  const DLDevice device = dl_device_of(as_array(self, "__dlpack_device__", "self").device);
  return py::make_tuple(static_cast<int>(device.device_type), device.device_id);
}

// ----------------------------------------------------------------------------------------------
// Import.

/// Whether kiln has an executor kind for DLPack device type `type`.
bool kiln_has_device_type(int type) { return type == kDLCPU || type == kDLCUDA || type == kDLROCM; }

/// A tensor on `tensor` (a DLPack device) must be on the current executor's device `here`.
/// Errors: NotSupportedError (a device type kiln has no executor for), InvalidUsageError
/// (another kiln device: kiln.init(arch=...) first).
void check_device(DLDevice tensor, DLDevice here, const std::string &kiln_device) {
  if (!kiln_has_device_type(static_cast<int>(tensor.device_type)))
    raise_failure(make_failure(RhiResult::not_supported, kiln_device, "from_dlpack",
                               fmt::format("from_dlpack: the tensor is on {}; kiln has executors "
                                           "for cpu (and mock), cuda and amdgpu (rocm) memory only",
                                           describe_device(tensor))));
  if (tensor.device_type != here.device_type || tensor.device_id != here.device_id)
    raise_invalid_usage(kiln_device, "from_dlpack",
                        fmt::format("from_dlpack: the tensor is on {} but kiln's executor is {} "
                                    "({}); kiln.init(arch=...) for the tensor's device first, or "
                                    "copy it there",
                                    describe_device(tensor), kiln_device, describe_device(here)));
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
  py::object capsule;
  if (py::hasattr(x, "__dlpack_device__")) {
    const py::tuple device = x.attr("__dlpack_device__")();
    const DLDevice dl{static_cast<DLDeviceType>(device[0].cast<int>()), device[1].cast<int>()};
    check_device(dl, here, kiln_device);
    if (dl.device_type == kDLCUDA) capsule = x.attr("__dlpack__")(py::arg("stream") = 1);
    else if (dl.device_type == kDLROCM) capsule = x.attr("__dlpack__")(py::arg("stream") = 0);
  }
  if (!capsule) capsule = x.attr("__dlpack__")();
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
bool is_row_major(const DLTensor &t) {
  if (t.strides == nullptr) return true;
  for (int i = 0; i < t.ndim; ++i)
    if (t.shape[i] == 0) return true;
  int64_t expected = 1;
  for (int i = t.ndim; i-- > 0;) {
    if (t.shape[i] != 1 && t.strides[i] != expected) return false;
    expected *= t.shape[i];
  }
  return true;
}

/// `t` checked against what a kiln.ndarray on `here` can be: its device, one lane of a kiln
/// dtype, at most kMaxDimensions dimensions, row-major contiguous. Negative dimensions and a
/// misaligned address are refused by wrap_external. Errors: see the file comment.
ImportSpec check_tensor(const DLTensor &t, DLDevice here, const std::string &kiln_device) {
  check_device(t.device, here, kiln_device);
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
  const uint64_t address = reinterpret_cast<uint64_t>(t.data) + t.byte_offset;
  return ImportSpec{*dtype, std::move(shape), address};
}

/// Calls the deleter of an imported tensor (once: wrap_external's release).
void delete_imported(DLManagedTensor *managed) {
  if (managed->deleter == nullptr) return;
  with_gil([managed] { managed->deleter(managed); });
}

/// kiln.from_dlpack(x): a kiln.ndarray over `x`'s memory on the current executor.
PyArray from_dlpack(py::handle x) {
  check_not_in_observer("from_dlpack");
  auto ex = executor();
  const std::string kiln_device = ex->device().name();
  const DLDevice here = dl_device_of(kiln_device);
  const py::object capsule = capsule_of(x, here, kiln_device);
  DLManagedTensor *managed = tensor_of(capsule, kiln_device);
  const ImportSpec spec = check_tensor(managed->dl_tensor, here, kiln_device);
  RhiExpected<Ndarray> wrapped =
      ex->wrap_external(spec.dtype, spec.shape, spec.address, [managed] { delete_imported(managed); });
  // The array owns the tensor now: the capsule must not call the deleter too.
  if (wrapped) PyCapsule_SetName(capsule.ptr(), kUsedCapsuleName);
  return PyArray(check(std::move(wrapped)), ex);
}

constexpr const char *kDlpackDoc = R"(DLPack export (zero-copy): a "dltensor" capsule over this array's memory.

stream: None (cpu, mock), or for CUDA/ROCm arrays None or any int; kiln's launches have
finished when they return, so the memory is ready on every stream and nothing is synchronized. max_version: accepted; the
capsule is the unversioned DLPack 0.6 one. dl_device: None or this array's own device (another
is BufferError). copy: None/False share the memory, True exports a new copy. The capsule keeps
the array alive and counts as an export: free() refuses until the consumer lets go.)";

constexpr const char *kFromDlpackDoc = R"(A kiln.ndarray over the memory of x, no copy.

x: any object with __dlpack__ (numpy arrays, torch and cupy tensors, kiln arrays) or a DLPack
"dltensor" capsule, on the current executor's device (cpu and mock: host memory; cuda:N; amdgpu:N),
float32/float64/int32/int64 with one lane, row-major contiguous, aligned to the element size.
The memory is not charged to kiln's budget; the tensor's deleter runs once, when the array is
freed or gone. Errors (all before the capsule is consumed): InvalidTypeError (no __dlpack__),
InvalidUsageError (another dtype, lanes, strides, alignment or kiln device; a consumed capsule),
NotSupportedError (a device type kiln has no executor for).)";

}  // namespace

void register_dlpack(py::module_ &m) {
  auto cls = py::reinterpret_borrow<py::class_<PyArray>>(m.attr("ndarray"));
  cls.def("__dlpack__", &export_dlpack, kDlpackDoc, py::kw_only(), py::arg("stream") = py::none(),
          py::arg("max_version") = py::none(), py::arg("dl_device") = py::none(),
          py::arg("copy") = py::none(), guarded());
  cls.def("__dlpack_device__", &dlpack_device,
          "(device_type, device_id): (1, 0) kDLCPU for cpu and mock, (2, N) kDLCUDA for cuda:N, "
          "(10, N) kDLROCM for amdgpu:N.",
          guarded());
  typed_method_mismatch(cls, "__dlpack__", "(*, stream=None, max_version=None, dl_device=None, copy=None)");
  typed_method_mismatch(cls, "__dlpack_device__", "()");
  def_typed(m, "from_dlpack", "(x)", &from_dlpack, kFromDlpackDoc, py::arg("x"), guarded());
}

}  // namespace kiln::python
