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

#include <cxxabi.h>

#include <array>
#include <atomic>
#include <future>
#include <system_error>
#include <chrono>
#include <cstring>
#include <thread>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kiln/executor/errors.h"
#include "kiln/executor/executor.h"
#include "kiln/runtime/host_memory_guard.h"
#include "kiln/rhi/fork_hooks.h"

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
// kiln.InvalidTypeError (an InvalidUsageError that is also a TypeError) and kiln._errors._recast,
// for invalid_usage failures whose cause is the type of an argument. Kept like the classes above.
PyObject *g_invalid_type_class = nullptr;
PyObject *g_recast = nullptr;

void load_error_classes() {
  py::module_ errors = py::module_::import("kiln._errors");
  for (ErrorKind kind : kAllErrorKinds) {
    py::object cls = errors.attr(std::string(error_name(kind)).c_str());
    g_error_classes[static_cast<std::size_t>(kind)] = cls.release().ptr();
  }
  g_invalid_type_class = py::object(errors.attr("InvalidTypeError")).release().ptr();
  g_recast = py::object(errors.attr("_recast")).release().ptr();
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

/// Sets the Python error of `failure` without throwing (for exception translators).
void set_python_error(const Failure &failure) {
  try {
    py::object exc = make_exception(failure);
    PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(exc.ptr())), exc.ptr());
  } catch (py::error_already_set &e) {
    e.restore();  // making the exception failed (no memory): that error is raised instead
  }
}

[[noreturn]] void raise_invalid_usage(const std::string &device, const char *site, std::string detail) {
  raise_failure(invalid_usage(device, site, std::move(detail)));
}

/// Raises kiln.InvalidTypeError (InvalidUsageError and TypeError): an argument of `site` has a
/// type it cannot use. `detail` names the argument, what it must be and what it got.
[[noreturn]] void raise_invalid_type(const char *site, std::string detail) {
  py::object exc = make_exception(invalid_usage("kiln", site, std::move(detail)));
  py::object typed = py::handle(g_recast)(py::handle(g_invalid_type_class), exc);
  PyErr_SetObject(g_invalid_type_class, typed.ptr());
  throw py::error_already_set();
}

/// "int", "numpy.ndarray": the type of `value` as a message names it.
std::string type_name(py::handle value) {
  py::handle type = py::type::handle_of(value);
  const std::string module = py::str(type.attr("__module__"));
  const std::string name = py::str(type.attr("__qualname__"));
  return module == "builtins" ? name : module + "." + name;
}

thread_local int t_in_observer = 0;                // > 0 while an OOM observer runs on this thread

// A KeyboardInterrupt or SystemExit an OOM observer raised on this thread (a new reference),
// raised when the call that ran the observer returns (check()), in place of its result.
thread_local PyObject *t_observer_interrupt = nullptr;

/// Raises what an observer stashed in t_observer_interrupt, if anything (the GIL is held).
void raise_observer_interrupt() {
  if (t_observer_interrupt == nullptr) return;
  PyObject *value = std::exchange(t_observer_interrupt, nullptr);
  PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(value)), value);
  Py_DECREF(value);
  throw py::error_already_set();
}

/// The result of an executor call, or its failure raised as the named Python error. An
/// interrupt raised by an OOM observer during the call comes first (the result is dropped:
/// RAII handles free what it held).
void check(const RhiStatus &status) {
  if (t_in_observer == 0) raise_observer_interrupt();
  if (!status) raise_failure(status.error());
}
template <class T>
T check(RhiExpected<T> expected) {
  if (t_in_observer == 0) raise_observer_interrupt();
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
// Running C++ without the GIL.

/// Runs `fn` with the GIL released and takes the GIL back. At interpreter exit a daemon thread
/// that takes the GIL back is ended by CPython (pthread_exit, a forced unwind); that unwind must
/// pass through here, never through a noexcept destructor (pybind11's gil_scoped_release), which
/// would end the whole process in std::terminate.
template <class Fn>
auto without_gil(Fn &&fn) -> decltype(fn()) {
  PyThreadState *state = PyEval_SaveThread();
  try {
    auto result = fn();
    PyEval_RestoreThread(state);  // may end this thread (interpreter exit): a forced unwind
    return result;
  } catch (abi::__forced_unwind &) {
    throw;  // the thread is ending: there is no GIL to take back
  } catch (...) {
    PyEval_RestoreThread(state);
    throw;
  }
}

// ----------------------------------------------------------------------------------------------
// Interpreter exit while other threads are inside kiln.
//
// CPython ends a daemon thread that takes the GIL back during finalization (pthread_exit, a
// forced unwind). Inside kiln that unwind would run C++ destructors that touch Python objects
// without the GIL, or a noexcept destructor (std::terminate). So kiln closes its door first: its
// exit hook (kiln._shutdown, run by atexit while the interpreter is still whole) makes every
// later call from another thread park for good (GIL released, never back into Python, gone
// with the process) and waits, GIL released, for the calls already inside to return.

constexpr auto kShutdownWait = std::chrono::seconds(10);  // a call inside kiln that never ends
std::atomic<int> g_calls_inside{0};  // outermost kiln calls in progress, every thread
std::atomic<bool> g_closing{false};
std::thread::id g_closing_thread;  // guarded by the GIL: the thread that ran kiln._shutdown
thread_local int t_call_depth = 0;

[[noreturn]] void park_forever() {
  (void)PyEval_SaveThread();  // releases the GIL; this thread never takes it back
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

/// pybind11 call guard of every kiln function: counts the calls inside kiln, parks the threads
/// that come in after kiln._shutdown (the exiting thread itself goes on).
struct CallGuard {
  CallGuard() {
    if (t_call_depth == 0 && t_observer_interrupt != nullptr)  // left by a call that threw
      Py_DECREF(std::exchange(t_observer_interrupt, nullptr));  // past check(): not this call's
    if (t_call_depth == 0 && g_closing.load(std::memory_order_acquire) &&
        std::this_thread::get_id() != g_closing_thread)
      park_forever();
    if (t_call_depth++ == 0) g_calls_inside.fetch_add(1, std::memory_order_acq_rel);
  }
  ~CallGuard() {
    if (--t_call_depth == 0) g_calls_inside.fetch_sub(1, std::memory_order_acq_rel);
  }
  CallGuard(const CallGuard &) = delete;
  CallGuard &operator=(const CallGuard &) = delete;
};
using guarded = py::call_guard<CallGuard>;

// A forked child has only the forking thread: the calls other threads had in progress are not.
ForkRegistration g_calls_fork_registration(ForkHooks{
    nullptr, nullptr, [] { g_calls_inside.store(t_call_depth > 0 ? 1 : 0, std::memory_order_relaxed); }});

/// Waits (GIL released) until no other thread is inside kiln, at most kShutdownWait.
void wait_for_calls_inside() {
  const int mine = t_call_depth > 0 ? 1 : 0;
  without_gil([mine] {
    const auto deadline = std::chrono::steady_clock::now() + kShutdownWait;
    while (g_calls_inside.load(std::memory_order_acquire) > mine &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return 0;
  });
}

// ----------------------------------------------------------------------------------------------
// The global executor.

std::shared_ptr<LlvmRuntimeExecutor> g_executor;  // guarded by the GIL
std::vector<uint64_t> g_observer_ids;              // observers added from Python to g_executor
/// The open kiln.testing.fail_allocation blocks, innermost last: the FaultPlan count at which
/// each one's `at`-th allocation fails. Guarded by the GIL; cleared when the executor is replaced.
struct FaultBlock {
  uint64_t start_count;  // the plan's count when the block began
  uint64_t fail_at;      // the count whose allocation fails
};
std::vector<FaultBlock> g_fault_blocks;


/// Replaces the global executor. The old one's Python observers are removed first: its device
/// may live on (arrays keep it), and an observer that refers to such an array would otherwise
/// make a cycle through C++ that the garbage collector cannot see.
void replace_executor(std::shared_ptr<LlvmRuntimeExecutor> fresh) {
  if (g_executor)
    for (uint64_t id : g_observer_ids) (void)g_executor->memory().remove_oom_observer(id);
  g_observer_ids.clear();
  g_fault_blocks.clear();  // they armed the old executor's plan
  g_executor = std::move(fresh);
}

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

/// operator.index(value), for a value is_integer() accepted. Errors: InvalidTypeError when the
/// value's own __index__ raises an ordinary error (which becomes the new one's __cause__); a
/// MemoryError, KeyboardInterrupt or SystemExit it raises goes on unchanged.
py::int_ index_of(py::handle value, const char *site) {
  py::int_ i = py::reinterpret_steal<py::int_>(PyNumber_Index(value.ptr()));
  if (i) return i;
  py::error_already_set cause;  // fetches and clears the error __index__ raised
  if (!cause.matches(PyExc_Exception) || cause.matches(PyExc_MemoryError)) throw cause;
  const std::string detail = fmt::format("{}: {}.__index__() raised {}", site, type_name(value),
                                         std::string(py::repr(cause.value())));
  try {
    raise_invalid_type(site, detail);
  } catch (py::error_already_set &typed) {
    PyException_SetCause(typed.value().ptr(), cause.value().inc_ref().ptr());
    throw;
  }
}

std::shared_ptr<LlvmRuntimeExecutor> executor();

/// Whether `value` is an integer kiln takes: anything with __index__ (int, numpy integers)
/// except bool and kiln.dtype (an enum with __index__).
bool is_integer(py::handle value) {
  if (py::isinstance<py::array>(value)) {  // numpy arrays have __index__, only 0-d integer ones work
    const auto arr = py::reinterpret_borrow<py::array>(value);
    return arr.ndim() == 0 && (arr.dtype().kind() == 'i' || arr.dtype().kind() == 'u');
  }
  if (py::isinstance(value, py::module_::import("numpy").attr("bool_"))) return false;
  return PyIndex_Check(value.ptr()) && !PyBool_Check(value.ptr()) && !py::isinstance<DataType>(value);
}

/// `value` as a uint64 in [0, 2**63-1] (an int, numpy integer or other __index__ object).
/// Errors: InvalidTypeError (not an integer, or a bool), InvalidUsageError (out of range).
uint64_t to_bytes(py::handle value, const char *name, const char *site = "init") {
  if (!is_integer(value))
    raise_invalid_type(site, fmt::format("{}: {} must be a non-negative int, got {} {}", site, name,
                                         type_name(value), std::string(py::repr(value))));
  py::int_ i = index_of(value, site);
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (overflow != 0 || v < 0)
    raise_invalid_usage("kiln", site,
                        fmt::format("{}: {} must be between 0 and 2**63-1, got {}", site, name,
                                    std::string(py::str(i))));
  return static_cast<uint64_t>(v);
}

std::optional<uint64_t> to_optional_bytes(const py::object &value, const char *name) {
  if (value.is_none()) return std::nullopt;
  return to_bytes(value, name);
}

/// A flag: True or False (or a numpy bool). None and ints are refused rather than read as
/// False. Errors: InvalidTypeError.
bool to_flag(py::handle value, const char *name, const char *site) {
  if (PyBool_Check(value.ptr())) return value.ptr() == Py_True;
  if (py::isinstance(value, py::module_::import("numpy").attr("bool_"))) return PyObject_IsTrue(value.ptr()) == 1;
  raise_invalid_type(site, fmt::format("{}: {} must be True or False, got {} {}", site, name,
                                       type_name(value), std::string(py::repr(value))));
}

void init(py::handle arch, const py::object &budget_bytes, const py::object &reserve_bytes,
          py::handle live_check, py::handle caching, const py::object &device_heap_bytes,
          const py::object &mock_capacity_bytes, const py::object &mock_other_process_bytes,
          const py::object &num_threads, const py::object &fault_at,
          const py::object &fail_sizes_at_least) {
  check_not_in_observer("init");
  if (!py::isinstance<py::str>(arch))
    raise_invalid_type("init", fmt::format("init: arch must be a str (\"cpu\", \"mock\", \"cuda\" "
                                           "or \"amdgpu\"), got {} {}",
                                           type_name(arch), std::string(py::repr(arch))));
  ExecutorConfig config;
  config.backend = check(parse_backend(arch.cast<std::string>()));
  config.budget.limit_bytes = to_optional_bytes(budget_bytes, "budget_bytes");
  config.budget.reserve_bytes = to_optional_bytes(reserve_bytes, "reserve_bytes");
  config.budget.live_check = to_flag(live_check, "live_check", "init");
  config.budget.caching = to_flag(caching, "caching", "init");
  if (auto heap = to_optional_bytes(device_heap_bytes, "device_heap_bytes")) config.device_heap_bytes = *heap;
  if (auto cap = to_optional_bytes(mock_capacity_bytes, "mock_capacity_bytes")) config.mock.capacity_bytes = *cap;
  if (!mock_other_process_bytes.is_none()) {
    if (is_integer(mock_other_process_bytes)) {
      config.mock.other_process_bytes_script = {to_bytes(mock_other_process_bytes, "mock_other_process_bytes")};
    } else {
      const bool int_vector = py::isinstance<py::array>(mock_other_process_bytes) &&
                              py::reinterpret_borrow<py::array>(mock_other_process_bytes).ndim() == 1;
      if (!int_vector && !py::isinstance<py::list>(mock_other_process_bytes) &&
          !py::isinstance<py::tuple>(mock_other_process_bytes))
        raise_invalid_type("init", fmt::format("init: mock_other_process_bytes must be an int or a "
                                               "list of ints, got {} {}",
                                               type_name(mock_other_process_bytes),
                                               std::string(py::repr(mock_other_process_bytes))));
      for (py::handle item : mock_other_process_bytes)
        config.mock.other_process_bytes_script.push_back(to_bytes(item, "mock_other_process_bytes"));
    }
  }
  if (auto threads = to_optional_bytes(num_threads, "num_threads"))
    config.num_threads = static_cast<unsigned>(std::min<uint64_t>(*threads, 1024));
  const std::optional<uint64_t> fault = to_optional_bytes(fault_at, "fault_at");
  const std::optional<uint64_t> fail_size = to_optional_bytes(fail_sizes_at_least, "fail_sizes_at_least");

  // A lost device recovers only once its driver context is released: the old executor goes
  // first (its arrays, if any still live, keep the context and the new one fails as lost).
  std::weak_ptr<DeviceContext> lost_context;
  if (g_executor && g_executor->device().is_lost()) {
    lost_context = g_executor->context();
    replace_executor(nullptr);
  }
  // The first executor JIT-compiles the kernels.
  RhiExpected<std::unique_ptr<LlvmRuntimeExecutor>> created =
      without_gil([&] { return LlvmRuntimeExecutor::create(std::move(config)); });
  if (!created && created.error().result == RhiResult::device_lost && !lost_context.expired())
    created.error().add_context(
        "arrays of the executor whose device was lost still hold its driver context: free or "
        "delete them, then call kiln.init again");  // recreate_executor's rule, for a shared_ptr
  std::shared_ptr<LlvmRuntimeExecutor> fresh = check(std::move(created));
  // Faults count from after the executor's own set-up, as kiln-ops --fault-at does.
  if (fault && *fault != 0) fresh->memory().fault_plan().fail_nth_allocation(*fault);
  if (fail_size) fresh->memory().fault_plan().fail_sizes_at_least(*fail_size);
  replace_executor(std::move(fresh));  // the old one goes; its arrays keep its device alive
}

std::shared_ptr<LlvmRuntimeExecutor> executor() {
  if (!g_executor) {
    py::object none = py::none();
    init(py::str("cpu"), none, none, py::bool_(true), py::bool_(true), none, none, none, none, none, none);
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

/// Marks arrays busy while a launch runs without the GIL.
class BusyScope {
 public:
  explicit BusyScope(std::initializer_list<PyArray *> arrays) : arrays_(arrays) {
    std::lock_guard lock(g_busy_pins_mutex);
    for (PyArray *a : arrays_) {
      ++a->busy;
      g_busy_pins.push_back(BusyPin{a, std::this_thread::get_id()});
    }
  }
  ~BusyScope() {
    std::lock_guard lock(g_busy_pins_mutex);
    const std::thread::id me = std::this_thread::get_id();
    for (PyArray *a : arrays_) {
      --a->busy;
      for (auto it = g_busy_pins.rbegin(); it != g_busy_pins.rend(); ++it)
        if (it->array == a && it->thread == me) {
          g_busy_pins.erase(std::next(it).base());
          break;
        }
    }
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
  return without_gil(std::forward<Fn>(fn));
}

/// `value` as a kiln.ndarray of `site`'s argument `name`. Errors: InvalidTypeError when it is
/// not one (a numpy array, a list, ...); InvalidUsageError for an instance made by
/// kiln.ndarray.__new__ without __init__ (its memory was never set: reading it would read
/// stray heap). Every binding reaches a PyArray through here.
PyArray &as_array(py::handle value, const char *site, const char *name) {
  if (!py::isinstance<PyArray>(value))
    raise_invalid_type(site, fmt::format("{}: {} must be a kiln.ndarray, got {}{}", site, name,
                                         type_name(value),
                                         py::isinstance<py::array>(value)
                                             ? " (make one with kiln.from_numpy)"
                                             : ""));
  auto *inst = reinterpret_cast<py::detail::instance *>(value.ptr());
  py::detail::value_and_holder v_h =
      inst->get_value_and_holder(py::detail::get_type_info(typeid(PyArray)));
  if (!v_h || !v_h.holder_constructed())
    raise_invalid_usage("kiln", site,
                        fmt::format("{}: {} is an uninitialized kiln.ndarray (made by "
                                    "kiln.ndarray.__new__ without __init__); make arrays with "
                                    "kiln.ndarray(dtype, shape) or kiln.from_numpy",
                                    site, name));
  return *v_h.value_ptr<PyArray>();
}

/// A dtype argument: kiln.f32/f64/i32/i64 or their names. Errors: InvalidTypeError for other
/// types (numpy dtypes included), InvalidUsageError for an unknown name or a kiln.dtype made
/// from an integer that names no dtype.
DataType to_dtype(py::handle value, const char *site = "ndarray") {
  if (py::isinstance<DataType>(value)) {
    const DataType d = value.cast<DataType>();
    if (!is_valid(d))
      raise_invalid_usage("kiln", site,
                          fmt::format("{}: kiln.dtype value {} is not a kiln dtype (f32, f64, "
                                      "i32, i64)",
                                      site, static_cast<int>(d)));
    return d;
  }
  if (py::isinstance<py::str>(value)) return check(parse_dtype(value.cast<std::string>()));
  raise_invalid_type(site, fmt::format("{}: dtype must be kiln.f32, f64, i32 or i64, got {} {}",
                                       site, type_name(value), std::string(py::repr(value))));
}

/// A shape argument: an int, or a list, tuple or 1-D integer numpy array of ints (numpy
/// integers too). Errors: InvalidTypeError for other types (bytes, str, floats, bools, nested
/// sequences), InvalidUsageError for a dimension beyond int64. Negative dimensions, more than
/// 32 dimensions and sizes beyond numpy's are refused by compute_shape_info (InvalidUsageError).
std::vector<int64_t> to_shape(py::handle value) {
  std::vector<int64_t> shape;
  const auto wrong_type = [&] {
    raise_invalid_type("ndarray", fmt::format("ndarray: shape must be an int or a sequence of ints, "
                                              "got {} {}",
                                              type_name(value), std::string(py::repr(value))));
  };
  auto dim = [&](py::handle d) {
    if (!is_integer(d)) wrong_type();
    py::int_ i = index_of(d, "ndarray");
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
    if (overflow != 0)
      raise_invalid_usage("kiln", "ndarray",
                          fmt::format("dimension {} of shape {} does not fit in 64 bits",
                                      std::string(py::str(i)), std::string(py::repr(value))));
    shape.push_back(v);
  };
  if (py::isinstance<py::array>(value)) {
    const auto arr = py::reinterpret_borrow<py::array>(value);
    if (arr.ndim() > 1 || (arr.size() != 0 && arr.dtype().kind() != 'i' && arr.dtype().kind() != 'u'))
      wrong_type();
    if (arr.ndim() == 0) {
      dim(value);
    } else {
      for (py::handle d : value) dim(d);
    }
  } else if (is_integer(value)) {
    dim(value);
  } else if (py::isinstance<py::list>(value) || py::isinstance<py::tuple>(value)) {
    for (py::handle d : value) dim(d);
  } else {
    wrong_type();  // bytes, str, None, floats, dicts, generators, ...
  }
  if (shape.size() > kMaxDimensions)  // before anything is allocated or formatted per dimension
    raise_invalid_usage("kiln", "ndarray",
                        fmt::format("ndarray: shape has {} dimensions; kiln arrays have at most {} "
                                    "(numpy's limit)",
                                    shape.size(), kMaxDimensions));
  return shape;
}

PyArray make_ndarray(py::handle dtype, py::handle shape) {
  check_not_in_observer("ndarray");
  const DataType dt = to_dtype(dtype);
  const std::vector<int64_t> dims = to_shape(shape);
  auto ex = executor();
  return PyArray(check(ex->ndarray(dt, dims)), ex);
}

void free_array(py::handle self) {
  PyArray &a = as_array(self, "free", "self");
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

/// `value` as a numpy array of a kiln dtype, not copied yet (np.asarray for array-likes that are
/// not numpy arrays), so that a call can be checked whole before any copy of a large input.
/// Errors: InvalidUsageError for numpy arrays of other dtypes (float16, bool, object,
/// structured, ...), InvalidTypeError for masked arrays (their mask would be ignored) and for
/// values that are not numbers (None, str, bytes, objects numpy cannot read as numbers).
std::pair<py::array, DataType> host_input(py::handle value, const char *site) {
  py::module_ np = py::module_::import("numpy");
  if (py::isinstance(value, np.attr("ma").attr("MaskedArray")))
    raise_invalid_type(site, fmt::format("{}: a numpy masked array's mask would be ignored; pass "
                                         "a.filled(value) or a.data",
                                         site));
  py::array arr;
  if (py::isinstance<py::array>(value)) {
    arr = py::reinterpret_borrow<py::array>(value);
  } else {
    try {
      arr = np.attr("asarray")(value);
    } catch (py::error_already_set &e) {
      if (e.matches(PyExc_MemoryError))
        raise_host_oom("host", site, 0, "converting the input to a numpy array");
      raise_invalid_usage("kiln", site,
                          fmt::format("{} needs a numpy array (f32, f64, i32 or i64), got {}: {}",
                                      site, type_name(value), e.what()));
    }
  }
  const py::dtype dt = arr.dtype();
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  // Something that is not numbers at all (None, a str, a dict): a wrong type, not a wrong dtype.
  if (!py::isinstance<py::array>(value) && std::string_view("OSUV").find(kind) != std::string_view::npos)
    raise_invalid_type(site, fmt::format("{} needs a numpy array or a sequence of numbers (f32, "
                                         "f64, i32 or i64), got {} {}",
                                         site, type_name(value), std::string(py::repr(value)).substr(0, 80)));
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
  return {arr, *kiln_dtype};
}

/// `arr` (from host_input) in native byte order and C order, copied only when it is not so
/// already. Errors: HostOutOfMemoryError when the copy cannot be had.
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

PyArray from_numpy(py::handle value) {
  check_not_in_observer("from_numpy");
  auto [input, dtype] = host_input(value, "from_numpy");
  const std::vector<int64_t> shape(input.shape(), input.shape() + input.ndim());
  auto ex = executor();
  // The device array first: a refusal comes before a host copy of a non-contiguous input (a
  // broadcast view of terabytes is refused by the budget, not by the host's memory).
  PyArray out(check(ex->ndarray(dtype, shape)), ex);
  const py::array arr = contiguous_host_array(input, "from_numpy");
  const auto *data = static_cast<const std::byte *>(arr.data());
  const std::span<const std::byte> bytes(data, static_cast<std::size_t>(arr.nbytes()));
  check(launch({}, [&] { return ex->write(out.array, bytes); }));
  return out;
}

py::array to_numpy(py::handle self) {
  PyArray &a = as_array(self, "to_numpy", "self");
  const Ndarray &array = a.get("to_numpy");
  auto ex = executor();
  check(ex->check_usable("to_numpy", array));  // before the host copy is allocated
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
    PyArray &a = as_array(self, "buffer", "self");
    const Ndarray &array = a.get("buffer");
    // Always C-contiguous: a Fortran-order request can only be met by 0-d and 1-D arrays.
    if ((flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS && a.view_shape.size() > 1) {
      PyErr_SetString(PyExc_BufferError, "kiln.ndarray is C-contiguous, not Fortran-contiguous");
      return -1;
    }
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
    // Without PyBUF_ND (PyBUF_SIMPLE: hashlib, file.write) the consumer gets plain contiguous
    // bytes, no shape and ndim 0, as numpy gives them.
    const bool nd = (flags & PyBUF_ND) == PyBUF_ND;
    view->ndim = nd ? static_cast<int>(a.view_shape.size()) : 0;
    view->shape = nd ? a.view_shape.data() : nullptr;
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
    --as_array(self, "buffer", "self").exports;
  } catch (...) {
    PyErr_Clear();
  }
}

// ----------------------------------------------------------------------------------------------
// Operations.

/// A scalar operand for an array of `dtype`: real numbers (int, float, numpy scalars, 0-d
/// arrays; nan and inf too) for floating dtypes, integers (within the dtype's range) for integer
/// ones. Errors: InvalidTypeError for other types (complex, str, None, arrays of 1 or more
/// dimensions, floats for an integer dtype), InvalidUsageError for a value out of range.
Scalar to_scalar(py::handle value, DataType dtype, const char *site) {
  const auto wrong_type = [&](std::string_view needs) {
    raise_invalid_type(site, fmt::format("{}: {} needs {}, got {} {}", site, to_string(dtype), needs,
                                         type_name(value), std::string(py::repr(value))));
  };
  const bool is_array = py::isinstance<py::array>(value);
  if (is_array && py::reinterpret_borrow<py::array>(value).ndim() != 0) wrong_type("a scalar");
  if (PyBool_Check(value.ptr()) || py::isinstance(value, py::module_::import("numpy").attr("bool_")))
    wrong_type("a number, not a bool");
  Scalar s;
  if (is_floating(dtype)) {
    if (PyComplex_Check(value.ptr()) || py::isinstance(value, py::module_::import("numpy").attr("complexfloating")) ||
        (is_array && py::reinterpret_borrow<py::array>(value).dtype().kind() == 'c'))
      wrong_type("a real number");
    if (!PyFloat_Check(value.ptr()) && !PyIndex_Check(value.ptr()) && !PyNumber_Check(value.ptr()))
      wrong_type("a real number");
    s.f64 = PyFloat_AsDouble(value.ptr());
    if (s.f64 == -1.0 && PyErr_Occurred()) {
      const bool overflow = PyErr_ExceptionMatches(PyExc_OverflowError);
      PyErr_Clear();
      if (!overflow) wrong_type("a real number");
      raise_invalid_usage("kiln", site, fmt::format("{}: {} is out of {}'s range", site,
                                                    std::string(py::repr(value)), to_string(dtype)));
    }
    s.i64 = Scalar::of(s.f64).i64;
    return s;
  }
  if (!is_integer(value)) wrong_type("an int");
  py::int_ i = index_of(value, site);
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

// Every operation checks all its arguments (types, then dtypes, shapes and aliasing in the
// executor) before it allocates or copies anything: a usage mistake is never out-of-memory.

void fill(py::handle out_obj, py::handle value) {
  check_not_in_observer("fill");
  PyArray &out = as_array(out_obj, "fill", "out");
  const Ndarray &o = out.get("fill");
  const Scalar s = to_scalar(value, o.dtype(), "fill");
  auto ex = executor();
  check(launch({&out}, [&] { return ex->fill(o, s); }));
}

void copy(py::handle dst_obj, py::handle src_obj) {
  check_not_in_observer("copy");
  PyArray &dst = as_array(dst_obj, "copy", "dst");
  PyArray &src = as_array(src_obj, "copy", "src");
  const Ndarray &d = dst.get("copy");
  const Ndarray &s = src.get("copy");
  auto ex = executor();
  check(launch({&dst, &src}, [&] { return ex->copy(d, s); }));
}

void axpy(py::handle alpha, py::handle x, py::handle y_obj) {
  check_not_in_observer("axpy");
  PyArray &y = as_array(y_obj, "axpy", "y");
  const Ndarray &yy = y.get("axpy");
  const Scalar a = to_scalar(alpha, yy.dtype(), "axpy");
  auto ex = executor();
  if (py::isinstance<PyArray>(x)) {
    PyArray &xa = as_array(x, "axpy", "x");
    const Ndarray &xx = xa.get("axpy");
    check(launch({&xa, &y}, [&] { return ex->axpy(a, xx, yy); }));
    return;
  }
  // x in host memory: checked against y before any copy of it, then staged for the launch.
  check(ex->check_usable("axpy", yy));
  auto [input, dtype] = host_input(x, "axpy");
  const std::vector<int64_t> shape(input.shape(), input.shape() + input.ndim());
  if (dtype != yy.dtype() || shape != yy.shape())
    raise_invalid_usage(y.device, "axpy",
                        fmt::format("axpy needs x of y's dtype and shape: x is {}, y is {}",
                                    describe_array(dtype, shape), y.description));
  const py::array host = contiguous_host_array(input, "axpy");
  const std::span<const std::byte> bytes(static_cast<const std::byte *>(host.data()),
                                         static_cast<std::size_t>(host.nbytes()));
  check(launch({&y}, [&] { return ex->axpy_from_host(a, bytes, yy); }));
}

py::object reduce_sum(py::handle x_obj) {
  check_not_in_observer("reduce_sum");
  PyArray &x = as_array(x_obj, "reduce_sum", "x");
  const Ndarray &xx = x.get("reduce_sum");
  auto ex = executor();
  const Scalar sum = check(launch({&x}, [&] { return ex->reduce_sum(xx); }));
  if (is_floating(xx.dtype())) return py::float_(sum.f64);
  return py::int_(sum.i64);
}

py::object matmul(py::handle a_obj, py::handle b_obj, py::object out_obj) {
  check_not_in_observer("matmul");
  PyArray &a = as_array(a_obj, "matmul", "a");
  PyArray &b = as_array(b_obj, "matmul", "b");
  const Ndarray &aa = a.get("matmul");
  const Ndarray &bb = b.get("matmul");
  auto ex = executor();
  // The whole call is checked before the output exists (validation before reservation).
  const std::array<int64_t, 2> shape = check(ex->matmul_output_shape(aa, bb));
  if (out_obj.is_none()) {
    BusyScope operands({&a, &b});  // an OOM observer may not free them while out is allocated
    out_obj = py::cast(PyArray(check(ex->ndarray(aa.dtype(), shape)), ex));
  }
  PyArray &c = as_array(out_obj, "matmul", "out");
  const Ndarray &cc = c.get("matmul");  // shape, dtype and aliasing are checked by the executor
  check(launch({&a, &b, &c}, [&] { return ex->matmul(cc, aa, bb); }));
  return out_obj;
}

PyArray compact_positive(py::handle x_obj) {
  check_not_in_observer("compact_positive");
  PyArray &x = as_array(x_obj, "compact_positive", "x");
  const Ndarray &xx = x.get("compact_positive");
  auto ex = executor();
  Ndarray out = check(launch({&x}, [&] { return ex->compact_positive(xx); }));
  return PyArray(std::move(out), ex);
}

/// copy.copy / copy.deepcopy of a kiln.ndarray: a new array of the same dtype and shape on the
/// current executor, filled by the copy kernel. Errors: those of ndarray() and copy().
PyArray copy_array(py::handle self) {
  check_not_in_observer("copy");
  PyArray &src = as_array(self, "copy", "self");
  const Ndarray &s = src.get("copy");
  auto ex = executor();
  check(ex->check_usable("copy", s));  // before the new array is allocated
  PyArray out(check(ex->ndarray(s.dtype(), s.shape())), ex);
  check(launch({&src}, [&] { return ex->copy(out.array, s); }));
  return out;
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

uint64_t add_oom_observer(py::handle fn) {
  if (!PyCallable_Check(fn.ptr()))
    raise_invalid_type("add_oom_observer",
                       fmt::format("add_oom_observer: callback must be callable (it is called "
                                   "with the exception), got {} {}",
                                   type_name(fn), std::string(py::repr(fn))));
  auto callback = std::make_shared<PyCallback>(py::reinterpret_borrow<py::function>(fn));
  auto ex = executor();
  const uint64_t id = ex->memory().add_oom_observer([callback](const Failure &failure) {
    if (!Py_IsInitialized() || python_is_finalizing()) return;
    py::gil_scoped_acquire gil;
    py::error_scope keep;  // whatever error was pending stays pending
    ObserverScope in_observer;
    try {
      py::handle(callback->fn)(make_exception(failure));
    } catch (py::error_already_set &e) {
      if (!e.matches(PyExc_Exception)) {  // KeyboardInterrupt, SystemExit: the caller gets it
        if (t_observer_interrupt == nullptr) t_observer_interrupt = e.value().inc_ref().ptr();
        return;
      }
      // Never into C++: reported like an error in __del__.
      e.discard_as_unraisable(py::reinterpret_borrow<py::object>(callback->fn));
    } catch (const std::exception &e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      PyErr_WriteUnraisable(callback->fn);
    }
  });
  g_observer_ids.push_back(id);
  return id;
}

/// Removes an observer by the id add_oom_observer returned; False when there is none (unknown or
/// already removed). Errors: InvalidTypeError (not an int), InvalidUsageError (negative, huge).
bool remove_oom_observer(py::handle id_obj) {
  const uint64_t id = to_bytes(id_obj, "observer_id", "remove_oom_observer");
  std::erase(g_observer_ids, id);
  return executor()->memory().remove_oom_observer(id);
}

// ----------------------------------------------------------------------------------------------
// Testing hooks (kiln.testing).

/// Enters a fail_allocation block: its `at`-th allocation from now fails. An inner block's plan
/// replaces the outer one's while it is open; allocations inside it still count for the outer.
/// Errors: InvalidTypeError (not an int: any __index__ object but bool), InvalidUsageError
/// (at < 1 or beyond 2**63-1).
void push_fault(py::handle at) {
  const uint64_t n = to_bytes(at, "at", "fail_allocation");
  if (n < 1)
    raise_invalid_usage("kiln", "fail_allocation",
                        fmt::format("fail_allocation(at={}): at must be an int >= 1", n));
  runtime::RequestFaultPlan &plan = executor()->memory().fault_plan();
  if (g_fault_blocks.empty()) plan.fail_nth_allocation(FaultPlan::kNever);  // the count starts at 0
  const uint64_t start = plan.allocation_count();
  g_fault_blocks.push_back({start, start + n});
  plan.fail_at_count(start + n);
}

/// Leaves the innermost block: the outer block's plan is armed again (counting on from its own
/// start), or the plan is cleared when it was the outermost.
void pop_fault() {
  runtime::RequestFaultPlan &plan = executor()->memory().fault_plan();
  if (!g_fault_blocks.empty()) g_fault_blocks.pop_back();
  if (g_fault_blocks.empty()) {
    plan.fail_nth_allocation(FaultPlan::kNever);
  } else {
    plan.fail_at_count(g_fault_blocks.back().fail_at);
  }
}
/// Allocations since the innermost open block began (or, outside blocks, since the last one
/// ended or since init).
uint64_t fault_allocation_count() {
  const uint64_t count = executor()->memory().fault_plan().allocation_count();
  return g_fault_blocks.empty() ? count : count - g_fault_blocks.back().start_count;
}

/// A synthetic failure made into its exception (for errors without a producer on cpu/mock).
/// A str argument of `site`. Errors: InvalidTypeError.
std::string to_text(py::handle value, const char *name, const char *site) {
  if (!py::isinstance<py::str>(value))
    raise_invalid_type(site, fmt::format("{}: {} must be a str, got {} {}", site, name,
                                         type_name(value), std::string(py::repr(value))));
  return value.cast<std::string>();
}

py::object make_error(py::handle result_obj, py::handle oom_source_obj, py::handle requested_obj,
                      py::handle device_obj, py::handle detail_obj) {
  const std::string result = to_text(result_obj, "result", "make_error");
  const std::string oom_source = to_text(oom_source_obj, "oom_source", "make_error");
  const uint64_t requested_bytes = to_bytes(requested_obj, "requested_bytes", "make_error");
  const std::string device = to_text(device_obj, "device", "make_error");
  const std::string detail = to_text(detail_obj, "detail", "make_error");
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

/// Raises InvalidTypeError for a call of `name` whose arguments do not match `parameters` (too
/// many or too few, an unknown keyword): what pybind11 would raise as a plain TypeError.
[[noreturn]] void raise_signature_mismatch(const char *name, const char *parameters,
                                           const py::args &args, const py::kwargs &kwargs) {
  std::string given = std::string(py::repr(args));
  if (!kwargs.empty()) given += " and keywords " + std::string(py::repr(kwargs));
  if (given.size() > 200) given = given.substr(0, 200) + "...";
  raise_invalid_type(name, fmt::format("{}{} does not take the arguments {}", name, parameters, given));
}

/// Adds to function `name` of `scope` (a module or class) a last overload that takes anything
/// and raises InvalidTypeError (raise_signature_mismatch; `name` and `parameters` are literals): pybind11 tries it only when the real
/// one's arguments did not match, so the calls that match pay nothing.
void typed_mismatch(py::module_ &scope, const char *name, const char *parameters) {
  scope.def(name, [name, parameters](py::args args, py::kwargs kwargs) {
    raise_signature_mismatch(name, parameters, args, kwargs);
  });
}
template <class Class>
void typed_method_mismatch(Class &cls, const char *name, const char *parameters) {
  cls.def(name, [name, parameters](py::handle, py::args args, py::kwargs kwargs) {
    raise_signature_mismatch(name, parameters, args, kwargs);
  });
}

}  // namespace
}  // namespace kiln::python

PYBIND11_MODULE(_kiln, m) {
  using namespace kiln;
  using namespace kiln::python;
  m.doc() = "kiln native module; use the package `kiln`.";
  load_error_classes();
  // A C++ exception that reaches Python from below the executor's guards (pybind11's own
  // allocations, numpy copies): std::bad_alloc is HostOutOfMemoryError, std::future_error and
  // std::system_error (a thread the host refused) RuntimeFaultError; never a plain MemoryError
  // or RuntimeError.
  py::register_exception_translator([](std::exception_ptr caught) {
    try {
      std::rethrow_exception(caught);
    } catch (const std::bad_alloc &) {
      set_python_error(runtime::failure_from_current_exception("host", "kiln"));
    } catch (const std::future_error &) {
      set_python_error(runtime::failure_from_current_exception("host", "kiln"));
    } catch (const std::system_error &) {
      set_python_error(runtime::failure_from_current_exception("host", "kiln"));
    }
  });

  py::enum_<DataType> dtype_enum(m, "dtype", "Element type of a kiln.ndarray.");
  dtype_enum
      .value("f32", DataType::f32)
      .value("f64", DataType::f64)
      .value("i32", DataType::i32)
      .value("i64", DataType::i64)
      .export_values()
      .def_property_readonly("itemsize", [](DataType d) { return itemsize(d); })
      .def_property_readonly("numpy", [](DataType d) { return numpy_dtype(d); });
  // Replaces enum_'s __init__ and __setstate__, which take any int: kiln.dtype(4) would be a
  // dtype that names nothing. Accepts a kiln.dtype, its name ("f32") or its value (0..3).
  for (const char *name : {"__init__", "__setstate__"}) {
    dtype_enum.attr(name) = py::cpp_function(
        [](py::detail::value_and_holder &v_h, py::handle value) {
          DataType d{};
          if (is_integer(value)) {
            const uint64_t v = to_bytes(value, "value", "dtype");
            d = static_cast<DataType>(std::min<uint64_t>(v, 255));
          } else {
            d = to_dtype(value, "dtype");
          }
          if (!is_valid(d))
            raise_invalid_usage("kiln", "dtype",
                                fmt::format("kiln.dtype({}): not a kiln dtype; the values are 0 "
                                            "(f32), 1 (f64), 2 (i32) and 3 (i64)",
                                            std::string(py::repr(value))));
          py::detail::initimpl::setstate<py::class_<DataType>>(v_h, std::move(d), Py_TYPE(v_h.inst) != v_h.type->type);
        },
        py::detail::is_new_style_constructor(), py::name(name), py::is_method(dtype_enum),
        py::arg("value"));
  }
  // Replaces enum_'s own __str__ ("dtype.f32"): str(kiln.f32) == "f32".
  dtype_enum.attr("__str__") = py::cpp_function([](DataType d) { return std::string(to_string(d)); },
                                                py::is_method(dtype_enum));

  m.def("init", &init, py::arg("arch") = "cpu", py::kw_only(), py::arg("budget_bytes") = py::none(),
        py::arg("reserve_bytes") = py::none(), py::arg("live_check") = true,
        py::arg("caching") = true, py::arg("device_heap_bytes") = py::none(),
        py::arg("mock_capacity_bytes") = py::none(), py::arg("mock_other_process_bytes") = py::none(),
        py::arg("num_threads") = py::none(), py::arg("fault_at") = py::none(),
        py::arg("fail_sizes_at_least") = py::none(), guarded());
  m.def("device", [] { return executor()->device().name(); }, guarded());
  m.def("_shutdown", [] {
    g_closing_thread = std::this_thread::get_id();
    g_closing.store(true, std::memory_order_release);
    wait_for_calls_inside();
    replace_executor(nullptr);
  });

  py::class_<PyArray> cls(m, "ndarray", R"(ndarray(dtype, shape): an array in device memory.

dtype: kiln.f32, f64, i32, i64 (or their names); shape: an int or a sequence of ints (at most 32
dimensions). The contents are uninitialized. Errors: InvalidTypeError (wrong types),
InvalidUsageError (a negative dimension, too many dimensions, a size beyond numpy's), an
OutOfMemoryError subclass when the memory cannot be had. Freed by del / garbage collection or
a.free(); a.to_numpy() copies it to a new numpy array; on cpu and mock np.asarray(a) is a
zero-copy view. Thread safety: any thread may use an array, but freeing one while another
thread uses it is InvalidUsageError.)", py::buffer_protocol());
  // Every accessor goes through as_array: an instance made by ndarray.__new__ alone is refused.
  const auto arr = [](py::handle self) -> PyArray & { return as_array(self, "ndarray", "self"); };
  cls.def(py::init(&make_ndarray), py::arg("dtype"), py::arg("shape"), guarded())
      .def_property_readonly("shape", [arr](py::handle s) { return py::tuple(py::cast(arr(s).shape)); })
      .def_property_readonly("dtype", [arr](py::handle s) { return arr(s).dtype; })
      .def_property_readonly("nbytes", [arr](py::handle s) { return arr(s).nbytes; })
      .def_property_readonly("size", [arr](py::handle s) { return arr(s).size; })
      .def_property_readonly("ndim", [arr](py::handle s) { return arr(s).shape.size(); })
      .def_property_readonly("device", [arr](py::handle s) { return arr(s).device; })
      .def_property_readonly("is_freed", [arr](py::handle s) { return arr(s).is_freed(); })
      // numpy tries the buffer protocol first but swallows its errors (a freed array would
      // become a 0-d object array); this raises them instead, and shares the same counted view.
      .def_property_readonly("__array_interface__", [arr](py::object self) {
        const PyArray &a = arr(self);
        py::dict d;
        d["shape"] = py::tuple(py::cast(a.shape));
        d["typestr"] = numpy_dtype(a.dtype).attr("str");
        d["data"] = py::memoryview(self);
        d["version"] = 3;
        return d;
      })
      .def("free", &free_array, guarded())
      .def("to_numpy", &to_numpy, guarded())
      // copy.copy / copy.deepcopy: a new array on the current device with the same contents
      // (numpy's meaning); pickle: rebuilt by kiln.from_numpy from the host copy.
      .def("__copy__", [](py::handle self) { return copy_array(self); }, guarded())
      .def("__deepcopy__", [](py::handle self, py::handle /*memo*/) { return copy_array(self); },
           py::arg("memo"), guarded())
      .def("__reduce__", [](py::handle self) {
        py::object rebuild = py::module_::import("kiln").attr("_ndarray_from_host");
        return py::make_tuple(rebuild, py::make_tuple(to_numpy(self)));
      })
      .def("__len__", [arr](py::handle s) {
        const PyArray &a = arr(s);
        if (a.shape.empty()) raise_invalid_type("len", "len() of a 0-d kiln.ndarray");
        return a.shape[0];
      })
      .def("__repr__", [](py::handle s) -> std::string {
        if (!py::isinstance<PyArray>(s)) return "kiln.ndarray(?)";
        auto *inst = reinterpret_cast<py::detail::instance *>(s.ptr());
        auto v_h = inst->get_value_and_holder(py::detail::get_type_info(typeid(PyArray)));
        if (!v_h || !v_h.holder_constructed()) return "kiln.ndarray(uninitialized)";
        const PyArray &a = *v_h.value_ptr<PyArray>();
        return fmt::format("kiln.ndarray({}, device='{}'{})", a.description, a.device,
                           a.is_freed() ? ", freed" : "");
      });
  // Our buffer functions replace pybind11's (see ndarray_getbuffer).
  auto *type = reinterpret_cast<PyTypeObject *>(cls.ptr());
  type->tp_as_buffer->bf_getbuffer = &ndarray_getbuffer;
  type->tp_as_buffer->bf_releasebuffer = &ndarray_releasebuffer;

  m.def("from_numpy", &from_numpy, py::arg("a"), guarded());
  m.def("fill", &fill, py::arg("out"), py::arg("value"), guarded());
  m.def("copy", &copy, py::arg("dst"), py::arg("src"), guarded());
  m.def("axpy", &axpy, py::arg("alpha"), py::arg("x"), py::arg("y"), guarded());
  m.def("reduce_sum", &reduce_sum, py::arg("x"), guarded());
  m.def("matmul", &matmul, py::arg("a"), py::arg("b"), py::arg("out") = py::none(), guarded());
  m.def("compact_positive", &compact_positive, py::arg("x"), guarded());

  m.def("memory_stats", &memory_stats, guarded());
  m.def("memory_summary", [] { return executor()->memory().summary(); }, guarded());
  m.def("empty_cache", [] { return executor()->memory().release_cached(); }, guarded());
  m.def("reset_peak_memory_stats", [] { executor()->memory().reset_peaks(); }, guarded());
  m.def("add_oom_observer", &add_oom_observer, py::arg("callback"), guarded());
  m.def("remove_oom_observer", &remove_oom_observer, py::arg("observer_id"), guarded());

  // Wrong arity or an unknown keyword: InvalidTypeError, not pybind11's plain TypeError.
  cls.def(py::init([](py::args args, py::kwargs kwargs) -> PyArray {
    raise_signature_mismatch("ndarray", "(dtype, shape)", args, kwargs);
  }));
  typed_method_mismatch(cls, "free", "()");
  typed_method_mismatch(cls, "to_numpy", "()");
  for (const auto &[name, parameters] : std::initializer_list<std::pair<const char *, const char *>>{
           {"init", "(arch='cpu', *, budget_bytes=None, reserve_bytes=None, live_check=True, "
                    "caching=True, device_heap_bytes=None, mock_capacity_bytes=None, "
                    "mock_other_process_bytes=None, num_threads=None, fault_at=None, "
                    "fail_sizes_at_least=None)"},
           {"device", "()"},
           {"from_numpy", "(a)"},
           {"fill", "(out, value)"},
           {"copy", "(dst, src)"},
           {"axpy", "(alpha, x, y)"},
           {"reduce_sum", "(x)"},
           {"matmul", "(a, b, out=None)"},
           {"compact_positive", "(x)"},
           {"memory_stats", "()"},
           {"memory_summary", "()"},
           {"empty_cache", "()"},
           {"reset_peak_memory_stats", "()"},
           {"add_oom_observer", "(callback)"},
           {"remove_oom_observer", "(observer_id)"}})
    typed_mismatch(m, name, parameters);

  m.def("_push_fault", &push_fault, py::arg("at"), guarded());
  m.def("_pop_fault", &pop_fault, guarded());
  m.def("_fault_allocation_count", &fault_allocation_count, guarded());
  // Throws a C++ exception of `kind` (bad_alloc, future_error, system_error) through the module:
  // tests the translation above.
  m.def("_throw_cpp_exception", [](const std::string &kind) {
    if (kind == "bad_alloc") throw std::bad_alloc();
    if (kind == "future_error") throw std::future_error(std::future_errc::no_state);
    if (kind == "system_error")
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
  }, py::arg("kind"));
  m.def("_make_error", &make_error, py::arg("result"), py::arg("oom_source") = "none",
        py::arg("requested_bytes") = 0, py::arg("device") = "", py::arg("detail") = "", guarded());
}
