// kiln.ndarray's class machinery (see ndarray_type.h): the vectorcall, tp_init and tp_dealloc of
// the class, its metaclass, and its `__init__` attribute.
#include "ndarray_type.h"

#include <structmember.h>  // PyMemberDef; T_PYSSIZET and READONLY before Python 3.12

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

#include "conversions.h"
#include "armed_exception.h"
#include "error_mapping.h"
#include "fast_entry.h"
#include "ndarray.h"

#ifndef Py_T_PYSSIZET  // the names Python 3.12 gave them
#define Py_T_PYSSIZET T_PYSSIZET
#define Py_READONLY READONLY
#endif

namespace kiln::python {

namespace {

const py::detail::type_info *g_ndarray_info = nullptr;
PyObject *g_pybind11_init_function = nullptr;  // pybind11's __init__ (never released)

/// True for an array construct_array made: constructed, but not in pybind11's table of
/// registered instances (a hash-map node made and erased per array: a sixth of an allocation's
/// cost; the table only maps C++ pointers back to their Python objects, for returning a PyArray
/// by pointer or reference, which kiln never does, and pybind11's dealloc deregisters only what
/// was registered).
bool made_unregistered(const py::detail::value_and_holder &v_h) {
  return v_h.holder_constructed() && !v_h.instance_registered();
}

/// The kiln.ndarrays whose __init__ is running now, on any thread (guarded by the GIL). An
/// __init__ runs Python before its array exists (its arguments' __index__; an OOM observer, with
/// the GIL released so that other threads run): a second __init__ of the same instance meanwhile
/// would construct a second value that the first then overwrites (a leaked array, and pybind11's
/// dealloc ends the process over the instance it registered and lost).
std::vector<PyObject *> g_initializing;

/// Marks `self` as being initialized while it lives. When `self` already is (a second __init__,
/// from this thread or another), or the mark cannot be recorded, entered() is false and the
/// Python error is set: InvalidUsageError (or MemoryError).
class InitScope {
 public:
  explicit InitScope(PyObject *self) : self_(self) {
    if (std::find(g_initializing.begin(), g_initializing.end(), self) != g_initializing.end()) {
      (void)run_guarded([]() -> PyObject * {
        raise_invalid_usage("kiln", "__init__",
                            "__init__: another __init__ of this kiln.ndarray is still running (on "
                            "another thread inside an OOM observer, or in the conversion of its "
                            "own arguments); an array is made once");
      });
      return;
    }
    try {
      throw_if_armed(ArmedSite::ndarray_init);
      g_initializing.push_back(self);
      entered_ = true;
    } catch (const std::bad_alloc &) {
      translate_active_exception();  // HostOutOfMemoryError, as every bad_alloc
    }
  }
  ~InitScope() {
    if (entered_) std::erase(g_initializing, self_);
  }
  InitScope(const InitScope &) = delete;
  InitScope &operator=(const InitScope &) = delete;
  [[nodiscard]] bool entered() const { return entered_; }

 private:
  PyObject *self_;
  bool entered_ = false;
};

/// pybind11's __init__ of `self` with `args` and `kwargs` (tp_init's arguments), called directly:
/// not through the class's `__init__` attribute, which would see this __init__ as a second one.
int call_pybind11_init(PyObject *self, PyObject *args, PyObject *kwargs) {
  const Py_ssize_t nargs = PyTuple_GET_SIZE(args);
  auto with_self = py::reinterpret_steal<py::object>(PyTuple_New(nargs + 1));
  if (!with_self) return -1;
  PyTuple_SET_ITEM(with_self.ptr(), 0, Py_NewRef(self));
  for (Py_ssize_t i = 0; i < nargs; ++i)
    PyTuple_SET_ITEM(with_self.ptr(), i + 1, Py_NewRef(PyTuple_GET_ITEM(args, i)));
  auto result = py::reinterpret_steal<py::object>(PyObject_Call(g_pybind11_init_function, with_self.ptr(), kwargs));
  return result ? 0 : -1;
}

/// kiln.ndarray.__init__ as an attribute (`a.__init__(...)`, `kiln.ndarray.__init__(a, ...)`):
/// a second __init__ of an array construct_array made is ignored, whatever its arguments, as
/// pybind11's dispatcher ignores one on an instance it registered (it recognizes those by their
/// registration); every other call goes to pybind11's __init__.
/// Without an array first (`kiln.ndarray.__init__()`, `kiln.ndarray.__init__(3, ...)`) it raises
/// InvalidTypeError, as the other methods do, where pybind11 raises a plain TypeError.
PyObject *ndarray_init_attribute(PyObject * /*unused*/, PyObject *const *args, Py_ssize_t nargs,
                                 PyObject *kwnames) {
  if (nargs == 0 || !PyObject_TypeCheck(args[0], g_ndarray_info->type))
    return run_guarded([&]() -> PyObject * {
      raise_invalid_type("__init__", fmt::format("__init__: self must be a kiln.ndarray, got {} "
                                                 "(make arrays with kiln.ndarray(dtype, shape))",
                                                 nargs == 0 ? "no argument" : type_name(args[0])));
    });
  auto *inst = reinterpret_cast<py::detail::instance *>(args[0]);
  if (made_unregistered(inst->get_value_and_holder(g_ndarray_info))) Py_RETURN_NONE;
  const InitScope scope(args[0]);
  if (!scope.entered()) return nullptr;
  return PyObject_Vectorcall(g_pybind11_init_function, args, static_cast<std::size_t>(nargs), kwnames);
}

/// True for an instance tp_new just made: no value, no holder, not registered.
bool is_fresh(const py::detail::value_and_holder &v_h) {
  return !v_h.instance_registered() && !v_h.holder_constructed() && v_h.value_ptr() == nullptr;
}

/// Makes the array of (dtype, shape) into `self`, a fresh kiln.ndarray (is_fresh), as pybind11's
/// factory __init__ does it but unregistered (made_unregistered). 0, or -1 with the Python error
/// set (kiln's named error; `self` keeps no value).
static_assert(std::is_same_v<py::class_<PyArray>::holder_type, std::unique_ptr<PyArray>>,
              "construct_array constructs kiln.ndarray's holder itself");
int construct_array(py::detail::value_and_holder &v_h, PyObject *dtype, PyObject *shape,
                    PyObject *device = Py_None) {
  PyObject *done = run_guarded([&] {
    std::unique_ptr<PyArray> array = make_ndarray(dtype, shape, py::handle(device));
    if (!is_fresh(v_h))  // InitScope refuses a second __init__: this never happens
      raise_invalid_usage("kiln", "__init__", "__init__: the kiln.ndarray was made meanwhile");
    // The holder takes the value, as pybind11's init_holder does (nothing here throws).
    v_h.value_ptr() = array.get();
    new (std::addressof(v_h.holder<std::unique_ptr<PyArray>>())) std::unique_ptr<PyArray>(std::move(array));
    v_h.set_holder_constructed();
    Py_RETURN_NONE;
  });
  if (done == nullptr) return -1;
  Py_DECREF(done);
  return 0;
}

/// kiln.ndarray's tp_init (what `kiln.ndarray(...)` runs when ndarray_vectorcall hands the call
/// on): (dtype, shape) positional on a fresh kiln.ndarray here (construct_array); a second
/// __init__ of an array construct_array made is ignored; anything else (keywords, another count,
/// a subclass) by pybind11's __init__, called directly. One __init__ per instance at a time
/// (InitScope).
int fast_ndarray_init(PyObject *self, PyObject *args, PyObject *kwargs) {
  auto *inst = reinterpret_cast<py::detail::instance *>(self);
  const InitScope scope(self);  // a replaced __new__ may hand out an instance being initialized
  if (!scope.entered()) return -1;
  py::detail::value_and_holder v_h = inst->get_value_and_holder(g_ndarray_info);
  if (made_unregistered(v_h)) return 0;  // ignored, as ndarray_init_attribute ignores it
  if (kwargs != nullptr || !PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != 2 ||
      Py_TYPE(self) != g_ndarray_info->type || !is_fresh(v_h))
    return call_pybind11_init(self, args, kwargs);
  return construct_array(v_h, PyTuple_GET_ITEM(args, 0), PyTuple_GET_ITEM(args, 1));
}

newfunc g_pybind11_new = nullptr;         // kiln.ndarray's tp_new (pybind11's)
PyObject *g_no_arguments = nullptr;       // () for tp_new (never released)
destructor g_pybind11_dealloc = nullptr;  // kiln.ndarray's tp_dealloc (pybind11's)
bool g_simple_layout = false;  // pybind11 lays kiln.ndarray out simply (new_simple_instance)

/// A fresh instance of kiln.ndarray (`type`, the exact class) as pybind11's tp_new makes it when
/// g_simple_layout (value pointer and holder inside the object; no value yet), without pybind11's
/// lookup of the class's C++ types. nullptr with the Python error set when Python cannot
/// allocate the object (MemoryError).
PyObject *new_simple_instance(PyTypeObject *type) {
  PyObject *self = type->tp_alloc(type, 0);
  if (self == nullptr) return nullptr;
  auto *inst = reinterpret_cast<py::detail::instance *>(self);
  inst->simple_layout = true;
  inst->simple_value_holder[0] = nullptr;
  inst->simple_holder_constructed = false;
  inst->simple_instance_registered = false;
  inst->owned = true;
  return self;
}

/// kiln.ndarray's tp_dealloc. An instance of the exact class in the simple layout, not in
/// pybind11's table, without weak references or keep-alive patients, and with its holder or no
/// value (what kiln.ndarray(dtype, shape) and ndarray.__new__ make) is destroyed here as
/// pybind11's dealloc destroys it, without its lookup of the class's C++ types; anything else
/// (a subclass's instance too) by pybind11's dealloc.
void ndarray_dealloc(PyObject *self) {
  auto *inst = reinterpret_cast<py::detail::instance *>(self);
  PyTypeObject *type = Py_TYPE(self);
  if (type != g_ndarray_info->type || !inst->simple_layout || inst->simple_instance_registered ||
      inst->weakrefs != nullptr || inst->has_patients ||
      (!inst->simple_holder_constructed && inst->simple_value_holder[0] != nullptr)) {
    g_pybind11_dealloc(self);
    return;
  }
  if (inst->simple_holder_constructed) {
    py::error_scope pending;   // as pybind11's: the value's destructor may run Python
    py::detail::value_and_holder v_h = inst->get_value_and_holder(g_ndarray_info);
    v_h.holder<std::unique_ptr<PyArray>>().~unique_ptr();
    inst->simple_holder_constructed = false;
  }
  inst->simple_value_holder[0] = nullptr;
  type->tp_free(self);
  Py_DECREF(type);  // a heap type's instance holds a reference to it
}

/// A call of the class `callable` through its metaclass's tp_call (pybind11's: tp_new, then
/// tp_init, then its check that __init__ made the value), with the argument tuple and keyword
/// dict the vectorcall convention does without.
PyObject *call_through_metaclass(PyObject *callable, PyObject *const *args, std::size_t nargsf,
                                 PyObject *kwnames) {
  const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
  auto positional = py::reinterpret_steal<py::object>(PyTuple_New(nargs));
  if (!positional) return nullptr;
  for (Py_ssize_t i = 0; i < nargs; ++i) PyTuple_SET_ITEM(positional.ptr(), i, Py_NewRef(args[i]));
  py::object keywords;
  if (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0) {
    keywords = py::reinterpret_steal<py::object>(PyDict_New());
    if (!keywords) return nullptr;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); ++i)
      if (PyDict_SetItem(keywords.ptr(), PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) return nullptr;
  }
  if (Py_EnterRecursiveCall(" while calling a Python object") != 0) return nullptr;  // as CPython does
  PyObject *result = Py_TYPE(callable)->tp_call(callable, positional.ptr(), keywords.ptr());
  Py_LeaveRecursiveCall();
  return result;
}

PyObject *g_device_keyword = nullptr;  // the interned str "device" (never released)

/// Whether `kwnames` is absent or exactly ("device",).
bool no_keywords_but_device(PyObject *kwnames) {
  if (kwnames == nullptr) return true;
  if (PyTuple_GET_SIZE(kwnames) != 1) return false;
  PyObject *name = PyTuple_GET_ITEM(kwnames, 0);
  return name == g_device_keyword ||
         (PyUnicode_Check(name) && PyUnicode_Compare(name, g_device_keyword) == 0);
}

/// kiln.ndarray's tp_vectorcall (what `kiln.ndarray(dtype, shape)` runs, PEP 590): with two
/// positional arguments (and at most the keyword device=) it makes the instance
/// (new_simple_instance, or pybind11's tp_new if pybind11 does not lay the class out simply)
/// and the array (construct_array) without an argument tuple or pybind11's metaclass __call__;
/// any other call, a subclass, or a class whose __new__ or __init__ was replaced goes through
/// the metaclass.
PyObject *ndarray_vectorcall(PyObject *callable, PyObject *const *args, std::size_t nargsf,
                             PyObject *kwnames) {
  auto *type = reinterpret_cast<PyTypeObject *>(callable);
  if (!no_keywords_but_device(kwnames) || PyVectorcall_NARGS(nargsf) != 2 || type != g_ndarray_info->type ||
      type->tp_new != g_pybind11_new || type->tp_init != &fast_ndarray_init)
    return call_through_metaclass(callable, args, nargsf, kwnames);
  PyObject *self = g_simple_layout ? new_simple_instance(type) : type->tp_new(type, g_no_arguments, nullptr);
  if (self == nullptr) return nullptr;
  auto *inst = reinterpret_cast<py::detail::instance *>(self);
  py::detail::value_and_holder v_h = inst->get_value_and_holder(g_ndarray_info);
  if (construct_array(v_h, args[0], args[1], kwnames != nullptr ? args[2] : Py_None) < 0) {
    Py_DECREF(self);  // pybind11's dealloc of an instance without a value
    return nullptr;
  }
  return self;
}

/// Takes `object` out of the garbage collector's lists (gc.get_objects, gc.get_referrers).
void untrack(PyObject *object) {
  if (PyObject_IS_GC(object) && PyObject_GC_IsTracked(object)) PyObject_GC_UnTrack(object);
}

}  // namespace

std::size_t registered_instances() { return py::detail::get_internals().registered_instances.size(); }

void install_ndarray_type(py::handle cls, const py::detail::type_info *info) {
  auto *type = reinterpret_cast<PyTypeObject *>(cls.ptr());
  g_ndarray_info = info;
  g_device_keyword = PyUnicode_InternFromString("device");
  if (g_device_keyword == nullptr) throw py::error_already_set();
  // The attribute first: setting __init__ on the type resets tp_init to the generic slot (which
  // calls the attribute); tp_init is set after it.
  PyObject *method = install_fast_function(cls, "__init__", &ndarray_init_attribute);
  // Only the function is kept (called with self first, as its instancemethod would call it); the
  // instancemethod goes, still tracked (CPython 3.11 frees one without checking that it is).
  g_pybind11_init_function = PyInstanceMethod_Check(method)
                                 ? Py_NewRef(PyInstanceMethod_GET_FUNCTION(method))
                                 : Py_NewRef(method);
  Py_DECREF(method);
  // Out of the garbage collector's sight (gc.get_objects, gc.get_referrers): called directly,
  // pybind11's __init__ would construct a second value over an array construct_array made (it
  // skips only instances it registered), leaking the first under its views. Kept for the
  // process: never collected either way (a builtin function is freed safely untracked).
  untrack(g_pybind11_init_function);
  type->tp_init = &fast_ndarray_init;
  g_pybind11_new = type->tp_new;
  g_no_arguments = PyTuple_New(0);
  if (g_no_arguments == nullptr) throw py::error_already_set();
  // pybind11's own rule for the simple layout (instance::allocate_layout).
  g_simple_layout = py::detail::all_type_info(type).size() == 1 &&
                    info->holder_size_in_ptrs <= py::detail::instance_simple_holder_in_ptrs();
  if (g_simple_layout && !PyType_IS_GC(type)) {
    g_pybind11_dealloc = type->tp_dealloc;
    type->tp_dealloc = &ndarray_dealloc;
  }
  // Used only when the metaclass (ndarray_metaclass) has Py_TPFLAGS_HAVE_VECTORCALL; never
  // inherited by subclasses (they go through the metaclass's __call__).
  type->tp_vectorcall = &ndarray_vectorcall;
}

py::object ndarray_metaclass() {
  PyTypeObject *base = py::detail::get_internals().default_metaclass;
  static PyMemberDef members[] = {
      {"__vectorcalloffset__", Py_T_PYSSIZET, offsetof(PyTypeObject, tp_vectorcall), Py_READONLY, nullptr},
      {nullptr, 0, 0, 0, nullptr}};
  PyType_Slot slots[] = {{Py_tp_call, reinterpret_cast<void *>(base->tp_call)},
                         {Py_tp_members, members},
                         {0, nullptr}};
  PyType_Spec spec{"kiln._kiln.ndarray_type", 0, 0,
                   Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_IMMUTABLETYPE |
                       Py_TPFLAGS_HAVE_VECTORCALL,
                   slots};
  auto bases = py::reinterpret_steal<py::object>(PyTuple_Pack(1, reinterpret_cast<PyObject *>(base)));
  if (!bases) throw py::error_already_set();
  auto meta = py::reinterpret_steal<py::object>(PyType_FromSpecWithBases(&spec, bases.ptr()));
  if (!meta) throw py::error_already_set();
  return meta;
}

}  // namespace kiln::python
