// Failure -> Python exception: the ONLY place a named error becomes a Python exception.
//
// make_exception() classifies the Failure with kiln::classify and builds the class of that
// ErrorKind, defined in kiln/_errors.py; messages are never parsed. Also here: the translator of
// stray C++ exceptions and the per-thread stash of an OOM observer's KeyboardInterrupt/SystemExit.
//
// Threading: everything here runs with the GIL held (the exception classes are looked up once,
// at import, and kept for the life of the process).
#include "error_mapping.h"

#include <pybind11/stl.h>

#include <fmt/format.h>

#include <array>
#include <future>
#include <new>
#include <stdexcept>
#include <system_error>

#include "conversions.h"
#include "registration.h"
#include "kiln/runtime/host_memory_guard.h"

namespace kiln::python {
namespace {

constexpr std::array kAllErrorKinds = {
    ErrorKind::device_out_of_memory, ErrorKind::budget_exceeded, ErrorKind::device_heap_exhausted,
    ErrorKind::host_out_of_memory,   ErrorKind::invalid_usage,   ErrorKind::not_supported,
    ErrorKind::device_lost,          ErrorKind::runtime_error};

// The class of each ErrorKind, looked up once by error_name() in kiln._errors. Strong references
// kept for the life of the process (never released: no Py_DECREF after the interpreter is gone).
PyObject *g_error_classes[kAllErrorKinds.size()] = {};
// kiln.InvalidTypeError (an InvalidUsageError that is also a TypeError) and kiln._errors._recast,
// for invalid_usage failures whose cause is the type of an argument. Kept like the classes above.
PyObject *g_invalid_type_class = nullptr;
PyObject *g_recast = nullptr;
// kiln.KernelCompileError (an InvalidUsageError with the line and column in the kernel's code),
// for invalid_usage failures with kernel_compile set. Kept like the classes above.
PyObject *g_kernel_compile_class = nullptr;

/// The knobs a Python user sets for device `device` ("cuda:1"): the advice of every exception
/// names that device's configure (kiln.init configures only the current device). Without a
/// device name, kiln.init's.
struct PythonKnobs {
  std::string budget, reserve, heap;
  explicit PythonKnobs(const std::string &device) {
    const std::string call = device.empty() ? "kiln.init(" : fmt::format("kiln.device(\"{}\").configure(", device);
    budget = call + "budget_bytes=...)";
    reserve = call + "reserve_bytes=...)";
    heap = call + "device_heap_bytes=...)";
  }
  [[nodiscard]] InterfaceKnobs view() const { return InterfaceKnobs{budget, reserve, heap}; }
};

// The thread-locals every call reads are constant-initialized and initial-exec: a
// thread-pointer-relative load, not a __tls_get_addr call (as thread_cache_front.cpp's).
// > 0 while an OOM observer runs on this thread.
constinit thread_local int t_in_observer __attribute__((tls_model("initial-exec"))) = 0;

// A KeyboardInterrupt or SystemExit an OOM observer raised on this thread (a new reference),
// raised when the call that ran the observer returns (check()), in place of its result.
constinit thread_local PyObject *t_observer_interrupt __attribute__((tls_model("initial-exec"))) = nullptr;

/// The keyword arguments of an exception class: every field of `failure`.
py::dict failure_fields(const Failure &failure) {
  py::dict fields;
  fields["requested_bytes"] = failure.requested_bytes;
  fields["class_bytes"] = failure.class_bytes;
  fields["budget_check"] = std::string(to_string(failure.budget_check));
  fields["advice"] = failure.advice;
  fields["device"] = failure.device;
  // The device category of the request that failed: named only where the failure is one (as
  // Failure::message() does); a usage mistake, a fault of another operation or a host
  // allocation has none.
  const bool names_request = failure.result == RhiResult::out_of_memory && failure.allocating &&
                             failure.oom_source != OomSource::host;
  fields["category"] = names_request ? std::string(to_string(failure.category)) : std::string();
  fields["site"] = std::string(failure.site);
  fields["driver_status"] = std::string(failure.driver_status);
  fields["result"] = std::string(to_string(failure.result));
  fields["oom_source"] = std::string(to_string(failure.oom_source));
  fields["detail"] = failure.detail;
  fields["context"] = py::tuple(py::cast(failure.context));
  fields["injected"] = failure.injected;
  if (failure.has_memory) {
    // None, not 0, when the device's memory query failed: no figure is made up (nor the age
    // of a reading that did not happen).
    const bool read = failure.memory.device_read;
    const auto if_read = [read](uint64_t figure) {
      return read ? py::object(py::int_(figure)) : py::none();
    };
    fields["free_bytes"] = if_read(failure.memory.free_bytes);
    fields["total_bytes"] = if_read(failure.memory.total_bytes);
    fields["limit_bytes"] = failure.memory.limit_bytes;
    fields["reserve_bytes"] = failure.memory.reserve_bytes;
    fields["live_age_ms"] = if_read(failure.memory.live_age_ms);
    fields["in_use_bytes"] = category_bytes(failure.memory.in_use_bytes);
  }
  return fields;
}

/// Sets `exc` (an exception instance) as the pending Python error.
void set_error_object(const py::object &exc) {
  PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(exc.ptr())), exc.ptr());
}

/// Looks up the exception classes in kiln._errors (once, at import). Errors: ImportError.
void load_error_classes() {
  py::module_ errors = py::module_::import("kiln._errors");
  for (ErrorKind kind : kAllErrorKinds) {
    py::object cls = errors.attr(std::string(error_name(kind)).c_str());
    g_error_classes[static_cast<std::size_t>(kind)] = cls.release().ptr();
  }
  g_invalid_type_class = py::object(errors.attr("InvalidTypeError")).release().ptr();
  g_recast = py::object(errors.attr("_recast")).release().ptr();
  g_kernel_compile_class = py::object(errors.attr("KernelCompileError")).release().ptr();
}

/// Sets the named error of `caught` when it is a C++ exception kiln maps (std::bad_alloc is
/// HostOutOfMemoryError; std::future_error and std::system_error are RuntimeFaultError; never a
/// plain MemoryError or RuntimeError) and returns true; false for any other exception.
bool set_mapped_error(std::exception_ptr caught) {
  try {
    std::rethrow_exception(caught);
  } catch (const std::bad_alloc &) {
  } catch (const std::future_error &) {
  } catch (const std::system_error &) {
  } catch (...) {
    return false;
  }
  set_python_error(runtime::failure_from_current_exception("host", "kiln"));
  return true;
}

/// Installs set_mapped_error as the translator of C++ exceptions that reach Python from below
/// the executor's guards through pybind11's dispatcher (the others go on to pybind11's own).
void register_exception_translator() {
  py::register_exception_translator([](std::exception_ptr caught) {
    if (!set_mapped_error(caught)) std::rethrow_exception(caught);
  });
}

}  // namespace

void translate_active_exception() {
  const std::exception_ptr caught = std::current_exception();
  if (set_mapped_error(caught)) return;
  // Then pybind11's own translation, as its documentation gives it (its translators are reached
  // only through its dispatcher).
  try {
    std::rethrow_exception(caught);
  } catch (const py::builtin_exception &e) {
    e.set_error();
  } catch (const std::invalid_argument &e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::domain_error &e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::length_error &e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::out_of_range &e) {
    PyErr_SetString(PyExc_IndexError, e.what());
  } catch (const std::range_error &e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::overflow_error &e) {
    PyErr_SetString(PyExc_OverflowError, e.what());
  } catch (const std::exception &e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  } catch (...) {
    PyErr_SetString(PyExc_RuntimeError, "Caught an unknown exception!");
  }
}

void register_error_mapping(py::module_ & /*m*/) {
  load_error_classes();
  register_exception_translator();
}

py::object make_exception(const Failure &unadvised) {
  Failure failure = unadvised;
  advise(failure, PythonKnobs(failure.device).view());
  const ErrorKind kind = classify(failure);
  if (kind == ErrorKind::invalid_usage && failure.kernel_compile)
    return py::handle(g_kernel_compile_class)(failure.message(), py::arg("line") = failure.source_line,
                                              py::arg("column") = failure.source_column,
                                              **failure_fields(failure));
  py::handle cls = g_error_classes[static_cast<std::size_t>(kind)];
  return cls(failure.message(), **failure_fields(failure));
}

[[noreturn]] void raise_failure(const Failure &failure) {
  set_error_object(make_exception(failure));
  throw py::error_already_set();
}

void set_python_error(const Failure &failure) {
  try {
    set_error_object(make_exception(failure));
  } catch (py::error_already_set &e) {
    e.restore();  // making the exception failed (no memory): that error is raised instead
  }
}

[[noreturn]] void raise_invalid_usage(const std::string &device, const char *site, std::string detail) {
  raise_failure(invalid_usage(device, site, std::move(detail)));
}

[[noreturn]] void raise_invalid_type(const char *site, std::string detail) {
  py::object exc = make_exception(invalid_usage("kiln", site, std::move(detail)));
  py::object typed = py::handle(g_recast)(py::handle(g_invalid_type_class), exc);
  PyErr_SetObject(g_invalid_type_class, typed.ptr());
  throw py::error_already_set();
}

[[noreturn]] void raise_invalid_type_from(const py::error_already_set &cause, const char *site,
                                          std::string detail) {
  try {
    raise_invalid_type(site, std::move(detail));
  } catch (py::error_already_set &typed) {
    PyException_SetCause(typed.value().ptr(), cause.value().inc_ref().ptr());
    throw;
  }
}

[[noreturn]] void raise_host_oom(const std::string &device, const char *site, uint64_t size_bytes,
                                 std::string detail) {
  raise_failure(host_out_of_memory(device, site, size_bytes, std::move(detail), "MemoryError"));
}

// ----------------------------------------------------------------------------------------------
// OOM-observer interrupts.

ObserverScope::ObserverScope() { ++t_in_observer; }
ObserverScope::~ObserverScope() { --t_in_observer; }

bool in_observer() { return t_in_observer > 0; }

void stash_observer_interrupt(const py::error_already_set &interrupt) {
  if (t_observer_interrupt == nullptr) t_observer_interrupt = interrupt.value().inc_ref().ptr();
}

void discard_stale_observer_interrupt() {
  if (t_observer_interrupt != nullptr) Py_DECREF(std::exchange(t_observer_interrupt, nullptr));
}

void raise_observer_interrupt() {
  if (t_in_observer != 0 || t_observer_interrupt == nullptr) return;
  PyObject *value = std::exchange(t_observer_interrupt, nullptr);
  PyErr_SetObject(reinterpret_cast<PyObject *>(Py_TYPE(value)), value);
  Py_DECREF(value);
  throw py::error_already_set();
}

}  // namespace kiln::python
