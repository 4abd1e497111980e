// kiln.ndarray's type (see ndarray_type.h): its instance layout, tp_new and vectorcall,
// tp_dealloc, and the objects that wrap a new array.
#include "ndarray_type.h"

#include <structmember.h>  // PyMemberDef; T_PYSSIZET and READONLY before Python 3.12

#include <cstddef>
#include <new>
#include <utility>

#include "error_mapping.h"
#include "fast_entry.h"
#include "signatures.h"

#ifndef Py_T_PYSSIZET  // the names Python 3.12 gave them
#define Py_T_PYSSIZET T_PYSSIZET
#define Py_READONLY READONLY
#endif

namespace kiln::python {

namespace {

/// A kiln.ndarray: the object header, its weak references, and its array, constructed by
/// wrap_array before the object is handed out and destroyed by ndarray_dealloc.
struct NdarrayObject {
  PyObject_HEAD
  PyObject *weakrefs;
  PyArray array;
};

PyTypeObject *g_ndarray_type = nullptr;  // kiln.ndarray (never released)

constexpr const char *kParameters = "(dtype, shape, *, device=None)";

/// The arguments of kiln.ndarray(dtype, shape, *, device=None).
struct NewArguments {
  PyObject *dtype = nullptr;
  PyObject *shape = nullptr;
  PyObject *device = nullptr;  // None when not given
};

/// Raises InvalidTypeError for a call of kiln.ndarray whose arguments (`nargs` positional in
/// `args`, then the values of `kwnames`) match no signature.
[[noreturn]] void raise_mismatch(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  py::tuple positional(nargs);
  for (Py_ssize_t i = 0; i < nargs; ++i) positional[i] = py::reinterpret_borrow<py::object>(args[i]);
  py::kwargs keywords;
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; ++i)
    keywords[py::handle(PyTuple_GET_ITEM(kwnames, i))] = py::handle(args[nargs + i]);
  raise_signature_mismatch("ndarray", kParameters, py::args(positional), keywords);
}

/// Puts `value` in the slot of keyword `name`; false when `name` is not one of ndarray's
/// keywords or its slot is taken (the call matches no signature).
bool take_keyword(NewArguments &parsed, PyObject *name, PyObject *value) {
  if (!PyUnicode_Check(name)) return false;
  PyObject **slot = nullptr;
  if (PyUnicode_CompareWithASCIIString(name, "dtype") == 0) slot = &parsed.dtype;
  else if (PyUnicode_CompareWithASCIIString(name, "shape") == 0) slot = &parsed.shape;
  else if (PyUnicode_CompareWithASCIIString(name, "device") == 0) slot = &parsed.device;
  if (slot == nullptr || *slot != nullptr) return false;
  *slot = value;
  return true;
}

/// The arguments of a call of kiln.ndarray in the vectorcall convention (`nargs` positional in
/// `args`, then the values of `kwnames`). Errors: InvalidTypeError when they match no signature.
NewArguments parse_arguments(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  NewArguments parsed;
  if (nargs > 2) raise_mismatch(args, nargs, kwnames);
  if (nargs > 0) parsed.dtype = args[0];
  if (nargs > 1) parsed.shape = args[1];
  const Py_ssize_t nkw = kwnames != nullptr ? PyTuple_GET_SIZE(kwnames) : 0;
  for (Py_ssize_t i = 0; i < nkw; ++i)
    if (!take_keyword(parsed, PyTuple_GET_ITEM(kwnames, i), args[nargs + i])) raise_mismatch(args, nargs, kwnames);
  if (parsed.dtype == nullptr || parsed.shape == nullptr) raise_mismatch(args, nargs, kwnames);
  if (parsed.device == nullptr) parsed.device = Py_None;
  return parsed;
}

/// A new instance of `type` (kiln.ndarray or a subclass) holding a new array: the call
/// kiln.ndarray(dtype, shape, *, device=None) in the vectorcall convention; nullptr with the
/// Python error set (kiln's named error) when its arguments are refused or the array cannot be
/// made.
PyObject *new_array(PyTypeObject *type, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
  return run_guarded([&] {
    const NewArguments parsed = parse_arguments(args, nargs, kwnames);
    return make_ndarray(parsed.dtype, parsed.shape, parsed.device, type).release().ptr();
  });
}

/// kiln.ndarray's tp_new (a subclass's construction, kiln.ndarray.__new__): its tuple and dict
/// into the vectorcall convention, then new_array.
PyObject *ndarray_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  const Py_ssize_t nkw = kwargs != nullptr ? PyDict_GET_SIZE(kwargs) : 0;
  if (nargs + nkw > 3)  // more than ndarray takes
    return run_guarded([&]() -> PyObject * {
      raise_signature_mismatch("ndarray", kParameters, py::reinterpret_borrow<py::args>(args),
                               kwargs != nullptr ? py::reinterpret_borrow<py::kwargs>(kwargs) : py::kwargs());
    });
  PyObject *vector[3];
  for (Py_ssize_t i = 0; i < nargs; ++i) vector[i] = PyTuple_GET_ITEM(args, i);
  auto kwnames = py::reinterpret_steal<py::object>(PyTuple_New(nkw));
  if (!kwnames) return nullptr;
  Py_ssize_t pos = 0;
  PyObject *name = nullptr;
  PyObject *value = nullptr;
  for (Py_ssize_t i = 0; kwargs != nullptr && PyDict_Next(kwargs, &pos, &name, &value); ++i) {
    PyTuple_SET_ITEM(kwnames.ptr(), i, Py_NewRef(name));
    vector[nargs + i] = value;
  }
  return new_array(type, vector, nargs, nkw != 0 ? kwnames.ptr() : nullptr);
}

/// kiln.ndarray's vectorcall (calling the class itself, without an argument tuple; never
/// inherited by a subclass, whose calls go through tp_new and its own __init__).
PyObject *ndarray_vectorcall(PyObject *callable, PyObject *const *args, std::size_t nargsf, PyObject *kwnames) {
  return new_array(reinterpret_cast<PyTypeObject *>(callable), args, PyVectorcall_NARGS(nargsf), kwnames);
}

/// kiln.ndarray's tp_dealloc: its weak references, its array (whose release may run Python: a
/// DLPack producer's deleter), then the object.
void ndarray_dealloc(PyObject *self) {
  PyTypeObject *type = Py_TYPE(self);
  auto *object = reinterpret_cast<NdarrayObject *>(self);
  if (object->weakrefs != nullptr) PyObject_ClearWeakRefs(self);
  {
    const py::error_scope pending;  // the array's release may run Python
    object->array.~PyArray();
  }
  type->tp_free(self);
  Py_DECREF(type);  // a heap type's instance holds a reference to it
}

}  // namespace

PyTypeObject *ndarray_type() { return g_ndarray_type; }

PyArray &array_in(py::handle value) { return reinterpret_cast<NdarrayObject *>(value.ptr())->array; }

py::object wrap_array(Ndarray a, DeviceState &state, const LlvmRuntimeExecutor &made_by, PyTypeObject *type) {
  if (type == nullptr) type = g_ndarray_type;
  PyObject *self = type->tp_alloc(type, 0);
  if (self == nullptr) {
    PyErr_Clear();
    throw std::bad_alloc();  // HostOutOfMemoryError, through the one mapping
  }
  auto *object = reinterpret_cast<NdarrayObject *>(self);
  object->weakrefs = nullptr;
  new (&object->array) PyArray(std::move(a), state, made_by);  // throws nothing
  return py::reinterpret_steal<py::object>(self);
}

py::object make_ndarray_type(const char *docstring) {
  static PyMemberDef members[] = {
      {"__weaklistoffset__", Py_T_PYSSIZET, offsetof(NdarrayObject, weakrefs), Py_READONLY, nullptr},
      {nullptr, 0, 0, 0, nullptr}};
  PyType_Slot slots[] = {{Py_tp_new, reinterpret_cast<void *>(&ndarray_new)},
                         {Py_tp_dealloc, reinterpret_cast<void *>(&ndarray_dealloc)},
                         {Py_tp_doc, const_cast<char *>(docstring)},
                         {Py_tp_members, members},
                         {Py_bf_getbuffer, reinterpret_cast<void *>(&ndarray_getbuffer)},
                         {Py_bf_releasebuffer, reinterpret_cast<void *>(&ndarray_releasebuffer)},
                         {0, nullptr}};
  PyType_Spec spec{"kiln._kiln.ndarray", static_cast<int>(sizeof(NdarrayObject)), 0,
                   Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE, slots};
  auto type = py::reinterpret_steal<py::object>(PyType_FromSpec(&spec));
  if (!type) throw py::error_already_set();
  g_ndarray_type = reinterpret_cast<PyTypeObject *>(type.inc_ref().ptr());  // for the process
  // Calling the class runs this (type's own tp_call otherwise); a subclass does not inherit it.
  g_ndarray_type->tp_vectorcall = &ndarray_vectorcall;
  return type;
}

void finish_ndarray_type(py::handle type) {
  auto *t = reinterpret_cast<PyTypeObject *>(type.ptr());
  t->tp_flags |= Py_TPFLAGS_IMMUTABLETYPE;
  PyType_Modified(t);
}

}  // namespace kiln::python
