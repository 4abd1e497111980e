// The register_* functions kiln_module.cpp calls, in that order: each adds one concern's
// functions and classes to the module kiln._kiln, then their InvalidTypeError overloads
// (signatures.h).
//
// Threading: called once, at import, with the GIL held. Errors: an ImportError (kiln._errors,
// numpy) propagates as the import's error.
#pragma once

#include <pybind11/pybind11.h>

namespace kiln::python {

namespace py = pybind11;

/// Looks up kiln._errors' exception classes and installs the translator of stray C++ exceptions
/// (error_mapping.cpp). First: every other part raises through them.
void register_error_mapping(py::module_ &m);
/// kiln.dtype and its values f32, f64, i32, i64 (dtype.cpp).
void register_dtype(py::module_ &m);
/// Looks up, once, what the conversions of every call compare against: numpy's bool_ and
/// complexfloating types and the dtype values kiln.f32 ... i64 (conversions.cpp); after
/// register_dtype. Registers nothing.
void register_conversions(py::module_ &m);
/// kiln.Device, kiln.current_device, kiln._shutdown (executor_state.cpp).
void register_executor_state(py::module_ &m);
/// kiln.init, kiln.device, Device.configure, kiln._close_devices (device_config.cpp); after
/// register_executor_state.
void register_device_config(py::module_ &m);
/// kiln.ndarray (buffer protocol included) and kiln.from_numpy (ndarray.cpp).
void register_ndarray(py::module_ &m);
/// Makes kiln.ndarray immutable once every part added its methods (ndarray.cpp). Last.
void seal_ndarray(py::module_ &m);
/// ndarray.__dlpack__, ndarray.__dlpack_device__ and kiln.from_dlpack (dlpack.cpp); after
/// register_ndarray.
void register_dlpack(py::module_ &m);
/// ndarray.__cuda_array_interface__ (cuda_array_interface.cpp); after register_ndarray.
void register_cuda_array_interface(py::module_ &m);
/// kiln.fill, copy, axpy, reduce_sum, matmul, compact_positive (ops.cpp).
void register_ops(py::module_ &m);
/// kiln._UserKernel and the native part of kiln.Kernel, ElementwiseKernel and ReductionKernel:
/// _compile_ir, _compile_elementwise, _compile_reduction, _reduction_plan, _check_kernel_syntax, _launch_kernel
/// (user_kernels.cpp); after register_ndarray.
void register_user_kernels(py::module_ &m);
/// kiln.memory_stats, memory_summary, empty_cache, reset_peak_memory_stats, add_oom_observer,
/// remove_oom_observer (memory.cpp).
void register_memory(py::module_ &m);
/// The native part of kiln.testing: _push_fault, _pop_fault, _fault_allocation_count,
/// _throw_cpp_exception, _make_error (testing.cpp).
void register_testing(py::module_ &m);

}  // namespace kiln::python
