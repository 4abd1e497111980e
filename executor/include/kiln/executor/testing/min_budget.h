// kiln::testing::min_budget: the smallest memory budget under which a workload succeeds, by
// bisection. The C++ counterpart of Python's kiln.testing.min_budget (_min_budget.py).
#ifndef KILN_EXECUTOR_TESTING_MIN_BUDGET_H_
#define KILN_EXECUTOR_TESTING_MIN_BUDGET_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "kiln/executor/testing/workload.h"

namespace kiln::testing {

/// What min_budget found.
struct BudgetReport {
  uint64_t budget_bytes = 0;   ///< the smallest budget found under which the workload succeeds
  uint64_t max_budget_bytes = 0;  ///< the largest budget, where the bisection started
  CategoryBytes peak_bytes{};  ///< ledger peaks per category in the run at budget_bytes
  /// The refusal of the run just below budget_bytes (the largest budget that failed); none when
  /// every try succeeded (the workload fits in budget_bytes <= granularity).
  std::optional<Failure> refused;
  uint64_t refused_budget_bytes = 0;  ///< the budget of that run
  int runs = 0;                       ///< workload runs (executors made)
};

struct MinBudgetOptions {
  /// Each try gets a fresh executor from it, config.budget.limit_bytes replaced by the budget
  /// tried (the budget holds the executor's own set-up too: runtime state, heap chunk, code).
  ExecutorConfig config;
  std::shared_ptr<Program> program;  ///< shared by the tries; null: as LlvmRuntimeExecutor::create
  /// The largest budget tried first. None: the limit `config` gives (its limit_bytes, else
  /// KILN_POOL_LIMIT_MB, else the device's total minus its reserve).
  std::optional<uint64_t> max_budget_bytes;
  uint64_t granularity_bytes = 4096;  ///< the precision of the answer (>= 1)
};

/// The smallest budget (bytes) under which `workload` succeeds, by bisection between 0 and the
/// largest budget: one run at the largest budget, then ceil(log2(max / granularity)) runs, each
/// on a fresh executor (e.g. 18 for 1 GiB at 4 KiB). A run succeeds when create() and the
/// workload succeed; it fails when either gives an out-of-memory error. The answer is exact to
/// `granularity_bytes`: the workload succeeded at budget_bytes and failed at
/// budget_bytes - granularity_bytes or more (refused_budget_bytes), unless budget_bytes <=
/// granularity_bytes. The workload must be deterministic (more budget never hurts). A
/// KILN_FAULT armed by create() is cleared before each run.
/// Errors (WorkloadError): invalid_usage (granularity 0, max budget 0), setup_failed (an
/// executor could not be made for a reason other than out of memory, or the executor itself
/// does not fit the largest budget: the cause is its out-of-memory error), fails_at_max_budget (the
/// workload fails under the largest budget: "MinBudgetError"), not_out_of_memory (a try gave
/// another error than OOM: "MinBudgetError", the cause attached). Not thread-safe.
[[nodiscard]] KitExpected<BudgetReport> min_budget(const Workload &workload,
                                                   const MinBudgetOptions &options);

}  // namespace kiln::testing

#endif  // KILN_EXECUTOR_TESTING_MIN_BUDGET_H_
