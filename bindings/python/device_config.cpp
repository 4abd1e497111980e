// Configuring devices from Python (see device_config.h): kiln.init, kiln.device, Device.configure
// and their options, opening and closing a device's executor.
//
// Threading: the GIL is held except while an executor is made (the JIT) and while a device's
// open_mutex is waited for. Errors: InvalidTypeError and InvalidUsageError for the options
// (conversions.h), executor failures by check() (error_mapping.h).
#include "device_config.h"

#include <pybind11/numpy.h>

#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "conversions.h"
#include "error_mapping.h"
#include "kiln/rhi/teardown_failures.h"
#include "registration.h"
#include "signatures.h"
#include "kiln_stub_docstrings.h"

namespace kiln::python {
namespace {

/// The most entries a mock_other_process_bytes script holds (one is read per memory query).
constexpr std::size_t kMaxScriptEntries = 1 << 20;

/// init's mock_other_process_bytes: an int or a list, tuple or 1-D array of at most
/// kMaxScriptEntries ints. Errors: InvalidTypeError, InvalidUsageError (a value out of range, too
/// many entries).
std::vector<uint64_t> to_bytes_script(const py::object &value, const char *site) {
  if (is_integer(value)) return {to_bytes(value, "mock_other_process_bytes", site)};
  const bool int_vector = py::isinstance<py::array>(value) &&
                          py::reinterpret_borrow<py::array>(value).ndim() == 1;
  if (!int_vector && !py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value))
    raise_invalid_type(site, fmt::format("{}: mock_other_process_bytes must be an int or a "
                                         "list of ints, got {} {}",
                                         site, type_name(value), std::string(py::repr(value))));
  std::vector<uint64_t> script;
  for (py::handle item : value) {
    if (script.size() == kMaxScriptEntries)  // a list subclass whose __iter__ never ends, too
      raise_invalid_usage("kiln", site,
                          fmt::format("{}: mock_other_process_bytes has more than {} entries", site,
                                      kMaxScriptEntries));
    script.push_back(to_bytes(item, "mock_other_process_bytes", site));
  }
  return script;
}

/// The executor configuration of `options` for device `name`, checked in the order they are
/// declared.
ExecutorConfig to_config(const DeviceName &name, const DeviceOptions &o, const char *site) {
  ExecutorConfig config;
  config.backend = name.backend;
  config.device_ordinal = name.ordinal;
  config.budget.limit_bytes = to_optional_bytes(o.budget_bytes, "budget_bytes", site);
  config.budget.reserve_bytes = to_optional_bytes(o.reserve_bytes, "reserve_bytes", site);
  config.budget.live_check = o.live_check.is_none() || to_flag(o.live_check, "live_check", site);
  config.budget.caching = o.caching.is_none() || to_flag(o.caching, "caching", site);
  if (auto heap = to_optional_bytes(o.device_heap_bytes, "device_heap_bytes", site)) config.device_heap_bytes = *heap;
  if (auto cap = to_optional_bytes(o.mock_capacity_bytes, "mock_capacity_bytes", site))
    config.mock.capacity_bytes = *cap;
  if (!o.mock_other_process_bytes.is_none())
    config.mock.other_process_bytes_script = to_bytes_script(o.mock_other_process_bytes, site);
  if (auto threads = to_optional_bytes(o.num_threads, "num_threads", site))
    config.num_threads = static_cast<unsigned>(std::min<uint64_t>(*threads, 1024));
  return config;
}

/// Makes the executor of `config` for `state` (the JIT runs without the GIL). A lost device
/// recovers only once its driver context is released: the old executor goes first (its arrays,
/// if any still live, keep the context and the new one fails as lost).
std::shared_ptr<LlvmRuntimeExecutor> create_executor(DeviceState &state, ExecutorConfig config) {
  std::weak_ptr<DeviceContext> lost_context;
  if (state.executor && state.executor->device().is_lost()) {
    lost_context = state.executor->context();
    replace_executor(state, nullptr);
  }
  // The first executor JIT-compiles the kernels.
  RhiExpected<std::unique_ptr<LlvmRuntimeExecutor>> created =
      without_gil([&] { return LlvmRuntimeExecutor::create(std::move(config)); });
  if (!created && created.error().result == RhiResult::device_lost && !lost_context.expired())
    created.error().add_context(
        "arrays of the executor whose device was lost still hold its driver context: free or "
        "delete them, then call kiln.init again");  // recreate_executor's rule, for a shared_ptr
  return check(std::move(created));
}

}  // namespace

DeviceName to_device_name(py::handle arch, const char *site) {
  if (!py::isinstance<py::str>(arch))
    raise_invalid_type(site, fmt::format("{}: the device must be a str (\"cpu\", \"mock\", \"cuda\", "
                                         "\"amdgpu\", or \"cuda:1\" ...) or a kiln.Device, got {} {}",
                                         site, type_name(arch), std::string(py::repr(arch))));
  const DeviceName name = check(parse_device_name(to_text(arch, "arch", site)));
  if ((name.backend == Backend::cpu || name.backend == Backend::mock) && name.ordinal != 0)
    raise_invalid_usage("kiln", site,  // as the backend itself says when asked to open it
                        fmt::format("{}: the {} backend has one device, {}:0; there is no ordinal {}", site,
                                    to_string(name.backend), to_string(name.backend), name.ordinal));
  return name;
}

void warn_teardown_failures() {
  const std::vector<std::string> failures = take_teardown_failures();
  for (std::size_t i = 0; i < failures.size(); ++i) {
    if (PyErr_WarnEx(PyExc_RuntimeWarning, failures[i].c_str(), 1) == 0) continue;
    for (std::size_t rest = i + 1; rest < failures.size(); ++rest) record_teardown_failure(failures[rest]);
    throw py::error_already_set();
  }
}

void configure(DeviceState &state, const DeviceOptions &options, const char *site, bool only_if_closed) {
  check_not_in_observer(site);
  ExecutorConfig config = to_config(state.name, options, site);
  const std::optional<uint64_t> fault = to_optional_bytes(options.fault_at, "fault_at", site);
  const std::optional<uint64_t> fail_size = to_optional_bytes(options.fail_sizes_at_least, "fail_sizes_at_least", site);
  std::unique_lock lock(state.open_mutex, std::defer_lock);
  without_gil([&lock] {  // never wait for it holding the GIL: its holder may need the GIL back
    lock.lock();
    return 0;
  });
  if (only_if_closed && state.executor) return;
  // Compiled user kernels hold the old executor's device context: a lost device recovers only
  // once they are gone (kiln/_kernels.py compiles them again for the new one).
  py::module_::import("kiln._kernels").attr("_clear_cache")();
  std::shared_ptr<LlvmRuntimeExecutor> fresh = create_executor(state, std::move(config));
  // Faults count from after the executor's own set-up, as kiln-ops --fault-at does.
  if (fault && *fault != 0) fresh->memory().fault_plan().fail_nth_allocation(*fault);
  if (fail_size) fresh->memory().fault_plan().fail_sizes_at_least(*fail_size);
  replace_executor(state, std::move(fresh));  // the old one goes; its arrays keep its device alive
  warn_teardown_failures();
}

void close_device(DeviceState &state) {
  if (!state.executor) return;
  py::module_::import("kiln._kernels").attr("_clear_cache")();  // they hold its device context
  replace_executor(state, nullptr);
}

namespace {

/// Whether any option is given (not None).
bool any_option(const DeviceOptions &o) {
  for (const py::object *v : {&o.budget_bytes, &o.reserve_bytes, &o.live_check, &o.caching, &o.device_heap_bytes,
                              &o.mock_capacity_bytes, &o.mock_other_process_bytes, &o.num_threads, &o.fault_at,
                              &o.fail_sizes_at_least})
    if (!v->is_none()) return true;
  return false;
}

/// kiln.init: configures `arch` and makes it the process's current device. The executor of the
/// device that was current before (kiln.init's or the default cpu) is replaced as it always
/// was: when it is another device, it is closed. Devices opened through kiln.device stay open.
void init(py::handle arch, KILN_DEVICE_OPTION_ARGS) {
  check_not_in_observer("init");
  DeviceState &state = to_device_state(arch, "init");
  (void)to_flag(live_check, "live_check", "init");  // init's flags are bools, None included
  (void)to_flag(caching, "caching", "init");
  DeviceState *previous = process_default_device();
  if (previous == nullptr) previous = &device_state(DeviceName{Backend::cpu, 0});
  configure(state, KILN_DEVICE_OPTIONS, "init");
  set_process_default_device(&state);
  if (previous != nullptr && previous != &state) {
    close_device(*previous);
    warn_teardown_failures();
  }
}

/// kiln.device(name=None, **options): the Device `name` names (the current one without a name),
/// configured with `options` when any is given.
py::object device(py::handle name, KILN_DEVICE_OPTION_ARGS) {
  DeviceState &state = name.is_none() ? current_device() : to_device_state(name, "device");
  const DeviceOptions options = KILN_DEVICE_OPTIONS;
  if (any_option(options)) configure(state, options, "device");
  return device_object(state);
}

}  // namespace

void register_device_config(py::module_ &m) {
  auto cls = py::reinterpret_borrow<py::class_<DeviceState, std::unique_ptr<DeviceState, py::nodelete>>>(m.attr("Device"));
  cls.def("configure", [](DeviceState &s, KILN_DEVICE_OPTION_ARGS) { configure(s, KILN_DEVICE_OPTIONS, "configure"); },
          doc("Device.configure"), py::kw_only(), KILN_DEVICE_OPTION_PYARGS, guarded());
  def_typed(m, "init", "(arch='cpu', *, " KILN_DEVICE_OPTION_SIGNATURE ")", &init, doc("init"),
            py::arg("arch") = "cpu", py::kw_only(), py::arg("budget_bytes") = py::none(),
            py::arg("reserve_bytes") = py::none(), py::arg("live_check") = true, py::arg("caching") = true,
            py::arg("device_heap_bytes") = py::none(), py::arg("mock_capacity_bytes") = py::none(),
            py::arg("mock_other_process_bytes") = py::none(), py::arg("num_threads") = py::none(),
            py::arg("fault_at") = py::none(), py::arg("fail_sizes_at_least") = py::none(), guarded());
  def_typed(m, "device", "(name=None, *, " KILN_DEVICE_OPTION_SIGNATURE ")", &device, doc("device"),
            py::arg("name") = py::none(), py::kw_only(), KILN_DEVICE_OPTION_PYARGS, guarded());
  // The device a name means, as "backend:ordinal" ("cuda" -> "cuda:0"): kiln.init's parser, for
  // the pytest plugin's options. Errors: InvalidTypeError (not a str), InvalidUsageError.
  def_typed(m, "_device_key", "(name)", [](py::handle name) {
    const DeviceName device = check(parse_device_name(to_text(name, "name", "_device_key")));
    return fmt::format("{}:{}", to_string(device.backend), device.ordinal);
  }, py::arg("name"), guarded());
  // Closes every device of `backend` ("cuda"): their executors go (their arrays keep what they
  // hold), and a current device among them gives way to cpu (opened as kiln.init(arch="cpu")
  // would). For kiln.testing's fake blocks: no executor outlives the block on the fake.
  def_typed(m, "_close_devices", "(backend)", [](py::handle backend_name) {
    check_not_in_observer("_close_devices");
    const Backend backend = check(parse_backend(to_text(backend_name, "backend", "_close_devices")));
    bool current_closed = false;
    for (DeviceState *s : device_states()) {
      if (s->name.backend != backend || !s->executor) continue;
      current_closed = current_closed || s == process_default_device();
      close_device(*s);
    }
    if (current_closed) set_process_default_device(nullptr);  // cpu, opened on its next use
    warn_teardown_failures();
  }, py::arg("backend"), guarded());
}

}  // namespace kiln::python
