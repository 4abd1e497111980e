// Memory functions: kiln.memory_stats, memory_summary, empty_cache, reset_peak_memory_stats,
// add_oom_observer and remove_oom_observer.
//
// Threading: called with the GIL held. An OOM observer runs on the thread whose allocation failed,
// possibly without the GIL (inside a launch): it re-acquires the GIL, runs inside an
// ObserverScope, and never lets a Python error into C++. Errors: InvalidTypeError and
// InvalidUsageError for arguments; an observer's KeyboardInterrupt or SystemExit is stashed and
// raised by the interrupted call's check() (error_mapping.h); its other errors are unraisable.
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>

#include <fmt/format.h>

#include <memory>
#include <string>

#include "conversions.h"
#include "armed_exception.h"
#include "error_mapping.h"
#include "fast_entry.h"
#include "executor_state.h"
#include "registration.h"
#include "signatures.h"
#include "kiln_stub_docstrings.h"

namespace kiln::python {
namespace {

/// Whether the interpreter is shutting down. Py_IsFinalizing is public from Python 3.13; older
/// versions only have the private name.
bool python_is_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

py::dict memory_stats_of(const std::shared_ptr<LlvmRuntimeExecutor> &ex) {
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

/// Runs the observer (GIL held) and deals with what it raised; nothing here owns a Python
/// reference across the call. Errors never reach C++ (see notify).
void call_observer(const PyCallback &callback, const Failure &failure) {
  PyObject *exception = nullptr;
  try {
    throw_if_armed(ArmedSite::observer);
    exception = make_exception(failure).release().ptr();
  } catch (py::error_already_set &e) {
    if (!e.matches(PyExc_Exception)) {  // KeyboardInterrupt, SystemExit: the caller gets it
      stash_observer_interrupt(e);
      return;
    }
    e.discard_as_unraisable(py::reinterpret_borrow<py::object>(callback.fn));
    return;
  } catch (abi::__forced_unwind &) {
    throw;  // the thread is ending: no Python error to set
  } catch (...) {
    translate_active_exception();  // the one mapping: bad_alloc is HostOutOfMemoryError
    PyErr_WriteUnraisable(callback.fn);
    return;
  }
  PyObject *result = PyObject_CallOneArg(callback.fn, exception);  // CPython may end the thread here
  Py_DECREF(exception);
  if (result != nullptr) {
    Py_DECREF(result);
    return;
  }
  if (!PyErr_ExceptionMatches(PyExc_Exception)) {  // KeyboardInterrupt, SystemExit: the caller gets it
    stash_observer_interrupt(py::error_already_set());
    return;
  }
  PyErr_WriteUnraisable(callback.fn);  // never into C++: reported like an error in __del__
}

/// Calls `callback` with the exception of `failure` (from DeviceMemory, any thread). No RAII
/// holds the GIL or a Python object here: at interpreter exit, after kiln._shutdown's wait gave
/// up on a long observer, CPython ends this thread inside the observer (a forced unwind). The
/// unwind must then neither release the GIL, which the finalizing thread holds, nor touch an
/// object without it: what the thread held is left as it is, the process is ending.
void notify(const PyCallback &callback, const Failure &failure) {
  if (!Py_IsInitialized() || python_is_finalizing()) return;
  const PyGILState_STATE gil = PyGILState_Ensure();
  PyObject *pending_type = nullptr, *pending_value = nullptr, *pending_traceback = nullptr;
  PyErr_Fetch(&pending_type, &pending_value, &pending_traceback);  // stays pending afterwards
  {
    ObserverScope in_observer;  // thread-local flags only: safe to unwind
    call_observer(callback, failure);
  }
  PyErr_Restore(pending_type, pending_value, pending_traceback);
  PyGILState_Release(gil);
}

uint64_t add_oom_observer(py::handle fn) {
  if (!PyCallable_Check(fn.ptr()))
    raise_invalid_type("add_oom_observer",
                       fmt::format("add_oom_observer: callback must be callable (it is called "
                                   "with the exception), got {} {}",
                                   type_name(fn), std::string(py::repr(fn))));
  auto callback = std::make_shared<PyCallback>(py::reinterpret_borrow<py::function>(fn));
  DeviceState &state = current_device();
  auto ex = executor_of(state);
  const uint64_t id = ex->memory().add_oom_observer(
      [callback](const Failure &failure) { notify(*callback, failure); });
  remember_observer(state, id);
  return id;
}

/// Removes an observer by the id add_oom_observer returned; False when there is none (unknown or
/// already removed). Errors: InvalidTypeError (not an int), InvalidUsageError (negative, huge).
bool remove_oom_observer(py::handle id_obj) {
  const uint64_t id = to_bytes(id_obj, "observer_id", "remove_oom_observer");
  DeviceState &state = current_device();
  forget_observer(state, id);
  return executor_of(state)->memory().remove_oom_observer(id);
}

}  // namespace

/// (free, total) bytes of `ex`'s device, asked of the driver now (torch.cuda.mem_get_info's
/// order). Errors: through check() (a lost device).
py::tuple mem_get_info_of(const std::shared_ptr<LlvmRuntimeExecutor> &ex) {
  uint64_t free_bytes = 0, total_bytes = 0;
  const RhiResult r = without_gil([&] { return ex->device().get_memory_info(&free_bytes, &total_bytes); });
  if (r != RhiResult::success)
    raise_failure(make_failure(r, ex->device().name(), "mem_get_info", "the driver's memory query failed"));
  return py::make_tuple(free_bytes, total_bytes);
}

/// The memory functions of kiln.Device (each acts on that device, opened on first use).
void def_device_methods(py::module_ &m) {
  py::object cls = m.attr("Device");
  const auto of = [](py::handle self) { return executor_of(*py::cast<DeviceState *>(self)); };
  py::setattr(cls, "memory_stats", py::cpp_function([of](py::handle self) { return memory_stats_of(of(self)); },
                                                    py::name("memory_stats"), py::is_method(cls),
                                                    doc("Device.memory_stats"), guarded()));
  py::setattr(cls, "memory_summary",
              py::cpp_function([of](py::handle self) { return of(self)->memory().summary(); },
                               py::name("memory_summary"), py::is_method(cls), doc("Device.memory_summary"),
                               guarded()));
  py::setattr(cls, "empty_cache",
              py::cpp_function([of](py::handle self) { return of(self)->memory().release_cached(); },
                               py::name("empty_cache"), py::is_method(cls), doc("Device.empty_cache"), guarded()));
  py::setattr(cls, "reset_peak_memory_stats",
              py::cpp_function([of](py::handle self) { of(self)->memory().reset_peaks(); },
                               py::name("reset_peak_memory_stats"), py::is_method(cls),
                               doc("Device.reset_peak_memory_stats"), guarded()));
  py::setattr(cls, "mem_get_info", py::cpp_function([of](py::handle self) { return mem_get_info_of(of(self)); },
                                                    py::name("mem_get_info"), py::is_method(cls),
                                                    doc("Device.mem_get_info"), guarded()));
}

void register_memory(py::module_ &m) {
  def_device_methods(m);
  def_typed(m, "memory_stats", "()", [] { return memory_stats_of(executor()); }, doc("memory_stats"), guarded());
  def_typed(m, "mem_get_info", "()", [] { return mem_get_info_of(executor()); }, doc("mem_get_info"), guarded());
  def_typed(m, "memory_summary", "()", [] { return executor()->memory().summary(); },
            doc("memory_summary"), guarded());
  def_typed(m, "empty_cache", "()", [] { return executor()->memory().release_cached(); },
            doc("empty_cache"), guarded());
  def_typed(m, "reset_peak_memory_stats", "()", [] { executor()->memory().reset_peaks(); },
            doc("reset_peak_memory_stats"),
            guarded());
  def_typed(m, "add_oom_observer", "(callback)", &add_oom_observer, doc("add_oom_observer"),
            py::arg("callback"), guarded());
  def_typed(m, "remove_oom_observer", "(observer_id)", &remove_oom_observer, doc("remove_oom_observer"),
            py::arg("observer_id"), guarded());
}

}  // namespace kiln::python
