// Configuring devices from Python: the options of kiln.init, kiln.device and Device.configure
// (DeviceOptions), and opening, replacing and closing a device's executor by kiln.init's rules.
//
// Threading: call with the GIL held; configure releases it while the executor is made and while
// it waits for the device's open_mutex. Errors: raised through error_mapping.h.
#pragma once

#include <pybind11/pybind11.h>

#include "executor_state.h"

namespace kiln::python {

namespace py = pybind11;

/// The device options of init / kiln.device / Device.configure, each None for its default.
struct DeviceOptions {
  py::object budget_bytes, reserve_bytes, live_check, caching, device_heap_bytes,
      mock_capacity_bytes, mock_other_process_bytes, num_threads, fault_at, fail_sizes_at_least;
};

#define KILN_DEVICE_OPTION_ARGS                                                                   \
  const py::object &budget_bytes, const py::object &reserve_bytes, const py::object &live_check,  \
      const py::object &caching, const py::object &device_heap_bytes,                             \
      const py::object &mock_capacity_bytes, const py::object &mock_other_process_bytes,          \
      const py::object &num_threads, const py::object &fault_at,                                  \
      const py::object &fail_sizes_at_least
#define KILN_DEVICE_OPTIONS                                                                        \
  DeviceOptions {                                                                                  \
    budget_bytes, reserve_bytes, live_check, caching, device_heap_bytes, mock_capacity_bytes,      \
        mock_other_process_bytes, num_threads, fault_at, fail_sizes_at_least                       \
  }
#define KILN_DEVICE_OPTION_PYARGS                                                                  \
  py::arg("budget_bytes") = py::none(), py::arg("reserve_bytes") = py::none(),                     \
      py::arg("live_check") = py::none(), py::arg("caching") = py::none(),                         \
      py::arg("device_heap_bytes") = py::none(), py::arg("mock_capacity_bytes") = py::none(),      \
      py::arg("mock_other_process_bytes") = py::none(), py::arg("num_threads") = py::none(),       \
      py::arg("fault_at") = py::none(), py::arg("fail_sizes_at_least") = py::none()
#define KILN_DEVICE_OPTION_SIGNATURE                                                               \
  "budget_bytes=None, reserve_bytes=None, live_check=True, caching=True, "                         \
  "device_heap_bytes=None, mock_capacity_bytes=None, mock_other_process_bytes=None, "              \
  "num_threads=None, fault_at=None, fail_sizes_at_least=None"

/// The device `arch` names (init's and kiln.device's argument). Errors: InvalidTypeError (not a
/// str), InvalidUsageError (no device name; cpu:N or mock:N with N > 0).
DeviceName to_device_name(py::handle arch, const char *site);

/// Opens `state`'s executor anew with `options` (kiln.init's rules: the old executor goes, its
/// arrays keep its device and can only be freed); with `only_if_closed`, only when it is not
/// open once this thread holds the device's open_mutex (another thread may have opened it
/// meanwhile). Errors: those of init.
void configure(DeviceState &state, const DeviceOptions &options, const char *site, bool only_if_closed = false);

/// Closes `state`'s executor (its arrays can only be freed from now on).
void close_device(DeviceState &state);

/// Each device teardown that failed since the last call (teardown_failures.h: a release the driver
/// refused, so memory stays held on the device) as a RuntimeWarning. Errors: the warning itself
/// when a filter makes it an error; the failures not yet warned of are recorded again, for the
/// next call.
void warn_teardown_failures();

}  // namespace kiln::python
