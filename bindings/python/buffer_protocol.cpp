// The buffer protocol of kiln.ndarray: a zero-copy, writable view of device memory on
// host-addressable devices (cpu, mock). It counts the views, so free() can refuse while one exists (a view holds a reference, so the array
// itself cannot go first).
//
// Threading: called by CPython with the GIL held. Errors: a named error (error_mapping.h) or
// BufferError is set as the Python error and -1 returned; nothing is thrown into CPython.
#include <pybind11/pybind11.h>

#include <array>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "conversions.h"
#include "armed_exception.h"
#include "error_mapping.h"
#include "fast_entry.h"
#include "ndarray.h"
#include "ndarray_type.h"

namespace kiln::python {
namespace {

/// The address of `a`'s memory for a view: its device address, or a static byte for an empty
/// array (no allocation). Errors: NotSupportedError when the device is not host-addressable.
void *view_address(const PyArray &a, const Ndarray &array) {
  static char empty_buffer[1];
  const std::optional<DeviceAllocation> alloc = check(array.allocation("buffer"));
  if (!alloc) return empty_buffer;
  auto *device = dynamic_cast<LlvmDevice *>(alloc->device);
  if (device == nullptr || !device->host_addressable())
    raise_failure(make_failure(RhiResult::not_supported, a.device_name(), "buffer",
                               fmt::format("device {} is not host-addressable: no zero-copy "
                                           "view of ndarray {}; use to_numpy()",
                                           a.device_name(), a.description())));
  return reinterpret_cast<void *>(check(array.device_address("buffer")));
}

/// The buffer-protocol format character of a kiln dtype ("f", "d", "i", "q").
std::string format_char(DataType dtype) {
  switch (dtype) {
    case DataType::f32: return "f";
    case DataType::f64: return "d";
    case DataType::i32: return "i";
    case DataType::i64: return "q";
  }
  return "B";
}

/// The buffer-protocol format of `dtype`, as a string that lives for the process.
char *format_of(DataType dtype) {
  static const std::string formats[] = {format_char(DataType::f32), format_char(DataType::f64),
                                        format_char(DataType::i32), format_char(DataType::i64)};
  return const_cast<char *>(formats[static_cast<int>(dtype)].c_str());
}

/// Fills `view` for `array` as `flags` ask: always C-contiguous and writable.
void fill_view(Py_buffer *view, PyArray &a, const Ndarray &array, void *data, int flags) {
  view->buf = data;
  view->len = static_cast<Py_ssize_t>(array.nbytes());
  view->readonly = 0;
  view->itemsize = static_cast<Py_ssize_t>(itemsize(array.dtype()));
  view->format = (flags & PyBUF_FORMAT) == PyBUF_FORMAT ? format_of(array.dtype()) : nullptr;
  // Without PyBUF_ND (PyBUF_SIMPLE: hashlib, file.write) the consumer gets plain contiguous
  // bytes, no shape and ndim 0, as numpy gives them.
  const bool nd = (flags & PyBUF_ND) == PyBUF_ND;
  view->ndim = nd ? static_cast<int>(a.view_shape.size()) : 0;
  view->shape = nd ? a.view_shape.data() : nullptr;
  view->strides = (flags & PyBUF_STRIDES) == PyBUF_STRIDES ? a.view_strides.data() : nullptr;
  view->suboffsets = nullptr;
  view->internal = nullptr;
}

}  // namespace

int ndarray_getbuffer(PyObject *self, Py_buffer *view, int flags) {
  view->obj = nullptr;
  try {
    throw_if_armed(ArmedSite::buffer);
    PyArray &a = as_array(self, "buffer", "self");
    const Ndarray &array = a.get("buffer");
    a.view_layout();
    // Always C-contiguous: a Fortran-order request can only be met by 0-d and 1-D arrays.
    if ((flags & PyBUF_F_CONTIGUOUS) == PyBUF_F_CONTIGUOUS && a.view_shape.size() > 1) {
      PyErr_SetString(PyExc_BufferError, "kiln.ndarray is C-contiguous, not Fortran-contiguous");
      return -1;
    }
    fill_view(view, a, array, view_address(a, array), flags);
    view->obj = py::handle(self).inc_ref().ptr();
    ++a.exports;
    return 0;
  } catch (py::error_already_set &e) {
    e.restore();
  } catch (abi::__forced_unwind &) {
    throw;  // the thread is ending: no Python error to set
  } catch (...) {
    translate_active_exception();  // the one mapping: bad_alloc is HostOutOfMemoryError
  }
  return -1;
}

void ndarray_releasebuffer(PyObject *self, Py_buffer * /*view*/) { --array_in(self).exports; }

}  // namespace kiln::python
