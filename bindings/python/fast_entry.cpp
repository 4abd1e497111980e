// Fast entries (see fast_entry.h): exception translation as pybind11's dispatcher does it, the
// builtins that replace the hot module functions, and kiln.ndarray's tp_init.
#include "fast_entry.h"

#include <cstring>
#include <memory>
#include <string>

#include "ndarray.h"

namespace kiln::python {

void translate_active_exception() {
  if (py::detail::apply_exception_translators(
          py::detail::get_local_internals().registered_exception_translators))
    return;
  if (py::detail::apply_exception_translators(py::detail::get_internals().registered_exception_translators))
    return;
  PyErr_SetString(PyExc_SystemError, "Exception escaped from default exception translator!");
}

PyObject *install_fast_function(py::handle scope, const char *name, FastCall fast) {
  py::object slow = scope.attr(name);  // a class gives its method's function
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
  if (is_class) {
    fast_fn = py::reinterpret_steal<py::object>(PyInstanceMethod_New(fast_fn.ptr()));
    if (!fast_fn) throw py::error_already_set();
  }
  scope.attr(name) = fast_fn;
  return slow.release().ptr();
}

namespace {

const py::detail::type_info *g_ndarray_info = nullptr;
initproc g_pybind11_init = nullptr;  // the tp_init pybind11's __init__ gave kiln.ndarray

/// kiln.ndarray's tp_init: (dtype, shape) positional on a fresh kiln.ndarray here, as
/// pybind11's factory __init__ does it (the value, then init_instance makes the holder and
/// registers the instance); anything else (keywords, another count, a subclass, a second
/// __init__ on a constructed array) by pybind11's __init__.
int fast_ndarray_init(PyObject *self, PyObject *args, PyObject *kwargs) {
  if (kwargs != nullptr || !PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != 2 ||
      Py_TYPE(self) != g_ndarray_info->type)
    return g_pybind11_init(self, args, kwargs);
  auto *inst = reinterpret_cast<py::detail::instance *>(self);
  py::detail::value_and_holder v_h = inst->get_value_and_holder(g_ndarray_info);
  if (v_h.instance_registered() || v_h.value_ptr() != nullptr) return g_pybind11_init(self, args, kwargs);
  PyObject *done = run_guarded([&] {
    auto array = std::make_unique<PyArray>(make_ndarray(PyTuple_GET_ITEM(args, 0), PyTuple_GET_ITEM(args, 1)));
    v_h.value_ptr() = array.get();
    try {
      g_ndarray_info->init_instance(inst, nullptr);  // the holder takes the value
    } catch (...) {
      v_h.value_ptr() = nullptr;  // never half-made: the array is destroyed here, its memory freed
      throw;
    }
    array.release();
    Py_RETURN_NONE;
  });
  if (done == nullptr) return -1;
  Py_DECREF(done);
  return 0;
}

}  // namespace

void install_fast_ndarray_init(py::handle cls, const py::detail::type_info *info) {
  auto *type = reinterpret_cast<PyTypeObject *>(cls.ptr());
  g_ndarray_info = info;
  g_pybind11_init = type->tp_init;
  type->tp_init = &fast_ndarray_init;
}

}  // namespace kiln::python
