// kiln.ndarray's class machinery below pybind11: how `kiln.ndarray(dtype, shape)` makes an
// instance and how the instance goes.
//
// The common call, two positional arguments on the exact class, runs the class's own vectorcall
// (PEP 590; its metaclass turns the protocol on): the instance is made in pybind11's simple
// layout and the array built into it (make_ndarray) without an argument tuple, pybind11's
// metaclass __call__, its lookup of the class's C++ types, or its table of registered instances
// (kiln never returns a PyArray by pointer or reference, which is all the table is for). Such an
// instance goes through the class's own tp_dealloc, as pybind11's dealloc would destroy it.
// Every other call (keywords, another count, a subclass, a replaced __new__ or __init__) and
// every other instance (registered, weakly referenced, a subclass's) is pybind11's, unchanged.
//
// Threading: called by the interpreter with the GIL held; installed once, at import.
#pragma once

#include <pybind11/pybind11.h>

#include <cstddef>

namespace kiln::python {

namespace py = pybind11;

/// kiln.ndarray's metaclass, `kiln._kiln.ndarray_type` (not a module attribute): pybind11's
/// metaclass with the vectorcall protocol on, so that calling the class runs its tp_vectorcall;
/// immutable (its __call__ cannot be replaced behind the vectorcall's back), subclassable as
/// pybind11's is. Every other kiln class keeps pybind11's metaclass. Throws
/// py::error_already_set if Python cannot make it.
py::object ndarray_metaclass();

/// Gives kiln.ndarray (`cls`, made with ndarray_metaclass(); `info`, pybind11's type_info of
/// PyArray) its tp_vectorcall, tp_init and tp_dealloc (see the top of this file), and replaces its
/// `__init__` attribute so that a second `__init__` of an array made this way is ignored, as
/// pybind11 ignores one on an instance it made. Call after the class's last __init__ overload is
/// defined (defining __init__ resets tp_init).
void install_ndarray_type(py::handle cls, const py::detail::type_info *info);

/// How many instances pybind11's table of registered instances holds (tests: kiln.ndarray's
/// tp_dealloc must leave pybind11 every instance pybind11 registered).
std::size_t registered_instances();

}  // namespace kiln::python
