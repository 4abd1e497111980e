// kiln.ndarray's type: a plain CPython heap type that kiln owns, as numpy owns ndarray and
// PyTorch owns Tensor. Its instance holds one PyArray in place (no pybind11 instance, holder or
// table of registered instances). The array is made by tp_new, whole or not at all: there is no
// instance without an array (no __init__ to skip, nothing to initialize twice). Calling the
// class with (dtype, shape) positional, device= the one keyword allowed, runs its vectorcall
// (PEP 590) without an argument tuple; every other call parses its arguments here too. Methods
// and properties are pybind11 functions set on the type (def_method, def_property), which takes
// no new attributes once made (immutable, as numpy's ndarray). Subclasses are allowed; their
// instances are arrays the same way.
//
// Threading: called by the interpreter with the GIL held; made once, at import.
#pragma once

#include <pybind11/pybind11.h>

#include <utility>

#include "ndarray.h"

namespace kiln::python {

namespace py = pybind11;

/// Makes the type kiln.ndarray (`kiln._kiln.ndarray`, unmodifiable attributes added later by
/// def_method/def_property until finish_ndarray_type) with its buffer protocol. Once, at import.
/// Throws py::error_already_set if Python cannot make it.
py::object make_ndarray_type(const char *docstring);

/// Makes kiln.ndarray immutable (no attribute set or replaced from Python). Call after the last
/// def_method/def_property.
void finish_ndarray_type(py::handle type);

/// kiln.ndarray (the type), once made; nullptr before.
PyTypeObject *ndarray_type();

/// Whether `value` is a kiln.ndarray (or a subclass's instance): every such object holds an array.
inline bool is_ndarray(py::handle value) {
  PyTypeObject *type = ndarray_type();
  return Py_TYPE(value.ptr()) == type || PyType_IsSubtype(Py_TYPE(value.ptr()), type);
}

/// The PyArray inside `value`, a kiln.ndarray (is_ndarray; not checked).
PyArray &array_in(py::handle value);

/// A new kiln.ndarray (an instance of `type`, kiln.ndarray or a subclass) holding array `a`
/// made by `made_by` on device `state` (PyArray's constructor). Errors: HostOutOfMemoryError when
/// Python cannot allocate the object (`a` is then released).
py::object wrap_array(Ndarray a, DeviceState &state, const LlvmRuntimeExecutor &made_by,
                      PyTypeObject *type = nullptr);

/// Sets method `name` of `cls` (a kiln type) to a pybind11 function of `fn` (taking self first)
/// with `extra` (doc, arguments, guarded()), as pybind11's class_::def does; a second
/// def_method of the same name adds an overload.
template <class Fn, class... Extra>
void def_method(py::handle cls, const char *name, Fn &&fn, const Extra &...extra) {
  py::cpp_function method(std::forward<Fn>(fn), py::name(name), py::is_method(cls),
                          py::sibling(py::getattr(cls, name, py::none())), extra...);
  py::setattr(cls, name, method);
}

/// Sets read-only property `name` of `cls` to Python's property of a pybind11 getter `fn`
/// (taking self), with docstring `docstring` and `extra` (guarded()).
template <class Fn, class... Extra>
void def_property(py::handle cls, const char *name, Fn &&fn, const char *docstring, const Extra &...extra) {
  py::cpp_function getter(std::forward<Fn>(fn), py::is_method(cls), extra...);
  py::setattr(cls, name,
              py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject *>(&PyProperty_Type))(
                  getter, py::none(), py::none(), docstring));
}

}  // namespace kiln::python
