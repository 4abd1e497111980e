// The native part of kiln.testing (kiln/testing.py wraps it): fail_allocation and inject blocks
// over the executor's request fault plan, synthetic failures made into their exceptions, and C++
// exceptions thrown through the module to test their translation.
//
// Threading: called with the GIL held; the fault blocks are guarded by the GIL
// (executor_state.h). Errors: InvalidTypeError and InvalidUsageError for arguments; exceptions
// are built by error_mapping.h.
#include <pybind11/pybind11.h>

#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <new>
#include <optional>
#include <string>
#include <system_error>

#include "armed_exception.h"
#include "conversions.h"
#include "kiln/runtime/memory/fault_spec.h"
#include "error_mapping.h"
#include "signatures.h"
#include "executor_state.h"
#include "fast_entry.h"
#include "ndarray.h"
#include "registration.h"

namespace kiln::python {
namespace {

uint64_t g_next_block_id = 1;  // guarded by the GIL

/// Enters a fail_allocation block: its `at`-th allocation from now fails. An inner block's plan
/// replaces the outer one's while it is open; allocations inside it still count for the outer.
/// Returns the block's token for pop_fault. Errors: InvalidTypeError (not an int: any
/// __index__ object but bool), InvalidUsageError (at < 1 or beyond 2**63-1).
uint64_t push_fault(py::handle at) {
  const uint64_t n = to_bytes(at, "at", "fail_allocation");
  if (n < 1)
    raise_invalid_usage("kiln", "fail_allocation",
                        fmt::format("fail_allocation(at={}): at must be an int >= 1", n));
  DeviceState &state = current_device();
  runtime::RequestFaultPlan &plan = executor_of(state)->memory().fault_plan();
  std::vector<FaultBlock> &blocks = state.fault_blocks;
  runtime::RequestFaultPlan::Setting previous = plan.setting();
  if (blocks.empty()) plan.fail_nth_allocation(FaultPlan::kNever);  // the count starts at 0
  const uint64_t start = plan.allocation_count();
  blocks.push_back({start, start + n, std::move(previous), /*inject=*/false, false, g_next_block_id});
  plan.fail_at_count(start + n);
  return g_next_block_id++;
}

/// Enters an inject block: `spec` (FaultSpec grammar) decides every request from now on,
/// replacing the plan's setting until the block exits. Returns the block's token for pop_fault.
/// Errors: InvalidTypeError (not a str), InvalidUsageError (the spec does not parse, or its
/// kernel= names no kernel: nothing is armed).
uint64_t push_inject(py::handle spec_obj) {
  const std::string text = to_text(spec_obj, "spec", "inject");
  RhiExpected<runtime::FaultSpec> spec = runtime::FaultSpec::parse(text);
  if (!spec) raise_invalid_usage("kiln", "inject", spec.error().detail);
  DeviceState &state = current_device();
  auto ex = executor_of(state);
  if (auto known = ex->check_fault(*spec); !known)  // user kernels' entries too
    raise_invalid_usage("kiln", "inject", known.error().detail);
  runtime::RequestFaultPlan &plan = ex->memory().fault_plan();
  state.fault_blocks.push_back({plan.allocation_count(), FaultPlan::kNever, plan.setting(),
                            /*inject=*/true, false, g_next_block_id});
  plan.arm(*spec);
  return g_next_block_id++;
}

/// Leaves the innermost block (of either kind) and says whether its own request went by while an
/// inner block's plan was armed instead (a fail_allocation block that failed nothing: sweep's
/// check). An inject block, or any block inside another, restores the setting it replaced: an
/// outer fail_allocation plan counts on from its own start, an outer spec goes on from what it
/// had seen before the inner block; when the outer plan's request went by inside this block, the
/// outer block is marked shadowed. The outermost fail_allocation block clears the plan and
/// restarts the count.
bool pop_innermost(DeviceState &state) {
  runtime::RequestFaultPlan &plan = executor_of(state)->memory().fault_plan();
  std::vector<FaultBlock> &blocks = state.fault_blocks;
  if (blocks.empty()) {
    plan.fail_nth_allocation(FaultPlan::kNever);
    return false;
  }
  const uint64_t count = plan.allocation_count();
  FaultBlock done = std::move(blocks.back());
  blocks.pop_back();
  if (!blocks.empty() && !blocks.back().inject && blocks.back().fail_at > done.start_count &&
      blocks.back().fail_at <= count)
    blocks.back().shadowed = true;
  if (blocks.empty() && !done.inject)
    plan.fail_nth_allocation(FaultPlan::kNever);
  else
    plan.restore(done.previous);
  return done.shadowed;
}

/// Leaves the block whose push returned `token` (the current device's innermost when None; a
/// token names its device's block wherever the current device is now): first every block
/// opened inside it and never left (a workload's `__enter__` without `__exit__`, an abandoned
/// generator), then the block itself, each as pop_innermost does. Returns (shadowed, how many
/// unclosed blocks were left for it). A token whose block is gone already (an enclosing block's
/// exit, or kiln.init, closed it) does nothing: (False, 0).
py::tuple pop_fault(py::handle token) {
  if (token.is_none()) return py::make_tuple(pop_innermost(current_device()), 0);
  const uint64_t id = to_bytes(token, "token", "_pop_fault");
  for (DeviceState *state : device_states()) {
    std::vector<FaultBlock> &blocks = state->fault_blocks;
    const auto own = std::find_if(blocks.begin(), blocks.end(), [id](const FaultBlock &b) { return b.id == id; });
    if (own == blocks.end()) continue;
    const auto unclosed = static_cast<std::size_t>(blocks.end() - own) - 1;
    for (std::size_t i = 0; i < unclosed; ++i) (void)pop_innermost(*state);
    return py::make_tuple(pop_innermost(*state), unclosed);
  }
  return py::make_tuple(false, 0);
}

/// Allocations since the innermost open block began (or, outside blocks, since the last one
/// ended or since init).
uint64_t fault_allocation_count() {
  DeviceState &state = current_device();
  const uint64_t count = executor_of(state)->memory().fault_plan().allocation_count();
  const std::vector<FaultBlock> &blocks = state.fault_blocks;
  return blocks.empty() ? count : count - blocks.back().start_count;
}

/// "fail_allocation" or "inject": the innermost open block's kind; None outside blocks.
py::object innermost_fault_block() {
  const std::vector<FaultBlock> &blocks = current_device().fault_blocks;
  if (blocks.empty()) return py::none();
  return py::str(blocks.back().inject ? "inject" : "fail_allocation");
}

/// The RhiResult named `name` ("out_of_memory"), if any.
std::optional<RhiResult> result_named(const std::string &name) {
  static const std::pair<const char *, RhiResult> kResults[] = {
      {"error", RhiResult::error},
      {"invalid_usage", RhiResult::invalid_usage},
      {"not_supported", RhiResult::not_supported},
      {"out_of_memory", RhiResult::out_of_memory},
      {"device_lost", RhiResult::device_lost}};
  for (const auto &[candidate, value] : kResults)
    if (name == candidate) return value;
  return std::nullopt;
}

/// The OomSource named `name` ("budget"), if any.
std::optional<OomSource> oom_source_named(const std::string &name) {
  static const std::pair<const char *, OomSource> kSources[] = {
      {"none", OomSource::none}, {"driver", OomSource::driver}, {"budget", OomSource::budget},
      {"device_heap", OomSource::device_heap}, {"host", OomSource::host}};
  for (const auto &[candidate, value] : kSources)
    if (name == candidate) return value;
  return std::nullopt;
}

/// A synthetic failure made into its exception (for errors without a producer on cpu/mock).
py::object make_error(py::handle result_obj, py::handle oom_source_obj, py::handle requested_obj,
                      py::handle device_obj, py::handle detail_obj) {
  const std::string result = to_text(result_obj, "result", "make_error");
  const std::string oom_source = to_text(oom_source_obj, "oom_source", "make_error");
  const uint64_t requested_bytes = to_bytes(requested_obj, "requested_bytes", "make_error");
  const std::string device = to_text(device_obj, "device", "make_error");
  const std::string detail = to_text(detail_obj, "detail", "make_error");
  const std::optional<RhiResult> r = result_named(result);
  const std::optional<OomSource> s = oom_source_named(oom_source);
  if (!r || !s)
    raise_invalid_usage("kiln", "make_error",
                        fmt::format("unknown result '{}' or oom_source '{}'", result, oom_source));
  Failure f = make_failure(*r, device, "kiln.testing.make_error", detail);
  f.oom_source = *s;
  f.requested_bytes = requested_bytes;
  return make_exception(f);
}

ArmedKind armed_kind(py::handle kind_obj, const char *site) {
  const std::string kind = to_text(kind_obj, "kind", site);
  if (kind == "bad_alloc") return ArmedKind::bad_alloc;
  if (kind == "future_error") return ArmedKind::future_error;
  if (kind == "system_error") return ArmedKind::system_error;
  raise_invalid_usage("kiln", site, fmt::format("kind {:?} is not bad_alloc, future_error or system_error", kind));
}

/// Throws a C++ exception of `kind` (bad_alloc, future_error, system_error) through the module:
/// tests the translation of error_mapping.cpp's register_exception_translator.
void throw_cpp_exception(py::handle kind_obj) { throw_cpp_exception_of(armed_kind(kind_obj, "_throw_cpp_exception")); }

/// Arms a C++ exception of `kind` at `site` (armed_exception.h): "buffer", "observer",
/// or "none" to disarm.
void arm_exception(py::handle site_obj, py::handle kind_obj) {
  const char *name = "_arm_cpp_exception";
  const std::string site = to_text(site_obj, "site", name);
  const ArmedKind kind = armed_kind(kind_obj, name);
  if (site == "none") arm_cpp_exception(ArmedSite::none, kind);
  else if (site == "buffer") arm_cpp_exception(ArmedSite::buffer, kind);
  else if (site == "observer") arm_cpp_exception(ArmedSite::observer, kind);
  else raise_invalid_usage("kiln", name, fmt::format("site {:?} is not buffer, observer or none", site));
}

}  // namespace

void register_testing(py::module_ &m) {
  def_typed(m, "_push_fault", "(at)", &push_fault, py::arg("at"), guarded());
  def_typed(m, "_push_inject", "(spec)", &push_inject, py::arg("spec"), guarded());
  def_typed(m, "_pop_fault", "(token=None)", &pop_fault, py::arg("token") = py::none(), guarded());
  def_typed(m, "_fault_allocation_count", "()", &fault_allocation_count, guarded());
  def_typed(m, "_innermost_fault_block", "()", &innermost_fault_block, guarded());
  def_typed(m, "_live_array_bytes", "()", &LiveArrayBytes::total);
  def_typed(m, "_throw_cpp_exception", "(kind)", &throw_cpp_exception, py::arg("kind"), guarded());
  def_typed(m, "_arm_cpp_exception", "(site, kind)", &arm_exception, py::arg("site"), py::arg("kind"), guarded());
  // Called positionally it takes the fast entries' way (fast_entry.h): the test of how they
  // translate a C++ exception; by keyword, pybind11's.
  FastFunction<&throw_cpp_exception, 1>::install(m, "_throw_cpp_exception");
  def_typed(m, "_make_error", "(result, oom_source='none', requested_bytes=0, device='', detail='')",
            &make_error, py::arg("result"), py::arg("oom_source") = "none",
            py::arg("requested_bytes") = 0, py::arg("device") = "", py::arg("detail") = "", guarded());
}

}  // namespace kiln::python
