// kiln._kiln: the Python binding of the executor (pybind11).
//
// The ONLY place a named error becomes a Python exception: raise_failure() below classifies the
// Failure with kiln::classify and raises the class of that ErrorKind, defined in kiln/_errors.py.
// Messages are never parsed. The C++ API is expected-based: every result is checked here.
//
// Threading: module state (the global executor) is touched only with the GIL held. Launches run
// with the GIL released; the arrays they use are marked busy meanwhile, so another thread cannot
// free them under the kernel (it gets InvalidUsageError). OOM observers re-acquire the GIL.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <array>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kiln/executor/errors.h"
#include "kiln/executor/executor.h"

namespace py = pybind11;

namespace kiln::python {
namespace {

// Py_IsFinalizing is public from Python 3.13; older versions only have the private name.
bool python_is_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// ----------------------------------------------------------------------------------------------
// Errors: Failure -> Python exception.

constexpr std::array kAllErrorKinds = {
    ErrorKind::device_out_of_memory, ErrorKind::budget_exceeded, ErrorKind::device_heap_exhausted,
    ErrorKind::host_out_of_memory,   ErrorKind::invalid_usage,   ErrorKind::not_supported,
    ErrorKind::device_lost,          ErrorKind::runtime_error};

// The class of each ErrorKind, looked up once by error_name() in kiln._errors. Strong references
// kept for the life of the process (never released: no Py_DECREF after the interpreter is gone).
PyObject *g_error_classes[kAllErrorKinds.size()] = {};

void load_error_classes() {
  py::module_ errors = py::module_::import("kiln._errors");
  for (ErrorKind kind : kAllErrorKinds) {
    py::object cls = errors.attr(std::string(error_name(kind)).c_str());
    g_error_classes[static_cast<std::size_t>(kind)] = cls.release().ptr();
  }
}

py::dict category_bytes(const CategoryBytes &bytes) {
  py::dict out;
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    out[py::str(std::string(to_string(static_cast<MemoryCategory>(i))))] = bytes[i];
  return out;
}

/// The knobs a Python user sets: the advice of every exception names these.
constexpr InterfaceKnobs kPythonKnobs{"kiln.init(budget_bytes=...)", "kiln.init(reserve_bytes=...)",
                                      "kiln.init(device_heap_bytes=...)"};

/// The exception object for `failure` (not raised): its class is the one of classify(failure),
/// its message advises with kPythonKnobs.
py::object make_exception(const Failure &unadvised) {
  Failure failure = unadvised;
  advise(failure, kPythonKnobs);
  py::handle cls = g_error_classes[static_cast<std::size_t>(classify(failure))];
  py::dict fields;
  fields["requested_bytes"] = failure.requested_bytes;
  fields["class_bytes"] = failure.class_bytes;
  fields["budget_check"] = std::string(to_string(failure.budget_check));
  fields["advice"] = failure.advice;
  fields["device"] = failure.device;
  fields["category"] = std::string(to_string(failure.category));
  fields["site"] = std::string(failure.site);
  fields["driver_status"] = std::string(failure.driver_status);
  fields["result"] = std::string(to_string(failure.result));
  fields["oom_source"] = std::string(to_string(failure.oom_source));
  fields["detail"] = failure.detail;
  fields["context"] = py::tuple(py::cast(failure.context));
  if (failure.has_memory) {
    fields["free_bytes"] = failure.memory.free_bytes;
    fields["total_bytes"] = failure.memory.total_bytes;
    fields["limit_bytes"] = failure.memory.limit_bytes;
    fields["reserve_bytes"] = failure.memory.reserve_bytes;
    fields["live_age_ms"] = failure.memory.live_age_ms;
    fields["in_use_bytes"] = category_bytes(failure.memory.in_use_bytes);
  }
  return cls(failure.message(), **fields);
}

/// Raises the named error of `failure` (a C++ throw that pybind11 turns into the Python raise).
[[noreturn]] void raise_failure(const Failure &failure) {
  py::object exc = make_exception(failure);
  PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(exc.ptr())), exc.ptr());
  throw py::error_already_set();
}

[[noreturn]] void raise_invalid_usage(const std::string &device, const char *site, std::string detail) {
  raise_failure(invalid_usage(device, site, std::move(detail)));
}

void check(const RhiStatus &status) {
  if (!status) raise_failure(status.error());
}
template <class T>
T check(RhiExpected<T> expected) {
  if (!expected) raise_failure(expected.error());
  return std::move(expected).value();
}

/// A host allocation (numpy) failed: HostOutOfMemoryError instead of numpy's MemoryError.
[[noreturn]] void raise_host_oom(const std::string &device, const char *site, uint64_t size_bytes,
                                 std::string detail) {
  Failure f = make_failure(RhiResult::out_of_memory, device, site, std::move(detail));
  f.oom_source = OomSource::host;
  f.category = MemoryCategory::ndarray;
  f.requested_bytes = size_bytes;
  f.driver_status = "MemoryError";
  raise_failure(f);
}

// ----------------------------------------------------------------------------------------------
// The global executor.

std::shared_ptr<LlvmRuntimeExecutor> g_executor;  // guarded by the GIL
std::vector<uint64_t> g_observer_ids;              // observers added from Python to g_executor

/// Replaces the global executor. The old one's Python observers are removed first: its device
/// may live on (arrays keep it), and an observer that refers to such an array would otherwise
/// make a cycle through C++ that the garbage collector cannot see.
void replace_executor(std::shared_ptr<LlvmRuntimeExecutor> fresh) {
  if (g_executor)
    for (uint64_t id : g_observer_ids) (void)g_executor->memory().remove_oom_observer(id);
  g_observer_ids.clear();
  g_executor = std::move(fresh);
}
thread_local int t_in_observer = 0;                // > 0 while an OOM observer runs on this thread

/// Refuses what an OOM observer must not do: allocate or launch on the device whose allocation
/// is failing (DeviceMemory's contract; a launch would also re-enter the launcher's lock).
void check_not_in_observer(const char *site) {
  if (t_in_observer > 0)
    raise_invalid_usage("kiln", site,
                        fmt::format("kiln.{} cannot run inside an OOM observer (the failing "
                                    "allocation is still in progress); observers may free arrays "
                                    "or call kiln.empty_cache()",
                                    site));
}

std::shared_ptr<LlvmRuntimeExecutor> executor();

uint64_t to_bytes(py::handle value, const char *name) {
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr()))
    raise_invalid_usage("kiln", "init",
                        fmt::format("{} must be a non-negative int, got {}", name,
                                    std::string(py::repr(value))));
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0 || v < 0)
    raise_invalid_usage("kiln", "init",
                        fmt::format("{} must be between 0 and 2**63-1, got {}", name,
                                    std::string(py::str(i))));
  return static_cast<uint64_t>(v);
}

std::optional<uint64_t> to_optional_bytes(const py::object &value, const char *name) {
  if (value.is_none()) return std::nullopt;
  return to_bytes(value, name);
}

void init(const std::string &arch, const py::object &budget_bytes, const py::object &reserve_bytes,
          bool live_check, bool caching, const py::object &device_heap_bytes,
          const py::object &mock_capacity_bytes, const py::object &mock_other_process_bytes,
          const py::object &num_threads, const py::object &fault_at,
          const py::object &fail_sizes_at_least) {
  check_not_in_observer("init");
  ExecutorConfig config;
  config.backend = check(parse_backend(arch));
  config.budget.limit_bytes = to_optional_bytes(budget_bytes, "budget_bytes");
  config.budget.reserve_bytes = to_optional_bytes(reserve_bytes, "reserve_bytes");
  config.budget.live_check = live_check;
  config.budget.caching = caching;
  if (auto heap = to_optional_bytes(device_heap_bytes, "device_heap_bytes")) config.device_heap_bytes = *heap;
  if (auto cap = to_optional_bytes(mock_capacity_bytes, "mock_capacity_bytes")) config.mock.capacity_bytes = *cap;
  if (!mock_other_process_bytes.is_none()) {
    if (PyIndex_Check(mock_other_process_bytes.ptr())) {
      config.mock.other_process_bytes_script = {to_bytes(mock_other_process_bytes, "mock_other_process_bytes")};
    } else {
      for (py::handle item : py::iter(mock_other_process_bytes))
        config.mock.other_process_bytes_script.push_back(to_bytes(item, "mock_other_process_bytes"));
    }
  }
  if (auto threads = to_optional_bytes(num_threads, "num_threads"))
    config.num_threads = static_cast<unsigned>(std::min<uint64_t>(*threads, 1024));
  const std::optional<uint64_t> fault = to_optional_bytes(fault_at, "fault_at");
  const std::optional<uint64_t> fail_size = to_optional_bytes(fail_sizes_at_least, "fail_sizes_at_least");

  RhiExpected<std::unique_ptr<LlvmRuntimeExecutor>> created;
  {
    py::gil_scoped_release nogil;  // the first executor JIT-compiles the kernels
    created = LlvmRuntimeExecutor::create(std::move(config));
  }
  std::shared_ptr<LlvmRuntimeExecutor> fresh = check(std::move(created));
  // Faults count from after the executor's own set-up, as kiln-ops --fault-at does.
  if (fault && *fault != 0) fresh->memory().fault_plan().fail_nth_allocation(*fault);
  if (fail_size) fresh->memory().fault_plan().fail_sizes_at_least(*fail_size);
  replace_executor(std::move(fresh));  // the old one goes; its arrays keep its device alive
}

std::shared_ptr<LlvmRuntimeExecutor> executor() {
  if (!g_executor) {
    py::object none = py::none();
    init("cpu", none, none, true, true, none, none, none, none, none, none);
  }
  return g_executor;
}

// ----------------------------------------------------------------------------------------------
// Arrays.

std::string format_char(DataType dtype) {
  switch (dtype) {
    case DataType::f32: return "f";
    case DataType::f64: return "d";
    case DataType::i32: return "i";
    case DataType::i64: return "q";
  }
  return "B";
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

/// A kiln.ndarray: one Ndarray handle (the only one), the executor that made it (weakly: arrays
/// never keep an executor alive, only its device), and the state of views and running launches.
struct PyArray {
  Ndarray array;
  std::weak_ptr<LlvmRuntimeExecutor> owner;
  std::string device;
  std::string description;  // "f32[2, 3]"
  DataType dtype;
  std::vector<int64_t> shape;
  uint64_t nbytes = 0;
  uint64_t size = 0;
  int busy = 0;          // launches using it with the GIL released
  int exports = 0;       // live buffer views (memoryview, np.asarray)
  bool dropped = false;  // freed after its executor was replaced (handle released)
  std::vector<Py_ssize_t> view_shape, view_strides;  // in bytes, for the buffer protocol

  PyArray(Ndarray a, const std::shared_ptr<LlvmRuntimeExecutor> &ex)
      : array(std::move(a)),
        owner(ex),
        device(ex->device().name()),
        description(array.describe()),
        dtype(array.dtype()),
        shape(array.shape()),
        nbytes(array.nbytes()),
        size(array.num_elements()) {
    const int64_t item = static_cast<int64_t>(itemsize(dtype));
    for (std::size_t i = 0; i < shape.size(); ++i) {
      view_shape.push_back(static_cast<Py_ssize_t>(shape[i]));
      view_strides.push_back(static_cast<Py_ssize_t>(array.strides()[i] * item));
    }
  }

  [[nodiscard]] bool is_freed() const { return dropped || array.is_freed(); }
  /// The handle, or InvalidUsageError when it was dropped by free().
  const Ndarray &get(const char *site) const {
    if (dropped) raise_invalid_usage(device, site, fmt::format("ndarray {} used after it was freed", description));
    return array;
  }
};

/// Marks arrays busy while a launch runs without the GIL.
class BusyScope {
 public:
  explicit BusyScope(std::initializer_list<PyArray *> arrays) : arrays_(arrays) {
    for (PyArray *a : arrays_) ++a->busy;
  }
  ~BusyScope() {
    for (PyArray *a : arrays_) --a->busy;
  }
  BusyScope(const BusyScope &) = delete;
  BusyScope &operator=(const BusyScope &) = delete;

 private:
  std::vector<PyArray *> arrays_;
};

/// Runs `fn` (a call into the executor) with the GIL released and `arrays` marked busy.
template <class Fn>
auto launch(std::initializer_list<PyArray *> arrays, Fn &&fn) {
  BusyScope busy(arrays);
  py::gil_scoped_release nogil;
  return fn();
}

DataType to_dtype(py::handle value) {
  if (py::isinstance<DataType>(value)) return value.cast<DataType>();
  if (py::isinstance<py::str>(value)) return check(parse_dtype(value.cast<std::string>()));
  raise_invalid_usage("kiln", "ndarray",
                      fmt::format("dtype must be kiln.f32, f64, i32 or i64, got {}",
                                  std::string(py::repr(value))));
}

std::vector<int64_t> to_shape(py::handle value) {
  std::vector<int64_t> shape;
  auto dim = [&](py::handle d) {
    if (PyBool_Check(d.ptr()) || !PyIndex_Check(d.ptr()))
      raise_invalid_usage("kiln", "ndarray",
                          fmt::format("shape must be an int or a sequence of ints, got {}",
                                      std::string(py::repr(value))));
    py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(d.ptr()));
    if (!i) throw py::error_already_set();
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (overflow != 0)
      raise_invalid_usage("kiln", "ndarray",
                          fmt::format("dimension {} of shape {} does not fit in 64 bits",
                                      std::string(py::str(i)), std::string(py::repr(value))));
    shape.push_back(v);
  };
  if (PyIndex_Check(value.ptr())) {
    dim(value);
  } else if (py::isinstance<py::sequence>(value) && !py::isinstance<py::str>(value)) {
    for (py::handle d : py::reinterpret_borrow<py::sequence>(value)) dim(d);
  } else {
    raise_invalid_usage("kiln", "ndarray",
                        fmt::format("shape must be an int or a sequence of ints, got {}",
                                    std::string(py::repr(value))));
  }
  return shape;
}

PyArray make_ndarray(py::handle dtype, py::handle shape) {
  check_not_in_observer("ndarray");
  const DataType dt = to_dtype(dtype);
  const std::vector<int64_t> dims = to_shape(shape);
  auto ex = executor();
  return PyArray(check(ex->ndarray(dt, dims)), ex);
}

void free_array(PyArray &a) {
  if (a.busy > 0)
    raise_invalid_usage(a.device, "free",
                        fmt::format("ndarray {} is in use by an operation running now", a.description));
  if (a.exports > 0)
    raise_invalid_usage(a.device, "free",
                        fmt::format("ndarray {} still has {} buffer view(s) (memoryview, "
                                    "np.asarray); delete them first",
                                    a.description, a.exports));
  const Ndarray &array = a.get("free");
  if (auto owner = a.owner.lock()) {
    check(owner->free(a.array));
    return;
  }
  // Its executor was replaced by kiln.init: dropping the only handle frees it on its device.
  if (array.is_freed()) check(array.allocation("free"));  // the C++ use-after-free error
  a.array = Ndarray();
  a.dropped = true;
}

/// A contiguous, native-order numpy array of a kiln dtype made from `value` (copied only when
/// needed). Errors: InvalidUsageError for other dtypes, HostOutOfMemoryError when a copy fails.
std::pair<py::array, DataType> to_host_array(py::handle value, const char *site) {
  py::module_ np = py::module_::import("numpy");
  py::array arr;
  if (py::isinstance<py::array>(value)) {
    arr = py::reinterpret_borrow<py::array>(value);
  } else {
    try {
      arr = np.attr("asarray")(value);
    } catch (py::error_already_set &e) {
      raise_invalid_usage("kiln", site,
                          fmt::format("{} needs a numpy array (f32, f64, i32 or i64), got {}: {}",
                                      site, std::string(py::str(py::type::of(value).attr("__name__"))),
                                      e.what()));
    }
  }
  const py::dtype dt = arr.dtype();
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  std::optional<DataType> kiln_dtype;
  if (kind == 'f' && size == 4) kiln_dtype = DataType::f32;
  if (kind == 'f' && size == 8) kiln_dtype = DataType::f64;
  if (kind == 'i' && size == 4) kiln_dtype = DataType::i32;
  if (kind == 'i' && size == 8) kiln_dtype = DataType::i64;
  if (!kiln_dtype)
    raise_invalid_usage("kiln", site,
                        fmt::format("numpy dtype {} is not supported; kiln has f32, f64, i32, i64 "
                                    "(convert first, e.g. a.astype(numpy.float32))",
                                    std::string(py::str(static_cast<const py::handle &>(dt)))));
  const uint64_t nbytes = static_cast<uint64_t>(arr.nbytes());
  try {
    // Native byte order and C order, copying only when the input is not already so.
    if (!py::bool_(dt.attr("isnative")))
      arr = arr.attr("astype")(dt.attr("newbyteorder")("="));
    if (!(arr.flags() & py::array::c_style)) arr = np.attr("ascontiguousarray")(arr);
  } catch (py::error_already_set &e) {
    if (!e.matches(PyExc_MemoryError)) throw;
    raise_host_oom("host", site, nbytes, "copying the input to a contiguous host array");
  }
  return {arr, *kiln_dtype};
}

PyArray from_numpy(py::handle value) {
  check_not_in_observer("from_numpy");
  auto [arr, dtype] = to_host_array(value, "from_numpy");
  std::vector<int64_t> shape(arr.shape(), arr.shape() + arr.ndim());
  auto ex = executor();
  PyArray out(check(ex->ndarray(dtype, shape)), ex);
  const auto *data = static_cast<const std::byte *>(arr.data());
  const std::span<const std::byte> bytes(data, static_cast<std::size_t>(arr.nbytes()));
  check(launch({}, [&] { return ex->write(out.array, bytes); }));
  return out;
}

py::array to_numpy(PyArray &a) {
  const Ndarray &array = a.get("to_numpy");
  auto ex = executor();
  py::array out;
  try {
    out = py::array(numpy_dtype(array.dtype()), std::vector<py::ssize_t>(array.shape().begin(), array.shape().end()));
  } catch (py::error_already_set &e) {
    if (!e.matches(PyExc_MemoryError)) throw;
    raise_host_oom(a.device, "to_numpy", array.nbytes(),
                   fmt::format("the host copy of ndarray {}", a.description));
  }
  auto *data = static_cast<std::byte *>(out.mutable_data());
  const std::span<std::byte> bytes(data, static_cast<std::size_t>(array.nbytes()));
  check(launch({&a}, [&] { return ex->read(array, bytes); }));
  return out;
}

// The buffer protocol: a zero-copy, writable view of device memory on host-addressable devices.
// pybind11 installs its own getbuffer; ours replaces it to count the views, so free() can refuse
// while one exists (a view holds a reference, so the array itself cannot go first).
int ndarray_getbuffer(PyObject *self, Py_buffer *view, int flags) {
  view->obj = nullptr;
  try {
    PyArray &a = py::cast<PyArray &>(py::handle(self));
    const Ndarray &array = a.get("buffer");
    const std::optional<DeviceAllocation> alloc = check(array.allocation("buffer"));
    static char empty_buffer[1];
    void *data = empty_buffer;
    if (alloc) {
      auto *device = dynamic_cast<LlvmDevice *>(alloc->device);
      if (device == nullptr || !device->host_addressable())
        raise_failure(make_failure(RhiResult::not_supported, a.device, "buffer",
                                   fmt::format("device {} is not host-addressable: no zero-copy "
                                               "view of ndarray {}; use to_numpy()",
                                               a.device, a.description)));
      data = reinterpret_cast<void *>(check(array.device_address("buffer")));
    }
    static const std::string formats[] = {format_char(DataType::f32), format_char(DataType::f64),
                                          format_char(DataType::i32), format_char(DataType::i64)};
    view->buf = data;
    view->len = static_cast<Py_ssize_t>(array.nbytes());
    view->readonly = 0;
    view->itemsize = static_cast<Py_ssize_t>(itemsize(array.dtype()));
    view->format = (flags & PyBUF_FORMAT) == PyBUF_FORMAT
                       ? const_cast<char *>(formats[static_cast<int>(array.dtype())].c_str())
                       : nullptr;
    view->ndim = static_cast<int>(a.view_shape.size());
    view->shape = (flags & PyBUF_ND) == PyBUF_ND ? a.view_shape.data() : nullptr;
    view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? a.view_strides.data() : nullptr;
    view->suboffsets = nullptr;
    view->internal = nullptr;
    view->obj = py::handle(self).inc_ref().ptr();
    ++a.exports;
    return 0;
  } catch (py::error_already_set &e) {
    e.restore();
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return -1;
}

void ndarray_releasebuffer(PyObject *self, Py_buffer * /*view*/) {
  try {
    --py::cast<PyArray &>(py::handle(self)).exports;
  } catch (...) {
    PyErr_Clear();
  }
}

// ----------------------------------------------------------------------------------------------
// Operations.

/// A scalar operand for an array of `dtype`: floats for floating dtypes, ints (within the
/// dtype's range) for integer ones. Errors: InvalidUsageError.
Scalar to_scalar(py::handle value, DataType dtype, const char *site) {
  Scalar s;
  if (is_floating(dtype)) {
    if (!PyFloat_Check(value.ptr()) && !PyIndex_Check(value.ptr()) && !PyNumber_Check(value.ptr()))
      raise_invalid_usage("kiln", site, fmt::format("{}: {} needs a number, got {}", site,
                                                    to_string(dtype), std::string(py::repr(value))));
    s.f64 = PyFloat_AsDouble(value.ptr());
    if (s.f64 == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      raise_invalid_usage("kiln", site, fmt::format("{}: {} needs a real number, got {}", site,
                                                    to_string(dtype), std::string(py::repr(value))));
    }
    return s;
  }
  if (PyBool_Check(value.ptr()) || !PyIndex_Check(value.ptr()))
    raise_invalid_usage("kiln", site, fmt::format("{}: {} needs an int, got {}", site,
                                                  to_string(dtype), std::string(py::repr(value))));
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  const bool fits = overflow == 0 && (dtype == DataType::i64 || (v >= INT32_MIN && v <= INT32_MAX));
  if (!fits)
    raise_invalid_usage("kiln", site, fmt::format("{}: {} does not fit in {}", site,
                                                  std::string(py::str(i)), to_string(dtype)));
  s.i64 = v;
  s.f64 = static_cast<double>(v);
  return s;
}

void fill(PyArray &out, py::handle value) {
  check_not_in_observer("fill");
  const Ndarray &o = out.get("fill");
  const Scalar s = to_scalar(value, o.dtype(), "fill");
  auto ex = executor();
  check(launch({&out}, [&] { return ex->fill(o, s); }));
}

void copy(PyArray &dst, PyArray &src) {
  check_not_in_observer("copy");
  const Ndarray &d = dst.get("copy");
  const Ndarray &s = src.get("copy");
  auto ex = executor();
  check(launch({&dst, &src}, [&] { return ex->copy(d, s); }));
}

void axpy(py::handle alpha, py::handle x, PyArray &y) {
  check_not_in_observer("axpy");
  const Ndarray &yy = y.get("axpy");
  const Scalar a = to_scalar(alpha, yy.dtype(), "axpy");
  auto ex = executor();
  if (py::isinstance<PyArray>(x)) {
    PyArray &xa = x.cast<PyArray &>();
    const Ndarray &xx = xa.get("axpy");
    check(launch({&xa, &y}, [&] { return ex->axpy(a, xx, yy); }));
    return;
  }
  // x in host memory: staged on the device for the launch.
  auto [host, dtype] = to_host_array(x, "axpy");
  const std::vector<int64_t> shape(host.shape(), host.shape() + host.ndim());
  if (dtype != yy.dtype() || shape != yy.shape())
    raise_invalid_usage(y.device, "axpy",
                        fmt::format("axpy needs x of y's dtype and shape: x is {}, y is {}",
                                    describe_array(dtype, shape), y.description));
  const std::span<const std::byte> bytes(static_cast<const std::byte *>(host.data()),
                                         static_cast<std::size_t>(host.nbytes()));
  check(launch({&y}, [&] { return ex->axpy_from_host(a, bytes, yy); }));
}

py::object reduce_sum(PyArray &x) {
  check_not_in_observer("reduce_sum");
  const Ndarray &xx = x.get("reduce_sum");
  auto ex = executor();
  const Scalar sum = check(launch({&x}, [&] { return ex->reduce_sum(xx); }));
  if (is_floating(xx.dtype())) return py::float_(sum.f64);
  return py::int_(sum.i64);
}

py::object matmul(PyArray &a, PyArray &b, py::object out_obj) {
  check_not_in_observer("matmul");
  const Ndarray &aa = a.get("matmul");
  const Ndarray &bb = b.get("matmul");
  auto ex = executor();
  if (out_obj.is_none()) {
    if (aa.shape().size() != 2 || bb.shape().size() != 2)
      raise_invalid_usage(a.device, "matmul",
                          fmt::format("matmul {} @ {}: operands must be 2-D", a.description, b.description));
    const int64_t shape[2] = {aa.shape()[0], bb.shape()[1]};
    out_obj = py::cast(PyArray(check(ex->ndarray(aa.dtype(), shape)), ex));
  }
  if (!py::isinstance<PyArray>(out_obj))
    raise_invalid_usage(a.device, "matmul",
                        fmt::format("matmul: out must be a kiln.ndarray, got {}",
                                    py::str(py::type::of(out_obj)).cast<std::string>()));
  PyArray &c = out_obj.cast<PyArray &>();
  const Ndarray &cc = c.get("matmul");  // aliasing is refused by the executor (InvalidUsage)
  check(launch({&a, &b, &c}, [&] { return ex->matmul(cc, aa, bb); }));
  return out_obj;
}

PyArray compact_positive(PyArray &x) {
  check_not_in_observer("compact_positive");
  const Ndarray &xx = x.get("compact_positive");
  auto ex = executor();
  Ndarray out = check(launch({&x}, [&] { return ex->compact_positive(xx); }));
  return PyArray(std::move(out), ex);
}

// ----------------------------------------------------------------------------------------------
// Memory.

py::dict memory_stats() {
  auto ex = executor();
  const runtime::MemoryStats s = ex->memory().stats();
  const auto cache = static_cast<std::size_t>(MemoryCategory::pool_cache);
  py::dict d;
  d["device"] = ex->device().name();
  d["current_bytes"] = category_bytes(s.ledger.current_bytes);
  d["peak_bytes"] = category_bytes(s.ledger.peak_bytes);
  d["current_total_bytes"] = s.ledger.current_total_bytes();
  d["allocated_bytes"] = s.ledger.current_total_bytes() - s.ledger.current_bytes[cache];
  d["peak_total_bytes"] = s.ledger.peak_total_bytes;
  d["limit_bytes"] = s.ledger.limit_bytes;
  d["reserve_bytes"] = s.reserve_bytes;
  d["cached_bytes"] = s.cached_bytes;
  d["cached_blocks"] = s.cached_blocks;
  d["allocations"] = s.allocations;
  d["frees"] = s.frees;
  d["cache_hits"] = s.cache_hits;
  d["lock_free_hits"] = s.lock_free_hits;
  d["evictions"] = s.evictions;
  d["budget_refusals"] = s.ledger.refusals;
  d["live_checks"] = s.live_checks;
  d["live_refusals"] = s.live_refusals;
  d["driver_ooms"] = s.driver_ooms;
  d["retries"] = s.retries;
  return d;
}

/// Holds an observer's Python callable; copies of the std::function share it without touching
/// Python refcounts (DeviceMemory copies observers without the GIL).
struct PyCallback {
  PyObject *fn;
  explicit PyCallback(py::function f) : fn(f.release().ptr()) {}
  ~PyCallback() {
    if (!Py_IsInitialized() || python_is_finalizing()) return;  // leak at exit rather than crash
    py::gil_scoped_acquire gil;
    Py_DECREF(fn);
  }
  PyCallback(const PyCallback &) = delete;
  PyCallback &operator=(const PyCallback &) = delete;
};

struct ObserverScope {
  ObserverScope() { ++t_in_observer; }
  ~ObserverScope() { --t_in_observer; }
};

uint64_t add_oom_observer(py::function fn) {
  auto callback = std::make_shared<PyCallback>(std::move(fn));
  auto ex = executor();
  const uint64_t id = ex->memory().add_oom_observer([callback](const Failure &failure) {
    if (!Py_IsInitialized() || python_is_finalizing()) return;
    py::gil_scoped_acquire gil;
    py::error_scope keep;  // whatever error was pending stays pending
    ObserverScope in_observer;
    try {
      py::handle(callback->fn)(make_exception(failure));
    } catch (py::error_already_set &e) {  // never into C++: reported like an error in __del__
      e.discard_as_unraisable(py::reinterpret_borrow<py::object>(callback->fn));
    } catch (const std::exception &e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      PyErr_WriteUnraisable(callback->fn);
    }
  });
  g_observer_ids.push_back(id);
  return id;
}

bool remove_oom_observer(uint64_t id) {
  std::erase(g_observer_ids, id);
  return executor()->memory().remove_oom_observer(id);
}

// ----------------------------------------------------------------------------------------------
// Testing hooks (kiln.testing).

void set_fault_at(py::handle at) {
  if (PyBool_Check(at.ptr()) || !PyLong_Check(at.ptr()) || py::cast<py::int_>(at) < py::int_(1))
    raise_invalid_usage("kiln", "fail_allocation",
                        fmt::format("fail_allocation(at={}): at must be an int >= 1",
                                    std::string(py::repr(at))));
  executor()->memory().fault_plan().fail_nth_allocation(to_bytes(at, "at"));
}
void clear_fault() { executor()->memory().fault_plan().fail_nth_allocation(FaultPlan::kNever); }
uint64_t fault_allocation_count() { return executor()->memory().fault_plan().allocation_count(); }

/// A synthetic failure made into its exception (for errors without a producer on cpu/mock).
py::object make_error(const std::string &result, const std::string &oom_source,
                      uint64_t requested_bytes, const std::string &device, const std::string &detail) {
  static const std::pair<const char *, RhiResult> kResults[] = {
      {"error", RhiResult::error},
      {"invalid_usage", RhiResult::invalid_usage},
      {"not_supported", RhiResult::not_supported},
      {"out_of_memory", RhiResult::out_of_memory},
      {"device_lost", RhiResult::device_lost}};
  static const std::pair<const char *, OomSource> kSources[] = {
      {"none", OomSource::none}, {"driver", OomSource::driver}, {"budget", OomSource::budget},
      {"device_heap", OomSource::device_heap}, {"host", OomSource::host}};
  std::optional<RhiResult> r;
  for (const auto &[name, value] : kResults)
    if (result == name) r = value;
  std::optional<OomSource> s;
  for (const auto &[name, value] : kSources)
    if (oom_source == name) s = value;
  if (!r || !s)
    raise_invalid_usage("kiln", "make_error",
                        fmt::format("unknown result '{}' or oom_source '{}'", result, oom_source));
  Failure f = make_failure(*r, device, "kiln.testing.make_error", detail);
  f.oom_source = *s;
  f.requested_bytes = requested_bytes;
  return make_exception(f);
}

}  // namespace
}  // namespace kiln::python

PYBIND11_MODULE(_kiln, m) {
  using namespace kiln;
  using namespace kiln::python;
  m.doc() = "kiln native module; use the package `kiln`.";
  load_error_classes();

  py::enum_<DataType> dtype_enum(m, "dtype", "Element type of a kiln.ndarray.");
  dtype_enum
      .value("f32", DataType::f32)
      .value("f64", DataType::f64)
      .value("i32", DataType::i32)
      .value("i64", DataType::i64)
      .export_values()
      .def_property_readonly("itemsize", [](DataType d) { return itemsize(d); })
      .def_property_readonly("numpy", [](DataType d) { return numpy_dtype(d); });
  // Replaces enum_'s own __str__ ("dtype.f32"): str(kiln.f32) == "f32".
  dtype_enum.attr("__str__") = py::cpp_function([](DataType d) { return std::string(to_string(d)); },
                                                py::is_method(dtype_enum));

  m.def("init", &init, py::arg("arch") = "cpu", py::kw_only(), py::arg("budget_bytes") = py::none(),
        py::arg("reserve_bytes") = py::none(), py::arg("live_check") = true,
        py::arg("caching") = true, py::arg("device_heap_bytes") = py::none(),
        py::arg("mock_capacity_bytes") = py::none(), py::arg("mock_other_process_bytes") = py::none(),
        py::arg("num_threads") = py::none(), py::arg("fault_at") = py::none(),
        py::arg("fail_sizes_at_least") = py::none());
  m.def("device", [] { return executor()->device().name(); });
  m.def("_shutdown", [] { replace_executor(nullptr); });

  py::class_<PyArray> cls(m, "ndarray", py::buffer_protocol());
  cls.def(py::init(&make_ndarray), py::arg("dtype"), py::arg("shape"))
      .def_property_readonly("shape", [](const PyArray &a) { return py::tuple(py::cast(a.shape)); })
      .def_property_readonly("dtype", [](const PyArray &a) { return a.dtype; })
      .def_property_readonly("nbytes", [](const PyArray &a) { return a.nbytes; })
      .def_property_readonly("size", [](const PyArray &a) { return a.size; })
      .def_property_readonly("ndim", [](const PyArray &a) { return a.shape.size(); })
      .def_property_readonly("device", [](const PyArray &a) { return a.device; })
      .def_property_readonly("is_freed", &PyArray::is_freed)
      // numpy tries the buffer protocol first but swallows its errors (a freed array would
      // become a 0-d object array); this raises them instead, and shares the same counted view.
      .def_property_readonly("__array_interface__", [](py::object self) {
        const PyArray &a = self.cast<const PyArray &>();
        py::dict d;
        d["shape"] = py::tuple(py::cast(a.shape));
        d["typestr"] = numpy_dtype(a.dtype).attr("str");
        d["data"] = py::memoryview(self);
        d["version"] = 3;
        return d;
      })
      .def("free", &free_array)
      .def("to_numpy", &to_numpy)
      .def("__len__", [](const PyArray &a) {
        if (a.shape.empty()) throw py::type_error("len() of a 0-d kiln.ndarray");
        return a.shape[0];
      })
      .def("__repr__", [](const PyArray &a) {
        return fmt::format("kiln.ndarray({}, device='{}'{})", a.description, a.device,
                           a.is_freed() ? ", freed" : "");
      });
  // Our buffer functions replace pybind11's (see ndarray_getbuffer).
  auto *type = reinterpret_cast<PyTypeObject *>(cls.ptr());
  type->tp_as_buffer->bf_getbuffer = &ndarray_getbuffer;
  type->tp_as_buffer->bf_releasebuffer = &ndarray_releasebuffer;

  m.def("from_numpy", &from_numpy, py::arg("a"));
  m.def("fill", &fill, py::arg("out"), py::arg("value"));
  m.def("copy", &copy, py::arg("dst"), py::arg("src"));
  m.def("axpy", &axpy, py::arg("alpha"), py::arg("x"), py::arg("y"));
  m.def("reduce_sum", &reduce_sum, py::arg("x"));
  m.def("matmul", &matmul, py::arg("a"), py::arg("b"), py::arg("out") = py::none());
  m.def("compact_positive", &compact_positive, py::arg("x"));

  m.def("memory_stats", &memory_stats);
  m.def("memory_summary", [] { return executor()->memory().summary(); });
  m.def("empty_cache", [] { return executor()->memory().release_cached(); });
  m.def("reset_peak_memory_stats", [] { executor()->memory().reset_peaks(); });
  m.def("add_oom_observer", &add_oom_observer, py::arg("callback"));
  m.def("remove_oom_observer", &remove_oom_observer, py::arg("observer_id"));

  m.def("_set_fault_at", &set_fault_at, py::arg("at"));
  m.def("_clear_fault", &clear_fault);
  m.def("_fault_allocation_count", &fault_allocation_count);
  m.def("_make_error", &make_error, py::arg("result"), py::arg("oom_source") = "none",
        py::arg("requested_bytes") = 0, py::arg("device") = "", py::arg("detail") = "");
}
