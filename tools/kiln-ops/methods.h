// kiln-ops --sweep and --min-budget: the selected cases run as one workload by kiln::testing's
// sweep and min_budget (kiln/executor/testing/), with one line per run and a summary.
#ifndef KILN_TOOLS_KILN_OPS_METHODS_H_
#define KILN_TOOLS_KILN_OPS_METHODS_H_

#include <optional>
#include <string>
#include <vector>

#include "kiln/executor/testing/min_budget.h"
#include "kiln/executor/testing/sweep.h"
#include "suite.h"

namespace kiln::ops {

/// One faulted run of --sweep, as kiln-ops reports it.
struct SweepRunResult {
  testing::SweepRun run;
  std::string case_name;    ///< the case during which the failed request was made ("" if none)
  std::string verdict;      ///< "OK", "REFUSED <ErrorName>" or "FAIL <why>" (the worst case)
  bool ok = true;           ///< kept the contract: no case FAILed, nothing left held
};

/// What --sweep found.
struct SweepModeReport {
  SuiteReport clean;  ///< the counting run's cases (no fault), budget and peaks
  uint64_t allocations = 0;  ///< selected requests of the counting run = faulted runs
  std::vector<SweepRunResult> runs;
  int broken = 0;     ///< runs that broke the contract
  std::optional<testing::WorkloadError> error;  ///< the sweep had no answer
};

/// What --min-budget found.
struct MinBudgetModeReport {
  SuiteReport clean;  ///< the cases of the first run (the largest budget)
  std::optional<testing::BudgetReport> budget;
  std::optional<testing::WorkloadError> error;  ///< min_budget had no answer
  uint64_t granularity_bytes = 4096;
};

/// Runs the selected cases (options.filter, size limit) under kiln::testing::sweep:
/// options.config on fresh executors, options.fault as the filter (category=, min_bytes= only:
/// the command line refuses a trigger). Prints one line per run on options.out as it ends, then
/// a summary. Never throws for device answers.
[[nodiscard]] SweepModeReport run_sweep_mode(const SuiteOptions &options);
/// Bisects the budget for the selected cases under kiln::testing::min_budget, from the limit
/// options.config gives (--budget-mb, else KILN_POOL_LIMIT_MB, else the device's) down to
/// 4 KiB precision; a try passes when every case is OK. Prints the answer on options.out.
[[nodiscard]] MinBudgetModeReport run_min_budget_mode(const SuiteOptions &options);

}  // namespace kiln::ops

#endif  // KILN_TOOLS_KILN_OPS_METHODS_H_
