// The module's global state: one DeviceState per device (its executor, observers and fault
// blocks; kiln.Device), the current device (a context variable, then kiln.init's, then cpu), the
// count of calls inside kiln (so interpreter exit can wait for them and park late threads), its
// fork hook, and without_gil().
//
// Threading: the executor and the lists here are guarded by the GIL. without_gil() releases it
// around C++ work. Errors are raised through error_mapping.h (executor failures via check()).
#pragma once

#include <pybind11/pybind11.h>

#include <cxxabi.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/executor/executor.h"

#ifdef Py_GIL_DISABLED
#error "kiln's bindings rely on the GIL (add_with_gil, the executor's guard): no free-threaded build"
#endif

namespace kiln::python {

namespace py = pybind11;

/// Set (GIL held) by kiln._shutdown, at interpreter exit: later calls from other threads park,
/// and a thread that CPython ends afterwards may unwind through kiln without the GIL.
inline std::atomic<bool> g_closing{false};

/// Adds `delta` (wrapping: pass 0 - n to subtract) to `counter`, a figure that every thread
/// changes with the GIL held until kiln._shutdown (after it, threads that CPython ends unwind
/// through kiln without the GIL and change it too): a plain load and store while the GIL orders
/// the changes, an atomic read-modify-write after. A lock-prefixed instruction is a full barrier
/// on x86, and the hottest calls change such figures several times. Readers
/// without the GIL (kiln._shutdown's wait) read the counter atomically.
template <class T>
void add_with_gil(std::atomic<T> &counter, T delta) {
  if (!g_closing.load(std::memory_order_acquire)) [[likely]]
    counter.store(static_cast<T>(counter.load(std::memory_order_relaxed) + delta),
                  std::memory_order_release);
  else
    counter.fetch_add(delta, std::memory_order_acq_rel);
}

/// The calls inside without_gil now, over every thread: incremented with the GIL held before it
/// is released, decremented once the call is done (it holds no kiln lock any more) and before
/// the GIL is taken back. Zero, read with the GIL held, means that no thread can be holding a
/// kiln lock while it waits for the GIL (see launch_small in ndarray.h). A forked child starts
/// from the forking thread's own calls.
inline std::atomic<int> g_calls_without_gil{0};
/// This thread's share of g_calls_without_gil (what a forked child starts from).
constinit inline thread_local int t_calls_without_gil __attribute__((tls_model("initial-exec"))) = 0;

/// Runs `fn` with the GIL released and takes the GIL back. At interpreter exit a daemon thread
/// that takes the GIL back is ended by CPython (pthread_exit, a forced unwind); that unwind must
/// pass through here, never through a noexcept destructor (pybind11's gil_scoped_release), which
/// would end the whole process in std::terminate.
template <class Fn>
auto without_gil(Fn &&fn) -> decltype(fn()) {
  g_calls_without_gil.fetch_add(1, std::memory_order_relaxed);
  ++t_calls_without_gil;
  bool counted = true;
  const auto done = [&counted] {
    if (!std::exchange(counted, false)) return;
    --t_calls_without_gil;
    g_calls_without_gil.fetch_sub(1, std::memory_order_release);
  };
  PyThreadState *state = PyEval_SaveThread();
  try {
    auto result = fn();
    done();
    PyEval_RestoreThread(state);  // may end this thread (interpreter exit): a forced unwind
    return result;
  } catch (abi::__forced_unwind &) {
    done();
    throw;  // the thread is ending: there is no GIL to take back
  } catch (...) {
    done();
    PyEval_RestoreThread(state);
    throw;
  }
}

/// pybind11 call guard of every kiln function: counts the calls inside kiln, parks the threads
/// that come in after kiln._shutdown (the exiting thread itself goes on).
struct CallGuard {
  CallGuard();
  ~CallGuard();
  CallGuard(const CallGuard &) = delete;
  CallGuard &operator=(const CallGuard &) = delete;
};
using guarded = py::call_guard<CallGuard>;

/// An open kiln.testing.fail_allocation or kiln.testing.inject block: the FaultPlan count at
/// which it began, the count whose allocation fails (fail_allocation), and the setting it
/// replaced (restored when an inject block, or a block inside one, exits), and whether its own
/// request went by while an inner block's plan was armed instead (so it never failed).
struct FaultBlock {
  uint64_t start_count;  // the plan's count when the block began
  uint64_t fail_at;      // the count whose allocation fails (kNever for an inject block)
  runtime::RequestFaultPlan::Setting previous;  // the plan's setting before the block armed
  bool inject = false;   // an inject block (armed a FaultSpec)
  bool shadowed = false;  // fail_at went by inside an inner block: this block failed nothing
  uint64_t id = 0;        // unique in the process: the token its push returned
};

/// One device of the process ("cuda:1"), what kiln.Device is: its executor (opened on first use
/// with the default options, or by configure / kiln.init), the OOM observers added from Python
/// and the fault blocks open on it. One per device name for the life of the process (never
/// destroyed: arrays and Python objects point at it). Guarded by the GIL.
struct DeviceState {
  DeviceName name;
  std::string key;  // "cuda:1": the device's name as kiln.Device's str gives it
  /// The open executor; null until first use, and again after kiln._shutdown.
  std::shared_ptr<LlvmRuntimeExecutor> executor;
  /// Unique in the process (every executor made gets the next one): which executor an array, a
  /// compiled user kernel or a kiln.testing measurement belongs to. 0 while none is open.
  uint64_t generation = 0;
  std::vector<uint64_t> observer_ids;   // OOM observers added from Python to `executor`
  std::vector<FaultBlock> fault_blocks;  // the open blocks, innermost last
  PyObject *handle = nullptr;  // the kiln.Device (a strong reference, never released)
  /// Held (never with the GIL waited for) while `executor` is made and put in place, so that two
  /// threads opening or configuring the device at once make it one after the other.
  ForkSafeMutex open_mutex{ForkSafeMutex::Policy::reset_in_child};
};

/// The state of device `name`, made (not opened) on first use. Raises nothing but
/// std::bad_alloc.
DeviceState &device_state(const DeviceName &name);
/// The current device: the innermost `with kiln.device(...)` block of this context (thread or
/// asyncio task), else the device kiln.init made current, else cpu. Errors: none (a broken
/// context variable raises the Python error).
DeviceState &current_device();
/// The executor of `state`, opened with the default options on first use (once: threads that
/// open it together wait for the first). Errors: those of kiln.init; InvalidUsageError inside an
/// OOM observer when it is not open.
std::shared_ptr<LlvmRuntimeExecutor> executor_of(DeviceState &state);
/// The current device's executor (executor_of(current_device())).
std::shared_ptr<LlvmRuntimeExecutor> executor();
/// Whether `a` was made by its device's executor as it is now: false once Device.configure or
/// kiln.init replaced that executor, or closed it (the array can only be freed then).
bool made_by_current_executor(const struct PyArray &a);
/// The executor of `a`'s device for operation `site`, refusing first (InvalidUsageError, before
/// the device is opened or anything allocated) an array whose executor was replaced or closed.
std::shared_ptr<LlvmRuntimeExecutor> executor_of_array(const struct PyArray &a, const char *site);
/// The kiln.Device of `state` (one Python object per device for the process).
py::object device_object(DeviceState &state);
/// The device a `device=` argument of `site` names: a kiln.Device, a device name ("cuda:1"), or
/// None for the current device. Errors: InvalidTypeError, InvalidUsageError (not a device name).
DeviceState &device_argument(py::handle value, const char *site);
/// Every device state made so far, in the order they were made.
const std::vector<DeviceState *> &device_states();

/// The device `value` names: a kiln.Device or a device name ("cuda:1"). Errors: InvalidTypeError,
/// InvalidUsageError.
DeviceState &to_device_state(py::handle value, const char *site);

/// The DeviceState of kiln.Device `value`. Errors: InvalidTypeError for an instance kiln did not
/// make (Device.__new__ is refused; this is the last guard).
DeviceState &state_of_device(py::handle value);

/// Replaces `state`'s executor by `fresh` (null: closes it), with the next generation. The old
/// one's Python observers are removed first: its device may live on (arrays keep it), and an
/// observer that refers to such an array would otherwise make a cycle through C++ that the
/// garbage collector cannot see. Its fault blocks go too (they armed its plan).
void replace_executor(DeviceState &state, std::shared_ptr<LlvmRuntimeExecutor> fresh);

/// The device kiln.init made the process's current one, or nullptr (cpu, the default).
DeviceState *process_default_device();
void set_process_default_device(DeviceState *state);

/// Refuses what an OOM observer must not do: allocate or launch on the device whose allocation
/// is failing (DeviceMemory's contract; a launch would also re-enter the launcher's lock).
/// Errors: InvalidUsageError naming kiln.`site`.
void check_not_in_observer(const char *site);

/// Records an OOM observer added from Python to `state`'s executor (removed from it when the
/// executor is replaced), or forgets one removed by the user.
void remember_observer(DeviceState &state, uint64_t id);
void forget_observer(DeviceState &state, uint64_t id);

/// The device state whose executor is of `generation`, while it is; nullptr once configure (or
/// exit) replaced it, or for 0. Guarded by the GIL: valid until Python runs.
DeviceState *device_of_generation(uint64_t generation);
/// device_of_generation's executor, or nullptr.
LlvmRuntimeExecutor *executor_of_generation(uint64_t generation);

}  // namespace kiln::python
