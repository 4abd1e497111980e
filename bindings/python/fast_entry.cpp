// Fast entries (see fast_entry.h): exception translation as pybind11's dispatcher does it, and
// the builtins that replace the hot module functions and methods.
#include "fast_entry.h"

#include <cstddef>
#include <cstring>
#include <string>

namespace kiln::python {

namespace {

/// The method wrapper of a fast entry in a class: an instancemethod (`cls.name` is the function
/// itself; `a.name` binds `a` first) that is also a method descriptor (Py_TPFLAGS_METHOD_DESCRIPTOR),
/// so that the interpreter calls `a.name(...)` as `name(a, ...)` without making a bound method
/// object per call, and never checks the type of `a` (the function does: kiln's named error).
struct FastMethod {
  PyObject_HEAD
  PyObject *function;  // a strong reference
  vectorcallfunc vectorcall;
};

PyObject *fast_method_call(PyObject *self, PyObject *const *args, std::size_t nargsf, PyObject *kwnames) {
  return PyObject_Vectorcall(reinterpret_cast<FastMethod *>(self)->function, args, nargsf, kwnames);
}

PyObject *fast_method_get(PyObject *self, PyObject *obj, PyObject * /*type*/) {
  PyObject *function = reinterpret_cast<FastMethod *>(self)->function;
  if (obj == nullptr) return Py_NewRef(function);
  return PyMethod_New(function, obj);
}

/// __doc__, and any attribute the wrapper lacks (__name__, __qualname__, ...), are the
/// function's, as instancemethod's are.
PyObject *fast_method_getattro(PyObject *self, PyObject *name) {
  PyObject *function = reinterpret_cast<FastMethod *>(self)->function;
  if (PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "__doc__") == 0)
    return PyObject_GetAttr(function, name);
  PyObject *own = PyObject_GenericGetAttr(self, name);
  if (own != nullptr || !PyErr_ExceptionMatches(PyExc_AttributeError)) return own;
  PyErr_Clear();
  return PyObject_GetAttr(function, name);
}

void fast_method_dealloc(PyObject *self) {
  Py_XDECREF(reinterpret_cast<FastMethod *>(self)->function);
  PyObject_Free(self);
}

PyTypeObject g_fast_method_type = [] {
  PyTypeObject t{};
  Py_SET_REFCNT(&t, 1);  // a static type: never deallocated
  t.tp_name = "kiln._kiln.fast_method";
  t.tp_basicsize = sizeof(FastMethod);
  t.tp_dealloc = &fast_method_dealloc;
  t.tp_vectorcall_offset = offsetof(FastMethod, vectorcall);
  t.tp_call = &PyVectorcall_Call;
  t.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_METHOD_DESCRIPTOR | Py_TPFLAGS_HAVE_VECTORCALL;
  t.tp_descr_get = &fast_method_get;
  t.tp_getattro = &fast_method_getattro;
  return t;
}();

/// A new FastMethod wrapping `function`.
py::object new_fast_method(PyObject *function) {
  if (!(g_fast_method_type.tp_flags & Py_TPFLAGS_READY) && PyType_Ready(&g_fast_method_type) < 0)
    throw py::error_already_set();
  auto *method = PyObject_New(FastMethod, &g_fast_method_type);
  if (method == nullptr) throw py::error_already_set();
  method->function = Py_NewRef(function);
  method->vectorcall = &fast_method_call;
  return py::reinterpret_steal<py::object>(reinterpret_cast<PyObject *>(method));
}

}  // namespace

PyObject *install_fast_function(py::handle scope, const char *name, FastCall fast) {
  py::object slow = scope.attr(name);  // a class gives pybind11's method object (instancemethod)
  const py::object doc = slow.attr("__doc__");
  // The method table entry and its docstring live as long as the function: for the process.
  auto *def = new PyMethodDef{name, reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(fast)),
                              METH_FASTCALL | METH_KEYWORDS,
                              doc.is_none() ? nullptr : strdup(doc.cast<std::string>().c_str())};
  const bool is_class = PyType_Check(scope.ptr());
  const py::object module_name = scope.attr(is_class ? "__module__" : "__name__");
  auto fast_fn = py::reinterpret_steal<py::object>(
      PyCFunction_NewEx(def, is_class ? nullptr : scope.ptr(), module_name.ptr()));
  if (!fast_fn) throw py::error_already_set();
  if (is_class) fast_fn = new_fast_method(fast_fn.ptr());
  scope.attr(name) = fast_fn;
  return slow.release().ptr();
}

}  // namespace kiln::python
