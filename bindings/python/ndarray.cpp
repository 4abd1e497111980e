// kiln.ndarray (see ndarray.h): PyArray, busy marks and their fork hook, as_array and the operand
// checks, the class's registration, free, copies, and from/to numpy.
//
// Threading: the GIL is held except inside launch() (GIL released, arrays marked busy) and in
// BusyScope's destructor (the busy list has its own mutex). Errors: usage mistakes are raised by
// error_mapping.h's raise_* functions, executor failures by check(); every operation checks its
// arguments before it allocates or copies anything.
#include "ndarray.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <span>
#include <thread>

#include "conversions.h"
#include "error_mapping.h"
#include "fast_entry.h"
#include "ndarray_type.h"
#include "host_input.h"
#include "kiln/rhi/fork_hooks.h"
#include "registration.h"
#include "signatures.h"
#include "kiln_stub_docstrings.h"

namespace kiln::python {
namespace {

/// Every busy mark with the thread that set it. A forked child keeps only the forking thread's
/// marks: the arrays the parent's other threads were using can be freed there (those threads do
/// not exist in the child), while the forking thread's own launches still hold theirs.
struct BusyPin {
  PyArray *array;
  std::thread::id thread;
};
std::vector<BusyPin> g_busy_pins;  // guarded by g_busy_pins_mutex (a thread unwinding at exit
                                   // may drop its marks without the GIL)
ForkSafeMutex g_busy_pins_mutex(ForkSafeMutex::Policy::hold_across_fork);

ForkRegistration g_busy_fork_registration(ForkHooks{nullptr, nullptr, [] {
  const std::thread::id me = std::this_thread::get_id();
  std::erase_if(g_busy_pins, [me](const BusyPin &pin) {
    if (pin.thread == me) return false;
    --pin.array->busy;
    return true;
  });
}});

}  // namespace

PyArray *array_or_null(py::handle value) { return is_ndarray(value) ? &array_in(value) : nullptr; }

py::object make_ndarray(py::handle dtype, py::handle shape, py::handle device, PyTypeObject *type) {
  check_not_in_observer("ndarray");
  const DataType dt = to_dtype(dtype);
  const ShapeArg dims = to_shape(shape);
  DeviceState &state = device_argument(device, "ndarray");
  // A reference of its own: an OOM observer of the allocation may let another thread configure
  // the device meanwhile (the old executor then lives until this call returns).
  const std::shared_ptr<LlvmRuntimeExecutor> ex = executor_of(state);
  return wrap_array(check(ex->ndarray(dt, dims.dims())), state, *ex, type);
}

std::shared_ptr<LlvmRuntimeExecutor> executor_for(const char *site, std::initializer_list<NamedOperand> operands) {
  return executor_for(site, std::span<const NamedOperand>(operands.begin(), operands.size()));
}

std::shared_ptr<LlvmRuntimeExecutor> executor_for(const char *site, std::span<const NamedOperand> operands) {
  DeviceState *first = operands.front().array->state;
  for (const NamedOperand &o : operands)
    if (o.array->state != first) raise_mixed_devices(site, operands);
  for (const NamedOperand &o : operands) (void)executor_of_array(*o.array, site);  // none stale
  return executor_of(*first);
}

void raise_mixed_devices(const char *site, std::span<const NamedOperand> operands) {
  std::string arrays;
  for (const NamedOperand &o : operands)
    arrays += fmt::format("{}{} {} on {}", arrays.empty() ? "" : ", ", o.name, o.array->description(),
                          o.array->device_name());
  raise_invalid_usage(operands.front().array->device_name(), site,
                      fmt::format("{}: its arrays are on different devices: {}; arrays never move on "
                                  "their own: copy one with a.to(device)",
                                  site, arrays));
}

namespace {

void free_array(py::handle self) {
  PyArray &a = as_array(self, "free", "self");
  if (a.busy > 0)
    raise_invalid_usage(a.device_name(), "free",
                        fmt::format("ndarray {} is in use by an operation running now", a.description()));
  if (a.exports > 0)
    raise_invalid_usage(a.device_name(), "free",
                        fmt::format("ndarray {} still has {} export(s) (memoryview, "
                                    "np.asarray, a DLPack capsule or the array a consumer made "
                                    "from it); delete them first",
                                    a.description(), a.exports));
  if (a.pointer_shared)
    raise_invalid_usage(a.device_name(), "free",
                        fmt::format("ndarray {} handed its pointer out through "
                                    "__cuda_array_interface__, which has no release: drop the "
                                    "consumers (cupy/torch/numba arrays) and the array, and "
                                    "garbage collection frees it",
                                    a.description()));
  const Ndarray &array = a.get("free");
  if (LlvmRuntimeExecutor *owner = executor_of_generation(a.executor_generation)) {
    // `owner` may be gone once free returns: an imported array's release (the producer's
    // DLPack deleter) may run Python that calls kiln.init; free runs it last (executor.h).
    check(owner->free(a.array));
    a.live.release();
    return;
  }
  // Its executor was replaced by kiln.init: dropping the only handle frees it on its device.
  if (array.is_freed()) check(array.allocation("free"));  // the C++ use-after-free error
  a.dropped_shape = array.shape();
  a.array = Ndarray();
  a.dropped = true;
  a.live.release();
}

py::object from_numpy(py::handle value, py::handle device) {
  check_not_in_observer("from_numpy");
  auto [input, dtype] = host_input(value, "from_numpy");
  const std::vector<int64_t> shape(input.shape(), input.shape() + input.ndim());
  DeviceState &state = device_argument(device, "from_numpy");
  auto ex = executor_of(state);
  // The device array first: a refusal comes before a host copy of a non-contiguous input (a
  // broadcast view of terabytes is refused by the budget, not by the host's memory).
  py::object out = wrap_array(check(ex->ndarray(dtype, shape)), state, *ex);
  const py::array arr = contiguous_host_array(input, "from_numpy");
  const auto *data = static_cast<const std::byte *>(arr.data());
  const std::span<const std::byte> bytes(data, static_cast<std::size_t>(arr.nbytes()));
  check(launch({}, [&] { return ex->write(array_in(out).array, bytes); }));
  return out;
}

/// A new uninitialized numpy array for the host copy of `a`. Errors: HostOutOfMemoryError.
py::array host_copy_for(const PyArray &a, const Ndarray &array) {
  try {
    return py::array(numpy_dtype(array.dtype()), std::vector<py::ssize_t>(array.shape().begin(), array.shape().end()));
  } catch (py::error_already_set &e) {
    if (!e.matches(PyExc_MemoryError)) throw;
    raise_host_oom(a.device_name(), "to_numpy", array.nbytes(),
                   fmt::format("the host copy of ndarray {}", a.description()));
  }
}

py::array to_numpy(py::handle self) {
  PyArray &a = as_array(self, "to_numpy", "self");
  const Ndarray &array = a.get("to_numpy");
  auto ex = executor_of_array(a, "to_numpy");
  check(ex->check_usable("to_numpy", array));  // before the host copy is allocated
  py::array out = host_copy_for(a, array);
  auto *data = static_cast<std::byte *>(out.mutable_data());
  const std::span<std::byte> bytes(data, static_cast<std::size_t>(array.nbytes()));
  check(launch({&a}, [&] { return ex->read(array, bytes); }));
  return out;
}

/// copy.copy / copy.deepcopy of a kiln.ndarray: a new array of the same dtype and shape on its
/// device, filled by the copy kernel. Errors: those of ndarray() and copy().
py::object copy_array(py::handle self) {
  const Operand src = first_operand(self, "copy", "self");
  auto ex = executor_of_array(src.py, "copy");
  check(ex->check_usable("copy", src.array));  // before the new array is allocated
  py::object out = wrap_array(check(ex->ndarray(src.array.dtype(), src.array.shape())), *src.py.state, *ex);
  check(launch({&src.py}, [&] { return ex->copy(array_in(out).array, src.array); }));
  return out;
}

/// a.to(device): the array on `device` (a kiln.Device or a name): `self` when it is there
/// already, else a copy through host memory charged to the target's budget. The target array is
/// allocated first: when the target refuses, nothing was copied and `self` is untouched.
/// Errors: InvalidTypeError, InvalidUsageError (device, a freed array), the target's
/// OutOfMemoryError, HostOutOfMemoryError for the host staging, DeviceLostError.
py::object to_device(py::handle self, py::handle device) {
  check_not_in_observer("to");
  PyArray &a = as_array(self, "to", "self");
  const Ndarray &array = a.get("to");
  DeviceState &target = device_argument(device, "to");
  auto source = executor_of_array(a, "to");
  if (&target == a.state) return py::reinterpret_borrow<py::object>(self);
  check(source->check_usable("to", array));
  auto ex = executor_of(target);
  py::object out = wrap_array(check(ex->ndarray(array.dtype(), array.shape())), target, *ex);
  py::array host = host_copy_for(a, array);
  const std::span<std::byte> bytes(static_cast<std::byte *>(host.mutable_data()),
                                   static_cast<std::size_t>(array.nbytes()));
  check(launch({&a}, [&] { return source->read(array, bytes); }));
  check(launch({}, [&] { return ex->write(array_in(out).array, bytes); }));
  return out;
}

std::string ndarray_repr(py::handle s) {
  const PyArray *a = array_or_null(s);
  if (a == nullptr) return "kiln.ndarray(?)";
  return fmt::format("kiln.ndarray({}, device='{}'{})", a->description(), a->device_name(),
                     a->is_freed() ? ", freed" : "");
}

/// The read-only attributes of kiln.ndarray.
void def_properties(py::handle cls) {
  const auto arr = [](py::handle self) -> PyArray & { return as_array(self, "ndarray", "self"); };
  def_property(cls, "shape", [arr](py::handle s) { return py::tuple(py::cast(arr(s).shape())); }, doc("ndarray.shape"));
  def_property(cls, "dtype", [arr](py::handle s) { return arr(s).dtype; }, doc("ndarray.dtype"));
  def_property(cls, "nbytes", [arr](py::handle s) { return arr(s).nbytes; }, doc("ndarray.nbytes"));
  def_property(cls, "size", [arr](py::handle s) { return arr(s).size; }, doc("ndarray.size"));
  def_property(cls, "ndim", [arr](py::handle s) { return arr(s).shape().size(); }, doc("ndarray.ndim"));
  def_property(cls, "device", [arr](py::handle s) { return device_object(*arr(s).state); }, doc("ndarray.device"));
  def_property(cls, "is_freed", [arr](py::handle s) { return arr(s).is_freed(); }, doc("ndarray.is_freed"));
  // numpy tries the buffer protocol first but swallows its errors (a freed array would become
  // a 0-d object array); this raises them instead, and shares the same counted view.
  def_property(cls, "__array_interface__", [arr](py::handle self) {
    const PyArray &a = arr(self);
    py::dict d;
    d["shape"] = py::tuple(py::cast(a.shape()));
    d["typestr"] = numpy_dtype(a.dtype).attr("str");
    d["data"] = py::memoryview(py::reinterpret_borrow<py::object>(self));
    d["version"] = 3;
    return d;
  }, doc("ndarray.__array_interface__"));
}

/// a.__bool__(): as numpy, the truth of a one-element array is its element's (read from the
/// device); any other size is ambiguous (InvalidUsageError, a ValueError, as numpy's ValueError).
bool array_truth(py::handle s) {
  const PyArray &a = as_array(s, "ndarray", "self");
  if (a.size != 1)
    raise_invalid_usage(a.device_name(), "ndarray.__bool__",
                        fmt::format("the truth value of an array of {} elements is ambiguous; "
                                    "use a.to_numpy().any() or .all()",
                                    a.size));
  return to_numpy(s).attr("item")().cast<py::object>().attr("__bool__")().cast<bool>();
}

/// The methods of kiln.ndarray.
void def_methods(py::handle cls) {
  def_method(cls, "free", &free_array, doc("ndarray.free"), guarded());
  def_method(cls, "to_numpy", &to_numpy, doc("ndarray.to_numpy"), guarded());
  def_method(cls, "to", &to_device, doc("ndarray.to"), py::arg("device"), guarded());
  // copy.copy / copy.deepcopy: a new array on the array's device with the same contents
  // (numpy's meaning); pickle: rebuilt by kiln.from_numpy from the host copy.
  def_method(cls, "__copy__", [](py::handle self) { return copy_array(self); }, doc("ndarray.__copy__"), guarded());
  def_method(cls, "__deepcopy__", [](py::handle self, py::handle /*memo*/) { return copy_array(self); },
             doc("ndarray.__deepcopy__"), py::arg("memo"), guarded());
  def_method(cls, "__reduce__", [](py::handle self) {
    py::object rebuild = py::module_::import("kiln").attr("_ndarray_from_host");
    return py::make_tuple(rebuild, py::make_tuple(to_numpy(self)));
  }, doc("ndarray.__reduce__"));
  def_method(cls, "__bool__", &array_truth, doc("ndarray.__bool__"));
  def_method(cls, "__len__", [](py::handle s) {
    const PyArray &a = as_array(s, "ndarray", "self");
    if (a.shape().empty()) raise_invalid_type("len", "len() of a 0-d kiln.ndarray");
    return a.shape()[0];
  }, doc("ndarray.__len__"));
  def_method(cls, "__repr__", &ndarray_repr, doc("ndarray.__repr__"));
}

}  // namespace

PyArray::PyArray(Ndarray a, DeviceState &device_state, const LlvmRuntimeExecutor &made_by)
    : array(std::move(a)),
      state(&device_state),
      executor_generation(device_state.executor.get() == &made_by ? device_state.generation : 0),
      dtype(array.dtype()),
      nbytes(array.nbytes()),
      size(array.num_elements()),
      live(nbytes) {}

namespace {
std::atomic<uint64_t> g_live_array_bytes{0};
}  // namespace

LiveArrayBytes::LiveArrayBytes(uint64_t bytes) : bytes_(bytes) {
  if (bytes != 0) add_with_gil(g_live_array_bytes, bytes);
}

LiveArrayBytes::LiveArrayBytes(LiveArrayBytes &&other) noexcept : bytes_(other.bytes_) {
  other.bytes_ = 0;
}

LiveArrayBytes &LiveArrayBytes::operator=(LiveArrayBytes &&other) noexcept {
  if (this != &other) {
    release();
    bytes_ = other.bytes_;
    other.bytes_ = 0;
  }
  return *this;
}

void LiveArrayBytes::release() {
  if (bytes_ == 0) return;  // freed, moved from or empty: no locked instruction
  add_with_gil(g_live_array_bytes, uint64_t{0} - bytes_);
  bytes_ = 0;
}

uint64_t LiveArrayBytes::total() { return g_live_array_bytes.load(std::memory_order_relaxed); }

void PyArray::view_layout() {
  const std::vector<int64_t> &dims = shape();
  if (view_shape.size() == dims.size() && view_strides.size() == dims.size()) return;
  const int64_t item = static_cast<int64_t>(itemsize(dtype));
  view_shape.assign(dims.begin(), dims.end());
  view_strides.clear();
  for (const int64_t stride : array.strides()) view_strides.push_back(static_cast<Py_ssize_t>(stride * item));
}

const Ndarray &PyArray::get(const char *site) const {
  if (dropped) raise_invalid_usage(device_name(), site, fmt::format("ndarray {} used after it was freed", description()));
  return array;
}

BusyScope::BusyScope(std::span<PyArray *const> arrays) : count_(arrays.size()) {
  static_assert(kMaxArrays >= 3, "matmul marks three operands");
  if (count_ > kMaxArrays) throw std::logic_error("BusyScope: more operands than kMaxArrays");
  std::copy(arrays.begin(), arrays.end(), arrays_.begin());
  std::lock_guard lock(g_busy_pins_mutex);
  for (PyArray *a : std::span(arrays_.data(), count_)) {
    ++a->busy;
    g_busy_pins.push_back(BusyPin{a, std::this_thread::get_id()});
  }
}

BusyScope::~BusyScope() {
  std::lock_guard lock(g_busy_pins_mutex);
  const std::thread::id me = std::this_thread::get_id();
  for (PyArray *a : std::span(arrays_.data(), count_)) {
    --a->busy;
    for (auto it = g_busy_pins.rbegin(); it != g_busy_pins.rend(); ++it)
      if (it->array == a && it->thread == me) {
        g_busy_pins.erase(std::next(it).base());
        break;
      }
  }
}

PyArray &as_array(py::handle value, const char *site, const char *name) {
  if (PyArray *array = array_or_null(value)) return *array;
  raise_invalid_type(site, fmt::format("{}: {} must be a kiln.ndarray, got {}{}", site, name, type_name(value),
                                       py::isinstance<py::array>(value) ? " (make one with kiln.from_numpy)" : ""));
}

Operand first_operand(py::handle value, const char *site, const char *name) {
  check_not_in_observer(site);
  PyArray &py = as_array(value, site, name);
  return Operand{py, py.get(site)};
}

std::pair<Operand, Operand> first_operands(py::handle a, py::handle b, const char *site,
                                           const char *name_a, const char *name_b) {
  check_not_in_observer(site);
  PyArray &py_a = as_array(a, site, name_a);
  PyArray &py_b = as_array(b, site, name_b);
  const Ndarray &array_a = py_a.get(site);
  return {Operand{py_a, array_a}, Operand{py_b, py_b.get(site)}};
}

void register_ndarray(py::module_ &m) {
  // The class documents its construction (made by __new__; object's __init__ does nothing).
  static const std::string docstring = std::string(doc("ndarray")) + "\n\n" + doc("ndarray.__new__");
  const py::object cls = make_ndarray_type(docstring.c_str());
  m.attr("ndarray") = cls;
  def_properties(cls);
  def_methods(cls);
  def_typed(m, "from_numpy", "(a, *, device=None)", &from_numpy, doc("from_numpy"), py::arg("a"), py::kw_only(),
            py::arg("device") = py::none(), guarded());
  typed_method_mismatch(cls, "free", "()");
  typed_method_mismatch(cls, "to_numpy", "()");
  typed_method_mismatch(cls, "to", "(device)");
  for (const char *dunder : {"__copy__", "__reduce__", "__bool__", "__len__", "__repr__"})
    typed_method_mismatch(cls, dunder, "()");
  typed_method_mismatch(cls, "__deepcopy__", "(memo)");
  FastFunction<&free_array, 1>::install(cls, "free");
}

void seal_ndarray(py::module_ &m) { finish_ndarray_type(m.attr("ndarray")); }

}  // namespace kiln::python
