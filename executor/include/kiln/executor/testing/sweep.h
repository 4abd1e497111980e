// kiln::testing::sweep: runs a workload once per allocation request it makes, with that one
// failing, and checks kiln's contract after each run. The C++ counterpart of Python's
// kiln.testing.sweep (bindings/python/kiln/_sweep.py): same runs, same report.
#ifndef KILN_EXECUTOR_TESTING_SWEEP_H_
#define KILN_EXECUTOR_TESTING_SWEEP_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "kiln/executor/testing/workload.h"
#include "kiln/runtime/memory/fault_spec.h"

namespace kiln::testing {

/// One run of a sweep: the `at`-th selected allocation request failed.
struct SweepRun {
  uint64_t at = 0;  ///< which selected request failed (1-based, counted from the run's start)
  /// The refused request as the memory's OOM observer saw it (so also when the workload
  /// swallowed the error): its category and size. Unset only if the fault did not fire.
  std::optional<MemoryCategory> category;
  uint64_t requested_bytes = 0;
  WorkloadOutcome outcome;    ///< what the workload gave
  CategoryBytes leaked_bytes{};  ///< bytes held above the run's baseline after it, per
                                 ///< category (pool_cache, the pool's own reuse, is left out)
  /// Succeeded or stopped at an out-of-memory error, and left nothing held.
  [[nodiscard]] bool ok() const;
  /// Whether any category holds bytes above the baseline.
  [[nodiscard]] bool leaked() const;
};

/// What sweep() saw: the selected requests of the counting run, and one SweepRun each.
struct SweepReport {
  uint64_t allocations = 0;   ///< selected requests the counting run made
  std::vector<SweepRun> runs;  ///< runs[i].at == i + 1
  /// The runs that broke the contract (copies), in order.
  [[nodiscard]] std::vector<SweepRun> broken() const;
};

struct SweepOptions {
  ExecutorConfig config;             ///< each run gets a fresh executor made from it
  std::shared_ptr<Program> program;  ///< shared by the runs; null: as LlvmRuntimeExecutor::create
  /// Only the requests this spec selects are counted and failed (its category=, min_bytes= and
  /// kernel= terms); its trigger must be unset (nth == 0, no probability) and its kind oom.
  /// None: every request.
  std::optional<runtime::FaultSpec> filter;
  /// Told of each faulted run as it ends, before the next starts (progress output). Optional.
  std::function<void(const SweepRun &)> on_run;
};

/// Runs `workload` once with no fault to count its selected allocation requests (N), then N more
/// times, the k-th time with the k-th selected request failing as a driver out-of-memory would
/// (RequestFaultPlan::arm with `nth=k` and the filter). Every run, the counting one included,
/// gets a fresh executor (options.config, options.program), so that "memory at baseline" is
/// measured truthfully: the baseline is the executor's ledger right after set-up (runtime state,
/// heap chunk, code), read again once the workload returned; after the executor is gone, what
/// its ledger still holds (arrays the workload kept alive) is counted too. Requests of the
/// executor's own set-up are not swept (the fault is armed after it); a KILN_FAULT armed by
/// create() is replaced. Runs: N + 1 executors and workload calls.
///
/// Returns the report even when runs broke the contract: check `broken()` (Python raises
/// SweepError instead). Errors (WorkloadError): invalid_usage (filter with nth or p, or a kind
/// other than oom),
/// setup_failed (an executor could not be made), fails_without_fault (the counting run did not
/// succeed: "SweepError"), nondeterministic (run k made fewer than k selected requests:
/// "NondeterministicWorkloadError"). Nothing stays armed after it returns: each run's plan is
/// cleared and its executor destroyed. Not thread-safe with respect to the workload's executor;
/// the workload may use threads inside a run.
[[nodiscard]] KitExpected<SweepReport> sweep(const Workload &workload, const SweepOptions &options);

}  // namespace kiln::testing

#endif  // KILN_EXECUTOR_TESTING_SWEEP_H_
