// The module's global state (see executor_state.h): the devices (kiln.Device; their
// configuration is device_config.cpp's), the current device, the observers and fault blocks tied to each
// executor, and interpreter exit while other threads are inside kiln.
//
// Threading: the executor and its lists are guarded by the GIL; the count of calls inside kiln is
// atomic. Executor creation (the JIT) runs without the GIL. Errors: InvalidTypeError and
// InvalidUsageError for init's arguments (conversions.h), executor failures by check()
// (error_mapping.h).
#include "executor_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "conversions.h"
#include "device_config.h"
#include "fast_entry.h"
#include "ndarray.h"
#include "error_mapping.h"
#include "kiln/rhi/fork_hooks.h"
#include "kiln/rhi/teardown_failures.h"
#include "registration.h"
#include "signatures.h"
#include "kiln_stub_docstrings.h"

namespace kiln::python {
namespace {

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
std::atomic<int> g_calls_inside{0};  // outermost kiln calls in progress, every thread (add_with_gil)
std::thread::id g_closing_thread;  // guarded by the GIL: the thread that ran kiln._shutdown
constinit thread_local int t_call_depth __attribute__((tls_model("initial-exec"))) = 0;  // initial-exec: see error_mapping.cpp

[[noreturn]] void park_forever() {
  (void)PyEval_SaveThread();  // releases the GIL; this thread never takes it back
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// A forked child has only the forking thread: the calls other threads had in progress are not.
ForkRegistration g_calls_fork_registration(ForkHooks{
    nullptr, nullptr, [] {
      g_calls_inside.store(t_call_depth > 0 ? 1 : 0, std::memory_order_relaxed);
      g_calls_without_gil.store(t_calls_without_gil, std::memory_order_relaxed);
    }});

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
// The devices: one DeviceState per device name, the current one, their executors.

/// Every device state made (never destroyed: arrays and kiln.Device objects point at them).
std::vector<DeviceState *> &states() {
  static auto *list = new std::vector<DeviceState *>;
  return *list;
}
DeviceState *g_cpu_state = nullptr;      // device_state(cpu), kept for current_device()
DeviceState *g_default_state = nullptr;  // the device kiln.init made current; cpu when null
uint64_t g_last_generation = 0;          // the generation the last executor made got
PyObject *g_current_var = nullptr;       // the context variable of `with kiln.device(...)`
bool g_with_used = false;  // a `with` block was ever entered: only then is the variable read

}  // namespace

void replace_executor(DeviceState &state, std::shared_ptr<LlvmRuntimeExecutor> fresh) {
  if (state.executor)
    for (uint64_t id : state.observer_ids) (void)state.executor->memory().remove_oom_observer(id);
  state.observer_ids.clear();
  state.fault_blocks.clear();  // they armed the old executor's plan
  state.generation = fresh ? ++g_last_generation : 0;
  // A call in progress on the old executor (an OOM observer let another thread configure it)
  // holds a reference of its own: the executor goes when that call returns.
  state.executor = std::move(fresh);
}

DeviceState *process_default_device() { return g_default_state; }

void set_process_default_device(DeviceState *state) { g_default_state = state; }

py::object device_object(DeviceState &state) {
  if (state.handle == nullptr)
    state.handle = py::cast(&state, py::return_value_policy::reference).release().ptr();
  return py::reinterpret_borrow<py::object>(state.handle);
}

DeviceState &to_device_state(py::handle value, const char *site) {
  if (py::isinstance<DeviceState>(value)) return state_of_device(value);
  return device_state(to_device_name(value, site));
}

namespace {

/// kiln._shutdown (run by atexit): closes the door to other threads, waits for the calls inside.
void shutdown() {
  g_closing_thread = std::this_thread::get_id();
  g_closing.store(true, std::memory_order_release);
  wait_for_calls_inside();
  for (DeviceState *s : states()) replace_executor(*s, nullptr);
}

/// The device state a value of the context variable names: (state address, Device, previous),
/// as enter_device sets it. Errors: InvalidUsageError for anything else (code that set the
/// variable itself).
DeviceState &state_in_variable(const py::object &value, const char *site) {
  if (PyTuple_CheckExact(value.ptr()) && PyTuple_GET_SIZE(value.ptr()) == 3) {
    void *address = PyLong_AsVoidPtr(PyTuple_GET_ITEM(value.ptr(), 0));
    if (address == nullptr) PyErr_Clear();
    for (DeviceState *s : states())
      if (s == address) return *s;
  }
  raise_invalid_usage("kiln", site,
                      fmt::format("{}: the context variable kiln.current_device holds {}, which "
                                  "kiln did not put there; enter devices with `with kiln.device(...)`",
                                  site, type_name(value)));
}

}  // namespace

DeviceState &state_of_device(py::handle value) {
  auto *state = py::cast<DeviceState *>(value);
  for (DeviceState *s : states())
    if (s == state) return *s;
  raise_invalid_type("Device", "a kiln.Device that kiln.device() did not return");
}

namespace {

/// Device.__enter__: makes the device current in this context until __exit__. The variable holds
/// (state address, Device, the value it replaced).
py::object enter_device(py::object self) {
  DeviceState &state = state_of_device(self);
  PyObject *previous = nullptr;
  if (PyContextVar_Get(g_current_var, Py_None, &previous) < 0) throw py::error_already_set();
  py::object prev = py::reinterpret_steal<py::object>(previous);
  py::tuple value = py::make_tuple(py::reinterpret_steal<py::object>(PyLong_FromVoidPtr(&state)), self, prev);
  PyObject *token = PyContextVar_Set(g_current_var, value.ptr());
  if (token == nullptr) throw py::error_already_set();
  Py_DECREF(token);
  g_with_used = true;
  return self;
}

/// Device.__exit__: the current device goes back to what it was at the matching __enter__.
/// Errors: InvalidUsageError when this device is not the one this context's innermost block
/// entered (an __exit__ without its __enter__, or blocks closed out of order).
void exit_device(py::object self) {
  DeviceState &state = state_of_device(self);
  PyObject *value = nullptr;
  if (PyContextVar_Get(g_current_var, Py_None, &value) < 0) throw py::error_already_set();
  py::object current = py::reinterpret_steal<py::object>(value);
  if (current.is_none() || &state_in_variable(current, "Device.__exit__") != &state)
    raise_invalid_usage(state.key, "Device.__exit__",
                        fmt::format("Device.__exit__: {} is not the device this context's innermost "
                                    "`with kiln.device(...)` block entered",
                                    state.key));
  PyObject *token = PyContextVar_Set(g_current_var, PyTuple_GET_ITEM(current.ptr(), 2));
  if (token == nullptr) throw py::error_already_set();
  Py_DECREF(token);
}

}  // namespace

CallGuard::CallGuard() {
  if (t_call_depth == 0) discard_stale_observer_interrupt();  // left by a call that threw past check()
  if (t_call_depth == 0 && g_closing.load(std::memory_order_acquire) &&
      std::this_thread::get_id() != g_closing_thread)
    park_forever();
  if (t_call_depth++ == 0) add_with_gil(g_calls_inside, 1);
}

CallGuard::~CallGuard() {
  if (--t_call_depth == 0) add_with_gil(g_calls_inside, -1);
}

DeviceState &device_state(const DeviceName &name) {
  for (DeviceState *s : states())
    if (s->name.backend == name.backend && s->name.ordinal == name.ordinal) return *s;
  auto *state = new DeviceState;
  state->name = name;
  const bool host = name.backend == Backend::cpu || name.backend == Backend::mock;
  state->key = host && name.ordinal == 0 ? std::string(to_string(name.backend))  // LlvmDevice::name()
                                         : fmt::format("{}:{}", to_string(name.backend), name.ordinal);
  states().push_back(state);
  return *state;
}

const std::vector<DeviceState *> &device_states() { return states(); }

DeviceState &current_device() {
  if (g_with_used) {
    PyObject *value = nullptr;
    if (PyContextVar_Get(g_current_var, Py_None, &value) < 0) throw py::error_already_set();
    const py::object held = py::reinterpret_steal<py::object>(value);
    if (!held.is_none()) return state_in_variable(held, "current_device");
  }
  if (g_default_state != nullptr) return *g_default_state;
  if (g_cpu_state == nullptr) g_cpu_state = &device_state(DeviceName{Backend::cpu, 0});
  return *g_cpu_state;
}

std::shared_ptr<LlvmRuntimeExecutor> executor_of(DeviceState &state) {
  if (!state.executor) {
    const py::object none = py::none();
    configure(state, DeviceOptions{none, none, none, none, none, none, none, none, none, none}, "init",
              /*only_if_closed=*/true);
  }
  return state.executor;
}

bool made_by_current_executor(const PyArray &a) {
  return a.executor_generation != 0 && a.executor_generation == a.state->generation;
}

std::shared_ptr<LlvmRuntimeExecutor> executor_of_array(const PyArray &a, const char *site) {
  if (!made_by_current_executor(a))
    raise_invalid_usage(a.device_name(), site,
                        fmt::format("ndarray {} belongs to another executor: {}'s executor was replaced "
                                    "(Device.configure, kiln.init) or closed since the array was made; "
                                    "it can only be freed",
                                    a.description(), a.device_name()));
  return executor_of(*a.state);
}

std::shared_ptr<LlvmRuntimeExecutor> executor() { return executor_of(current_device()); }

void check_not_in_observer(const char *site) {
  if (in_observer())
    raise_invalid_usage("kiln", site,
                        fmt::format("kiln.{} cannot run inside an OOM observer (the failing "
                                    "allocation is still in progress); observers may free arrays "
                                    "or call kiln.empty_cache()",
                                    site));
}

void remember_observer(DeviceState &state, uint64_t id) { state.observer_ids.push_back(id); }
void forget_observer(DeviceState &state, uint64_t id) { std::erase(state.observer_ids, id); }

DeviceState *device_of_generation(uint64_t generation) {
  if (generation == 0) return nullptr;
  for (DeviceState *s : states())
    if (s->generation == generation) return s;
  return nullptr;
}

LlvmRuntimeExecutor *executor_of_generation(uint64_t generation) {
  DeviceState *state = device_of_generation(generation);
  return state != nullptr ? state->executor.get() : nullptr;
}


DeviceState &device_argument(py::handle value, const char *site) {
  return value.is_none() ? current_device() : to_device_state(value, site);
}

void register_executor_state(py::module_ &m) {
  g_current_var = PyContextVar_New("kiln.current_device", nullptr);  // never released
  if (g_current_var == nullptr) throw py::error_already_set();
  py::class_<DeviceState, std::unique_ptr<DeviceState, py::nodelete>> cls(m, "Device", doc("Device"), py::is_final());
  // Instances come from kiln.device() only (pybind11 makes them without tp_new): Device.__new__
  // would make one without a device.
  reinterpret_cast<PyTypeObject *>(cls.ptr())->tp_new = [](PyTypeObject *, PyObject *, PyObject *) -> PyObject * {
    return run_guarded([]() -> PyObject * {
      raise_invalid_type("Device", "kiln.Device cannot be made: kiln.device(name) returns a device's one Device");
    });
  };
  cls.def("__init__", [](py::handle, py::args, py::kwargs) {
        raise_invalid_type("Device", "kiln.Device cannot be called: kiln.device(name) returns a device's one Device");
      }, doc("Device.__init__"))
      .def("__str__", [](const DeviceState &s) { return s.key; }, doc("Device.__str__"))
      .def("__repr__", [](const DeviceState &s) { return fmt::format("kiln.device('{}')", s.key); },
           doc("Device.__repr__"))
      .def("__eq__", [](const DeviceState &s, py::handle other) -> py::object {
        if (py::isinstance<DeviceState>(other)) return py::bool_(py::cast<DeviceState *>(other) == &s);
        if (!py::isinstance<py::str>(other)) return py::reinterpret_borrow<py::object>(Py_NotImplemented);
        // Its name only, as its hash is the name's: "cuda" names cuda:0 but is not its name.
        return py::bool_(PyUnicode_Compare(other.ptr(), py::str(s.key).ptr()) == 0);
      }, doc("Device.__eq__"), py::is_operator())
      .def("__hash__", [](const DeviceState &s) { return py::hash(py::str(s.key)); }, doc("Device.__hash__"))
      // One object per device: a copy is the device itself, and pickle names it (kiln.device(name)
      // on the receiving side, opened there on first use with that process's options).
      .def("__copy__", [](py::object self) { return self; }, doc("Device.__copy__"))
      .def("__deepcopy__", [](py::object self, py::handle) { return self; }, doc("Device.__deepcopy__"),
           py::arg("memo"))
      .def("__reduce__", [](const DeviceState &s) {
        return py::make_tuple(py::module_::import("kiln").attr("_device_by_name"), py::make_tuple(s.key));
      }, doc("Device.__reduce__"))
      .def_property_readonly("type", [](const DeviceState &s) { return std::string(to_string(s.name.backend)); },
                             doc("Device.type"))
      .def_property_readonly("index", [](const DeviceState &s) { return s.name.ordinal; }, doc("Device.index"))
      .def_property_readonly("is_open", [](const DeviceState &s) { return static_cast<bool>(s.executor); },
                             doc("Device.is_open"))
      .def("__enter__", &enter_device, doc("Device.__enter__"), guarded())
      .def("__exit__", [](py::object self, py::args) { exit_device(std::move(self)); }, doc("Device.__exit__"),
           guarded());
  def_typed(m, "current_device", "()", [] { return device_object(current_device()); }, doc("current_device"),
            guarded());
  def_typed(m, "_shutdown", "()", &shutdown);
  // The generation of `device`'s executor (the current device's by default), opened if need be
  // (0 for a closed one when `open` is False).
  def_typed(m, "_executor_generation", "(device=None, open=True)", [](py::handle device, bool open) {
    DeviceState &state = device_argument(device, "_executor_generation");
    if (open) (void)executor_of(state);
    return state.generation;
  }, py::arg("device") = py::none(), py::arg("open") = true, guarded());
  // The names of the devices whose executor is open (kiln.testing's fake blocks).
  def_typed(m, "_open_devices", "()", [] {
    py::list names;
    for (DeviceState *s : states())
      if (s->executor) names.append(s->key);
    return names;
  });
}

}  // namespace kiln::python
