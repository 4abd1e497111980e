// kiln.ndarray: PyArray (the one Ndarray handle of a Python array), as_array and the operand
// checks every operation starts with, the busy marks that keep an array from being freed while a
// launch uses it without the GIL, and launch().
//
// Threading: a PyArray is touched with the GIL held, except its busy count, which BusyScope
// changes under a mutex (a thread unwinding at exit may drop its marks without the GIL); launch()
// runs the executor call with the GIL released (without_gil). Errors are raised through
// error_mapping.h.
#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "executor_state.h"
#include "kiln/executor/executor.h"
#include "kiln/executor/launcher.h"

namespace kiln::python {

namespace py = pybind11;

/// The bytes of every kiln.ndarray alive and not freed, over every executor (an array outlives
/// the executor kiln.init replaced): what kiln.testing's leak check reads when the executor it
/// measured is gone. One per PyArray: counted at construction, given back once by release()
/// (free) or the destructor; a move hands its count over. Changed with the GIL held
/// (add_with_gil), read atomically.
class LiveArrayBytes {
 public:
  explicit LiveArrayBytes(uint64_t bytes);
  LiveArrayBytes(LiveArrayBytes &&other) noexcept;
  LiveArrayBytes &operator=(LiveArrayBytes &&other) noexcept;
  LiveArrayBytes(const LiveArrayBytes &) = delete;
  LiveArrayBytes &operator=(const LiveArrayBytes &) = delete;
  ~LiveArrayBytes() { release(); }
  /// Gives this array's bytes back (once; later calls do nothing).
  void release();
  /// The bytes of all arrays alive and not freed, in the process.
  [[nodiscard]] static uint64_t total();

 private:
  uint64_t bytes_;
};

/// A kiln.ndarray: one Ndarray handle (the only one), its device and the generation of the
/// executor that made it (arrays never keep an executor alive, only its device's memory), and the
/// state of views and running launches.
struct PyArray {
  Ndarray array;
  DeviceState *state;  // its device (never destroyed)
  // The generation of the executor that made it (executor_of_generation): once configure replaced
  // that executor the array can only be freed.
  uint64_t executor_generation = 0;
  DataType dtype;
  std::vector<int64_t> dropped_shape;  // the shape, kept once free() dropped the handle
  uint64_t nbytes = 0;
  uint64_t size = 0;
  int busy = 0;          // launches using it with the GIL released
  int exports = 0;       // live exports: buffer views (memoryview, np.asarray) and DLPack capsules
  bool dropped = false;  // freed after its executor was replaced (handle released)
  // Its raw pointer went out through __cuda_array_interface__ (no release hook): free() refuses
  // for good, and the memory goes back only when the array is garbage-collected (the consumers
  // hold a reference to it, as the interface's specification requires).
  bool pointer_shared = false;
  // For the buffer protocol (strides in bytes), filled by the first view (view_layout()).
  std::vector<Py_ssize_t> view_shape, view_strides;
  LiveArrayBytes live;  // released when freed

  /// An array `made_by` made on device `state`: its generation is the state's while `made_by` is
  /// the state's executor, else 0 (made on an executor configure replaced meanwhile, while a
  /// borrow kept it: the array can only be freed).
  PyArray(Ndarray a, DeviceState &state, const LlvmRuntimeExecutor &made_by);

  /// Its device's name ("cuda:1"), for messages and errors.
  [[nodiscard]] const std::string &device_name() const { return state->key; }
  [[nodiscard]] bool is_freed() const { return dropped || array.is_freed(); }
  /// The dimensions: the handle's (an array's creation copies none), kept once it is dropped.
  [[nodiscard]] const std::vector<int64_t> &shape() const {
    return dropped ? dropped_shape : array.shape();
  }
  /// "f32[2, 3]", for messages (formatted when asked: an array's creation formats nothing).
  [[nodiscard]] std::string description() const { return describe_array(dtype, shape()); }
  /// Fills view_shape and view_strides once; the views point into them while the array lives.
  void view_layout();
  /// The handle, or InvalidUsageError when it was dropped by free().
  const Ndarray &get(const char *site) const;
};

/// Marks arrays busy while a launch runs without the GIL.
/// At most kMaxArrays arrays (an operation's operands, a user kernel's array arguments), held
/// without a heap allocation.
class BusyScope {
 public:
  static constexpr std::size_t kMaxArrays = 16;  // KILN_MAX_USER_PARAMS
  explicit BusyScope(std::initializer_list<PyArray *> arrays)
      : BusyScope(std::span<PyArray *const>(arrays.begin(), arrays.size())) {}
  explicit BusyScope(std::span<PyArray *const> arrays);
  ~BusyScope();
  BusyScope(const BusyScope &) = delete;
  BusyScope &operator=(const BusyScope &) = delete;

 private:
  std::array<PyArray *, kMaxArrays> arrays_{};
  std::size_t count_ = 0;
};

/// Runs `fn` (a call into the executor) with the GIL released and `arrays` marked busy.
template <class Fn>
auto launch(std::initializer_list<PyArray *> arrays, Fn &&fn) {
  BusyScope busy(arrays);
  return without_gil(std::forward<Fn>(fn));
}

/// The most elements of a launch that launch_small runs with the GIL held: 16,384 (64 KiB of
/// f32), a few microseconds of work at most, far below the interpreter's 5 ms switch interval.
/// (numpy keeps the GIL for its small loops too, below 500 elements.)
inline constexpr uint64_t kLaunchWithGilMaxElements = uint64_t{1} << 14;
static_assert(kLaunchWithGilMaxElements <= static_cast<uint64_t>(kDefaultMinElementsPerTask),
              "launch_small's launches must run as one task on the calling thread");

/// Runs `fn` as launch() does, except a launch of at most kLaunchWithGilMaxElements elements on a
/// host-code device (cpu, mock: one task, on this thread) while no other thread is inside
/// without_gil: that one runs with the GIL held and without busy marks (no other thread runs
/// Python meanwhile, so none can free an operand), because releasing and re-taking the GIL
/// cost about as much as such a launch. Only for a launch that allocates nothing and calls no
/// Python: every operand a kiln array (fill, copy, axpy, reduce_sum), no staging, so no OOM
/// observer. Deadlock-free: a thread waits for the GIL while holding a kiln lock (the launcher's,
/// in an OOM observer of a launch's staging) only inside without_gil, which the count shows.
template <class Fn>
auto launch_small(const LlvmRuntimeExecutor &ex, uint64_t num_elements,
                  std::initializer_list<PyArray *> arrays, Fn &&fn) {
  if (num_elements <= kLaunchWithGilMaxElements && codegen_arch(ex.device()) == CodegenArch::host &&
      g_calls_without_gil.load(std::memory_order_acquire) == 0)
    return fn();
  return launch(arrays, std::forward<Fn>(fn));
}

/// kiln.ndarray(dtype, shape, device=device): a new instance of `type` (kiln.ndarray, or a
/// subclass) holding a new array. Errors: those of to_dtype, to_shape, device_argument and
/// LlvmRuntimeExecutor::ndarray; InvalidUsageError inside an OOM observer.
py::object make_ndarray(py::handle dtype, py::handle shape, py::handle device, PyTypeObject *type);

/// The PyArray of `value`, or nullptr when it is not a kiln.ndarray. Raises nothing.
PyArray *array_or_null(py::handle value);

/// `value` as a kiln.ndarray of `site`'s argument `name`. Errors: InvalidTypeError when it is
/// not one (a numpy array, a list, ...). Every binding reaches a PyArray through here.
PyArray &as_array(py::handle value, const char *site, const char *name);

/// The first array argument of an operation and its handle.
struct Operand {
  PyArray &py;
  const Ndarray &array;
};

/// The first array argument `name` of operation `site`, checked in the order every operation
/// checks it: the call is refused inside an OOM observer (check_not_in_observer), then as_array,
/// then PyArray::get. Errors: those three's.
Operand first_operand(py::handle value, const char *site, const char *name);

/// The first two array arguments `name_a`, `name_b` of operation `site`, checked as
/// first_operand checks one, both types before either handle: check_not_in_observer,
/// as_array(a), as_array(b), then their PyArray::get. Errors: those's.
std::pair<Operand, Operand> first_operands(py::handle a, py::handle b, const char *site,
                                           const char *name_a, const char *name_b);

/// An array argument of an operation and the name the operation gives it ("x").
struct NamedOperand {
  const char *name;
  const PyArray *array;
};

/// The executor of the device all of `operands` (at least one) live on, for operation `site`.
/// Errors: InvalidUsageError naming the operation and each argument's name, dtype, shape and
/// device when they are on different devices (raise_mixed_devices), checked before anything is
/// allocated; those of executor_of.
std::shared_ptr<LlvmRuntimeExecutor> executor_for(const char *site, std::initializer_list<NamedOperand> operands);
std::shared_ptr<LlvmRuntimeExecutor> executor_for(const char *site, std::span<const NamedOperand> operands);
/// Raises the InvalidUsageError of arrays on different devices: "axpy: its arrays are on
/// different devices: x f32[3] on cuda:0, y f32[3] on cuda:1; ...".
[[noreturn]] void raise_mixed_devices(const char *site, std::span<const NamedOperand> operands);

/// The buffer protocol of kiln.ndarray (buffer_protocol.cpp), its type's bf_getbuffer and
/// bf_releasebuffer: views count as exports.
int ndarray_getbuffer(PyObject *self, Py_buffer *view, int flags);
void ndarray_releasebuffer(PyObject *self, Py_buffer *view);

}  // namespace kiln::python
