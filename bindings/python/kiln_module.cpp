// kiln._kiln: the Python binding of the executor (pybind11). This file only registers: each
// concern lives in its own file under bindings/python/ and adds itself by a register_* function
// (registration.h).
//
// Errors: the ONLY place a named error becomes a Python exception is error_mapping.cpp; C++
// exceptions that reach Python from below the executor's guards are translated there too.
// Threading: module state is touched only with the GIL held; launches run with the GIL released
// (without_gil, executor_state.h) and the arrays they use marked busy (ndarray.h); OOM observers
// re-acquire the GIL (memory.cpp).
#include <pybind11/pybind11.h>

#include "registration.h"

PYBIND11_MODULE(_kiln, m) {
  using namespace kiln::python;
  m.doc() = "kiln native module; use the package `kiln`.";
  // Docstrings come from _kiln.pyi with the stub's signature on their first line (doc());
  // pybind11's own signature lines would name every argument `handle`.
  py::options options;
  options.disable_function_signatures();
  register_error_mapping(m);
  register_dtype(m);
  register_conversions(m);
  register_executor_state(m);
  register_device_config(m);
  register_ndarray(m);
  register_dlpack(m);
  register_cuda_array_interface(m);
  register_ops(m);
  register_user_kernels(m);
  register_memory(m);
  register_testing(m);
  seal_ndarray(m);
}
