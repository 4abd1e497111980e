// kiln::testing::sweep (kiln/executor/testing/sweep.h).
#include "kiln/executor/testing/sweep.h"

#include <algorithm>
#include <limits>
#include <mutex>

#include <fmt/format.h>

namespace kiln::testing {

bool SweepRun::leaked() const {
  return std::ranges::any_of(leaked_bytes, [](uint64_t bytes) { return bytes != 0; });
}

bool SweepRun::ok() const { return outcome.ok_or_out_of_memory() && !leaked(); }

std::vector<SweepRun> SweepReport::broken() const {
  std::vector<SweepRun> out;
  std::ranges::copy_if(runs, std::back_inserter(out), [](const SweepRun &r) { return !r.ok(); });
  return out;
}

namespace {

/// The counting run's nth: a request number no workload reaches.
constexpr uint64_t kNeverNth = std::numeric_limits<uint64_t>::max();

/// What the ledger holds per category, the caching pool's own blocks (pool_cache) left out.
CategoryBytes held_bytes(const runtime::DeviceMemory &memory) {
  CategoryBytes held = memory.in_use_by_category();
  held[static_cast<std::size_t>(MemoryCategory::pool_cache)] = 0;
  return held;
}

/// Per category: max(what `leaked` says, `now` - `baseline`).
void add_growth(CategoryBytes &leaked, const CategoryBytes &now, const CategoryBytes &baseline) {
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    if (now[i] > baseline[i]) leaked[i] = std::max(leaked[i], now[i] - baseline[i]);
}

/// The first injected refusal an executor's memory gives, seen by an OOM observer (which runs
/// on the refusing thread, so the record is locked). Registered for one run.
class InjectedFaultRecorder {
 public:
  explicit InjectedFaultRecorder(runtime::DeviceMemory &memory)
      : memory_(memory), id_(memory.add_oom_observer([this](const Failure &f) { record(f); })) {}
  ~InjectedFaultRecorder() { (void)memory_.remove_oom_observer(id_); }
  InjectedFaultRecorder(const InjectedFaultRecorder &) = delete;
  InjectedFaultRecorder &operator=(const InjectedFaultRecorder &) = delete;
  /// The category and size of the first injected refusal; none when no fault fired.
  [[nodiscard]] std::optional<std::pair<MemoryCategory, uint64_t>> first() const {
    std::lock_guard lock(mutex_);
    return first_;
  }

 private:
  void record(const Failure &f) {
    if (!f.injected) return;
    std::lock_guard lock(mutex_);
    if (!first_) first_.emplace(f.category, f.requested_bytes);
  }
  runtime::DeviceMemory &memory_;
  uint64_t id_;
  mutable std::mutex mutex_;
  std::optional<std::pair<MemoryCategory, uint64_t>> first_;
};

/// One run on a fresh executor with `spec` armed: what it gave, the selected requests it made
/// and what it left held.
struct RunResult {
  SweepRun run;
  uint64_t selected_requests = 0;
};

KitExpected<RunResult> run_once(const Workload &workload, const SweepOptions &options,
                                 const runtime::FaultSpec &spec) {
  auto made = LlvmRuntimeExecutor::create(options.config, options.program);
  if (!made) {
    Failure cause = std::move(made).error();
    std::string message = fmt::format("sweep: could not make the executor for a run: {}",
                                      describe(cause));
    return std::unexpected(WorkloadError{WorkloadError::Kind::setup_failed, std::move(message),
                                         std::move(cause)});
  }
  std::unique_ptr<LlvmRuntimeExecutor> ex = std::move(*made);
  runtime::DeviceMemory &memory = ex->memory();
  RunResult result;
  result.run.at = spec.nth == kNeverNth ? 0 : spec.nth;
  const CategoryBytes baseline = held_bytes(memory);
  {
    InjectedFaultRecorder recorder(memory);
    memory.fault_plan().arm(spec);  // replaces a KILN_FAULT armed by create()
    result.run.outcome = run_workload(workload, *ex);
    const runtime::RequestFaultPlan::Setting setting = memory.fault_plan().setting();
    result.selected_requests = setting.spec ? setting.spec->selected_count : 0;
    memory.fault_plan().clear();
    if (auto first = recorder.first()) {
      result.run.category = first->first;
      result.run.requested_bytes = first->second;
    }
  }
  add_growth(result.run.leaked_bytes, held_bytes(memory), baseline);
  // With the executor gone its ledger holds nothing, unless the workload kept arrays alive.
  const std::shared_ptr<DeviceContext> context = ex->context();
  ex.reset();
  add_growth(result.run.leaked_bytes, held_bytes(*context->memory), CategoryBytes{});
  return result;
}

std::string filter_text(const std::optional<runtime::FaultSpec> &filter) {
  return filter ? fmt::format(" selected by '{}'", filter->to_text()) : std::string();
}

}  // namespace

KitExpected<SweepReport> sweep(const Workload &workload, const SweepOptions &options) {
  runtime::FaultSpec spec = options.filter.value_or(runtime::FaultSpec{});
  if (spec.nth != 0 || spec.probability)
    return std::unexpected(WorkloadError{
        WorkloadError::Kind::invalid_usage,
        fmt::format("sweep: the filter '{}' has a trigger (nth= or p=); a sweep sets nth itself, "
                    "give only category=, min_bytes= and kernel=", spec.to_text()),
        std::nullopt});
  if (spec.kind != runtime::FaultKind::oom)
    return std::unexpected(WorkloadError{
        WorkloadError::Kind::invalid_usage,
        fmt::format("sweep: the filter '{}' gives another kind of failure; a sweep checks the "
                    "out-of-memory contract, so its faults are kind=oom (the default)",
                    spec.to_text()),
        std::nullopt});
  if (auto known = check_fault_kernel(spec); !known)
    return std::unexpected(WorkloadError{WorkloadError::Kind::invalid_usage,
                                         fmt::format("sweep: {}", known.error().detail),
                                         std::nullopt});
  spec.nth = kNeverNth;
  KILN_ASSIGN_OR_RETURN(RunResult counting, run_once(workload, options, spec));
  if (!counting.run.outcome.error_name.empty())
    return std::unexpected(WorkloadError{
        WorkloadError::Kind::fails_without_fault,
        fmt::format("sweep: the workload fails without any fault: {}: {}",
                    counting.run.outcome.error_name, counting.run.outcome.detail),
        counting.run.outcome.failure});
  if (counting.selected_requests == 0)  // a sweep that fails nothing tests nothing: never a pass
    return std::unexpected(WorkloadError{
        WorkloadError::Kind::selects_nothing,
        fmt::format("sweep: the counting run made no allocation request{}, so there is nothing to "
                    "fail and nothing was tested (a launch requests only staging for host "
                    "operands; the executor's own buffers are made before the workload runs)",
                    filter_text(options.filter)),
        std::nullopt});
  SweepReport report;
  report.allocations = counting.selected_requests;
  for (uint64_t at = 1; at <= report.allocations; ++at) {
    spec.nth = at;
    KILN_ASSIGN_OR_RETURN(RunResult faulted, run_once(workload, options, spec));
    if (faulted.selected_requests < at)
      return std::unexpected(WorkloadError{
          WorkloadError::Kind::nondeterministic,
          fmt::format("sweep: run {} made {} allocation request(s){}, the counting run {}: the "
                      "workload does not allocate the same way each time",
                      at, faulted.selected_requests, filter_text(options.filter),
                      report.allocations),
          std::nullopt});
    if (options.on_run) options.on_run(faulted.run);
    report.runs.push_back(std::move(faulted.run));
  }
  return report;
}

}  // namespace kiln::testing
