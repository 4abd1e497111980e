// Fast entries: CPython entry points for the hottest calls (kiln.fill, copy, axpy, reduce_sum,
// ndarray.free) in their common form, every argument positional and none missing, that skip
// pybind11's dispatcher (its argument and conversion vectors, overload loop and keyword
// matching, about 1,300 instructions per call: callgrind, bench/python_overhead.py). Every other
// call (keywords, too many or too few arguments) goes to the pybind11 function unchanged, so
// signatures, docstrings, keyword names and the InvalidTypeError of a mismatch are one set.
//
// A fast entry runs its C++ function as pybind11 runs it: inside CallGuard, a py::error_already_set
// restored, any other C++ exception as pybind11's translators would (translate_active_exception,
// error_mapping.h). Threading: called by the interpreter with the GIL held; installed once, at import.
#pragma once

#include <pybind11/pybind11.h>

#include <cxxabi.h>

#include <cstddef>
#include <type_traits>
#include <utility>

#include "error_mapping.h"
#include "executor_state.h"

namespace kiln::python {

namespace py = pybind11;

/// Runs `fn` (returns a new reference) inside CallGuard; nullptr with the Python error set when
/// it throws, as pybind11's dispatcher reports it.
template <class Fn>
PyObject *run_guarded(Fn &&fn) {
  try {
    CallGuard guard;
    return fn();
  } catch (py::error_already_set &e) {
    e.restore();
    return nullptr;
  } catch (abi::__forced_unwind &) {
    throw;  // the thread is ending (interpreter exit): no Python error to set
  } catch (...) {
    translate_active_exception();
    return nullptr;
  }
}

/// The C signature of a fast entry (METH_FASTCALL | METH_KEYWORDS).
using FastCall = PyObject *(*)(PyObject *, PyObject *const *, Py_ssize_t, PyObject *);

/// Replaces function `name` of `scope` (a pybind11 function of a module, or a method of a
/// pybind11 class) by a builtin with the same name, __module__ and __doc__ that calls `fast`; a
/// method is wrapped as an instancemethod that is also a method descriptor (`a.name(...)` passes
/// `a` first without making a bound method, `cls.name(x, ...)` passes x, whatever it is).
/// Returns the pybind11 function, kept alive for the process (the fast entry's fallback).
PyObject *install_fast_function(py::handle scope, const char *name, FastCall fast);

/// The fast entry of `Fn`, a C++ function of N py::handle arguments (a method's first is self)
/// returning void (None) or a py::object: called with exactly N positional arguments it runs Fn
/// itself; anything else goes to the pybind11 function it replaced.
template <auto Fn, std::size_t N>
class FastFunction {
 public:
  /// Replaces `scope`.`name` (a module's function or a class's method, already defined with
  /// pybind11) by the fast entry. Once, at import.
  static void install(py::handle scope, const char *name) {
    slow_ = install_fast_function(scope, name, &call);
  }

 private:
  static PyObject *call(PyObject * /*module*/, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames) {
    if (kwnames != nullptr || nargs != static_cast<Py_ssize_t>(N))
      return PyObject_Vectorcall(slow_, args, static_cast<std::size_t>(nargs), kwnames);
    return run_guarded([args] { return invoke(args, std::make_index_sequence<N>{}); });
  }

  template <std::size_t... I>
  static PyObject *invoke(PyObject *const *args, std::index_sequence<I...>) {
    if constexpr (std::is_void_v<decltype(Fn(py::handle(args[I])...))>) {
      Fn(py::handle(args[I])...);
      Py_RETURN_NONE;
    } else {
      return py::object(Fn(py::handle(args[I])...)).release().ptr();
    }
  }

  static inline PyObject *slow_ = nullptr;  // the pybind11 function (never released)
};

}  // namespace kiln::python
