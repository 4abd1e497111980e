// The native part of kiln.Kernel, kiln.ElementwiseKernel and kiln.ReductionKernel (kiln/_kernels.py):
// a compiled user kernel (_kiln._UserKernel), the compilers (_compile_ir, _compile_elementwise,
// _compile_reduction, _check_kernel_syntax) and the launch (_launch_kernel).
//
// The Python layer parses the parameter declarations and resolves types; everything here is
// checked again by the executor (UserKernel::create, LlvmRuntimeExecutor::launch) before anything
// is allocated. Threading: compiles and launches run with the GIL released (without_gil), the
// launch's arrays marked busy. Errors: executor failures through check() (error_mapping.h):
// KernelCompileError for code that does not compile, InvalidUsageError / InvalidTypeError for
// arguments.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fmt/format.h>

#include <optional>
#include <string>
#include <vector>

#include "conversions.h"
#include "error_mapping.h"
#include "fast_entry.h"
#include "executor_state.h"
#include "kiln/executor/operation_kernels.h"
#include "kiln/executor/user_kernel.h"
#include "ndarray.h"
#include "ndarray_type.h"
#include "registration.h"
#include "kiln_stub_docstrings.h"

namespace kiln::python {
namespace {

using runtime::OperationParam;
using runtime::UserValueType;

/// A compiled user kernel, as Python holds it.
struct PyUserKernel {
  std::shared_ptr<UserKernel> kernel;
};

UserValueType value_type(DataType dtype) {
  switch (dtype) {
    case DataType::f32: return UserValueType::f32;
    case DataType::f64: return UserValueType::f64;
    case DataType::i32: return UserValueType::i32;
    case DataType::i64: return UserValueType::i64;
  }
  return UserValueType::i64;
}

ParamKind to_kind(const std::string &kind, const char *site) {
  if (kind == "in") return ParamKind::in;
  if (kind == "out") return ParamKind::out;
  if (kind == "inout") return ParamKind::inout;
  if (kind == "scalar") return ParamKind::scalar;
  raise_invalid_usage("kiln", site, fmt::format("a parameter's kind is in, out, inout or scalar, got {}", kind));
}

/// (name, kind, dtype, raw) tuples, as kiln._kernels makes them.
std::vector<KernelParam> to_params(const py::list &params, const char *site) {
  std::vector<KernelParam> result;
  for (py::handle item : params) {
    const auto t = py::cast<py::tuple>(item);
    result.push_back({to_text(t[0], "name", site), to_kind(to_text(t[1], "kind", site), site), to_dtype(t[2], site),
                      to_flag(t[3], "raw", site)});
  }
  return result;
}

/// (name, dtype, array, output, broadcast_strides) tuples.
std::vector<OperationParam> to_operation_params(const py::list &params, const char *site) {
  std::vector<OperationParam> result;
  for (py::handle item : params) {
    const auto t = py::cast<py::tuple>(item);
    result.push_back({to_text(t[0], "name", site), value_type(to_dtype(t[1], site)), to_flag(t[2], "array", site),
                      to_flag(t[3], "output", site), py::cast<std::vector<int64_t>>(t[4])});
  }
  return result;
}

std::vector<std::pair<std::string, UserValueType>> to_type_names(const py::list &names, const char *site) {
  std::vector<std::pair<std::string, UserValueType>> result;
  for (py::handle item : names) {
    const auto t = py::cast<py::tuple>(item);
    result.emplace_back(to_text(t[0], "type name", site), value_type(to_dtype(t[1], site)));
  }
  return result;
}

template <class Fn>
PyUserKernel compile_with(Fn &&fn) {
  check_not_in_observer("compile");
  auto ex = executor();  // kiln/_kernels.py compiles inside `with` the arguments' device
  return PyUserKernel{check(without_gil([&] { return fn(*ex); }))};
}

PyUserKernel compile_ir(py::handle ir, py::handle entry, py::list params) {
  const char *site = "Kernel";
  std::string bytes;
  if (py::isinstance<py::bytes>(ir)) bytes = py::cast<std::string>(ir);
  else if (py::isinstance<py::str>(ir)) bytes = to_text(ir, "ir", site);
  else raise_invalid_type(site, fmt::format("kiln.Kernel: ir must be LLVM IR text (str) or bitcode (bytes), got {}",
                                            type_name(ir)));
  std::string name = to_text(entry, "entry", site);
  std::vector<KernelParam> declared = to_params(params, site);
  return compile_with([&](LlvmRuntimeExecutor &ex) {
    return UserKernel::create(ex, std::as_bytes(std::span(bytes.data(), bytes.size())), name, declared);
  });
}

PyUserKernel compile_elementwise_kernel(py::handle name, py::handle operation, py::list params, py::list shape,
                                        py::list type_names) {
  const char *site = "ElementwiseKernel";
  runtime::ElementwiseSource source{to_text(name, "name", site), to_text(operation, "operation", site),
                                    to_operation_params(params, site), py::cast<std::vector<int64_t>>(shape),
                                    to_type_names(type_names, site)};
  return compile_with([&](LlvmRuntimeExecutor &ex) { return compile_elementwise(ex, source); });
}

py::tuple compile_reduction_kernels(py::handle name, py::tuple texts, py::list inputs, py::list outputs,
                                    py::handle reduce_dtype, py::list type_names) {
  const char *site = "ReductionKernel";
  runtime::ReductionSource source;
  source.name = to_text(name, "name", site);
  source.map_expr = to_text(texts[0], "map_expr", site);
  source.reduce_expr = to_text(texts[1], "reduce_expr", site);
  source.post_map_expr = to_text(texts[2], "post_map_expr", site);
  source.identity = to_text(texts[3], "identity", site);
  source.inputs = to_operation_params(inputs, site);
  source.outputs = to_operation_params(outputs, site);
  source.reduce_type = value_type(to_dtype(reduce_dtype, site));
  source.type_names = to_type_names(type_names, site);
  check_not_in_observer("compile");
  auto ex = executor();
  ReductionKernels kernels = check(without_gil([&] { return compile_reduction(*ex, source); }));
  py::object fold = kernels.fold ? py::cast(PyUserKernel{kernels.fold}) : py::none();
  return py::make_tuple(PyUserKernel{kernels.partial}, fold, PyUserKernel{kernels.combine});
}

/// (parts, lanes, fold_lanes, combine_parts) of plan_reduction for a reduction whose fold
/// kernel is `fold` (None on cpu and mock).
py::tuple reduction_plan(py::object fold, int64_t k, int64_t outputs, int64_t inner) {
  if (k < 0 || outputs < 0 || inner < 1)
    raise_invalid_usage("kiln", "reduction plan", fmt::format("k {}, outputs {}, inner {}", k, outputs, inner));
  const ReductionPlan plan = plan_reduction(!fold.is_none(), k, outputs, inner);
  return py::make_tuple(plan.parts, plan.lanes, plan.fold_lanes, plan.combine_parts());
}

void check_kernel_syntax(py::handle text, bool statements, py::handle what) {
  const std::string code = to_text(text, "operation", "ElementwiseKernel");
  const std::string name = to_text(what, "what", "ElementwiseKernel");
  check(runtime::check_operation_syntax(code, statements, name.c_str(), "kiln"));
}

/// Launches `kernel` with `args` (kiln.ndarray for array parameters, numbers for scalars).
void launch_kernel(const PyUserKernel &k, py::list args, py::object count_obj) {
  const char *site = "launch";
  check_not_in_observer(site);
  const UserKernel &kernel = *k.kernel;
  const auto params = kernel.params();
  if (args.size() != params.size())
    raise_invalid_usage("kiln", site, fmt::format("{}: takes {} arguments, got {}", kernel.describe(), params.size(),
                                                  args.size()));
  std::vector<KernelArg> kernel_args(params.size());
  std::vector<PyArray *> arrays;
  std::vector<NamedOperand> named;  // the arrays under their parameter names
  for (std::size_t i = 0; i < params.size(); ++i) {
    const KernelParam &p = params[i];
    py::handle a = args[i];
    if (p.kind == ParamKind::scalar) {
      const std::string what = fmt::format("launch {} (argument {})", kernel.entry(), p.name);
      kernel_args[i] = KernelArg::of(to_scalar(a, p.dtype, what.c_str()));
      continue;
    }
    const std::string what = fmt::format("argument {} of {}", p.name, kernel.entry());
    PyArray &array = as_array(a, site, what.c_str());
    kernel_args[i] = KernelArg::of(array.get(site));
    arrays.push_back(&array);
    named.push_back({p.name.c_str(), &array});
  }
  std::optional<uint64_t> count;
  if (!count_obj.is_none()) count = to_bytes(count_obj, "count", site);
  auto ex = named.empty() ? executor() : executor_for(kernel.entry().c_str(), named);
  BusyScope busy(std::span<PyArray *const>(arrays.data(), arrays.size()));
  check(without_gil([&] { return ex->launch(kernel, kernel_args, count); }));
}

/// The argument signature of a call (ElementwiseKernel's path past the checks): the executor's
/// generation, then per argument an array's dtype, shape and device's generation, or "int" or
/// "float", as bytes (cheap
/// to hash; the arrays' dtype and shape objects are never made); None when an argument is
/// anything else (a numpy scalar or 0-d array: its dtype is not its type), which takes the
/// checked path every time.
py::object argument_signature(py::args args) {
  std::string packed;
  packed.reserve(8 + args.size() * 24);
  const auto put = [&packed](uint64_t v) { packed.append(reinterpret_cast<const char *>(&v), sizeof v); };
  // The generation of the first array's device (the call's device), else the current device's.
  DeviceState *state = nullptr;
  for (py::handle a : args)
    if (const PyArray *array = array_or_null(a)) {
      state = array->state;
      break;
    }
  if (state == nullptr) state = &current_device();
  put(state->generation);
  for (py::handle a : args) {
    if (const PyArray *array = array_or_null(a)) {
      const std::vector<int64_t> &shape = array->shape();
      put((uint64_t{1} << 63) | (static_cast<uint64_t>(array->dtype) << 8) | shape.size());
      put(array->state->generation);  // a call mixing devices never matches a checked one
      for (const int64_t d : shape) put(static_cast<uint64_t>(d));
    } else if (PyFloat_CheckExact(a.ptr()) || PyLong_CheckExact(a.ptr())) {
      put(reinterpret_cast<uintptr_t>(Py_TYPE(a.ptr())));
    } else {
      return py::none();
    }
  }
  return py::bytes(packed);
}

/// ElementwiseKernel's and ReductionKernel's check of their array arguments before they allocate
/// outputs: `values[i]` (a kiln.ndarray, or anything else, skipped) is argument `names[i]` of
/// call `site`. Errors: InvalidUsageError for a freed array, one of a replaced or closed
/// executor, arrays on different devices (each named).
void check_operands(py::handle site_obj, py::list names, py::list values) {
  const std::string site = to_text(site_obj, "site", "_check_operands");
  std::vector<std::string> kept;
  std::vector<const PyArray *> arrays;
  for (std::size_t i = 0; i < values.size() && i < names.size(); ++i) {
    if (!is_ndarray(values[i])) continue;
    kept.push_back(to_text(names[i], "name", "_check_operands"));
    const PyArray &a = as_array(values[i], site.c_str(), kept.back().c_str());
    (void)a.get(site.c_str());  // dropped by free()
    if (a.array.is_freed())
      raise_invalid_usage(a.device_name(), site.c_str(),
                          fmt::format("{}: argument {} is ndarray {}, which was freed", site, kept.back(),
                                      a.description()));
    arrays.push_back(&a);
  }
  std::vector<NamedOperand> named;
  for (std::size_t i = 0; i < arrays.size(); ++i) named.push_back({kept[i].c_str(), arrays[i]});
  if (!named.empty()) (void)executor_for(site.c_str(), named);
}

py::list describe_params(const PyUserKernel &k) {
  py::list result;
  for (const KernelParam &p : k.kernel->params())
    result.append(py::make_tuple(p.name, to_string(p.kind), std::string(to_string(p.dtype)), p.raw));
  return result;
}

}  // namespace

void register_user_kernels(py::module_ &m) {
  py::class_<PyUserKernel> cls(m, "_UserKernel", doc("_UserKernel"));
  // Instances come from the _compile_* functions only (pybind11 makes them without tp_new):
  // _UserKernel.__new__ would make one without a kernel.
  reinterpret_cast<PyTypeObject *>(cls.ptr())->tp_new = [](PyTypeObject *, PyObject *, PyObject *) -> PyObject * {
    return run_guarded([]() -> PyObject * {
      raise_invalid_type("_UserKernel", "kiln._UserKernel cannot be made: the kernel classes compile it");
    });
  };
  cls
      .def_property_readonly("entry", [](const PyUserKernel &k) { return k.kernel->entry(); }, doc("_UserKernel.entry"))
      .def_property_readonly("code_size_bytes", [](const PyUserKernel &k) { return k.kernel->code_size_bytes(); },
                             doc("_UserKernel.code_size_bytes"))
      .def_property_readonly("params", &describe_params, doc("_UserKernel.params"))
      .def("__repr__", [](const PyUserKernel &k) { return "<kiln._UserKernel " + k.kernel->describe() + ">"; },
           doc("_UserKernel.__repr__"))
      // Compiled code for one device context: not picklable (pickle the kernel object that made
      // it). Without this, pickle's protocols 0 and 1 end the process in pybind11.
      .def("__reduce__", [](py::handle) -> py::object {
        raise_invalid_type("_UserKernel", "a compiled kernel cannot be pickled: pickle the kiln.Kernel, "
                                          "ElementwiseKernel or ReductionKernel that made it");
      }, doc("_UserKernel.__reduce__"));
  m.def("_compile_ir", &compile_ir, doc("_compile_ir"), py::arg("ir"), py::arg("entry"), py::arg("params"), guarded());
  m.def("_compile_elementwise", &compile_elementwise_kernel, doc("_compile_elementwise"), py::arg("name"),
        py::arg("operation"), py::arg("params"), py::arg("shape"), py::arg("type_names"), guarded());
  m.def("_compile_reduction", &compile_reduction_kernels, doc("_compile_reduction"), py::arg("name"),
        py::arg("texts"), py::arg("inputs"), py::arg("outputs"), py::arg("reduce_dtype"), py::arg("type_names"),
        guarded());
  m.def("_reduction_plan", &reduction_plan, doc("_reduction_plan"), py::arg("fold"), py::arg("k"),
        py::arg("outputs"), py::arg("inner"), guarded());
  m.def("_check_kernel_syntax", &check_kernel_syntax, doc("_check_kernel_syntax"), py::arg("text"),
        py::arg("statements"), py::arg("what"), guarded());
  m.def("_check_operands", &check_operands, doc("_check_operands"), py::arg("site"), py::arg("names"),
        py::arg("values"), guarded());
  m.def("_argument_signature", &argument_signature, doc("_argument_signature"), guarded());
  m.def("_launch_kernel", &launch_kernel, doc("_launch_kernel"), py::arg("kernel"), py::arg("args"),
        py::arg("count") = py::none(), guarded());
}

}  // namespace kiln::python
