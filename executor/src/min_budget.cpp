// kiln::testing::min_budget (kiln/executor/testing/min_budget.h).
#include "kiln/executor/testing/min_budget.h"

#include <fmt/format.h>

namespace kiln::testing {
namespace {

/// One try: a fresh executor under `budget_bytes` (none: as the config says) and the workload.
struct Try {
  std::optional<Failure> refusal;  ///< the out-of-memory error it stopped at; none: succeeded
  CategoryBytes peak_bytes{};      ///< ledger peaks (a successful try)
  uint64_t limit_bytes = 0;        ///< the budget the executor had (0: the device's default)
  bool setup_refused = false;      ///< the refusal came while making the executor itself
};

KitExpected<Try> try_budget(const Workload &workload, const MinBudgetOptions &options,
                            std::optional<uint64_t> budget_bytes) {
  ExecutorConfig config = options.config;
  if (budget_bytes) config.budget.limit_bytes = *budget_bytes;
  Try result;
  result.limit_bytes = config.budget.limit_bytes.value_or(0);
  auto made = LlvmRuntimeExecutor::create(config, options.program);
  if (!made) {
    Failure cause = std::move(made).error();
    if (is_out_of_memory(classify(cause))) {  // the set-up itself did not fit the budget
      result.refusal = std::move(cause);
      result.setup_refused = true;
      return result;
    }
    std::string message = fmt::format("min_budget: could not make the executor for a try: {}",
                                      describe(cause));
    return std::unexpected(WorkloadError{WorkloadError::Kind::setup_failed, std::move(message),
                                         std::move(cause)});
  }
  LlvmRuntimeExecutor &ex = **made;
  ex.memory().fault_plan().clear();  // a KILN_FAULT armed by create() would skew the budget
  const runtime::LedgerStats before = ex.memory().stats().ledger;
  result.limit_bytes = before.limit_bytes;
  WorkloadOutcome outcome = run_workload(workload, ex);
  if (!outcome.ok_or_out_of_memory())
    return std::unexpected(WorkloadError{
        WorkloadError::Kind::not_out_of_memory,
        fmt::format("min_budget: under a budget of {} bytes the workload gave {} (not an "
                    "out-of-memory error): {}", result.limit_bytes, outcome.error_name,
                    outcome.detail),
        outcome.failure});
  if (outcome.failure) result.refusal = std::move(outcome.failure);
  result.peak_bytes = ex.memory().stats().ledger.peak_bytes;
  return result;
}

}  // namespace

KitExpected<BudgetReport> min_budget(const Workload &workload, const MinBudgetOptions &options) {
  if (options.granularity_bytes == 0 || options.max_budget_bytes == 0)
    return std::unexpected(WorkloadError{
        WorkloadError::Kind::invalid_usage,
        "min_budget: granularity_bytes and max_budget_bytes must be at least 1", std::nullopt});
  BudgetReport report;
  KILN_ASSIGN_OR_RETURN(Try largest, try_budget(workload, options, options.max_budget_bytes));
  report.runs = 1;
  report.max_budget_bytes = largest.limit_bytes;
  if (largest.setup_refused)  // the budget is too small for kiln itself, not for the workload
    return std::unexpected(WorkloadError{
        WorkloadError::Kind::setup_failed,
        fmt::format("min_budget: the executor itself does not fit the largest budget, {} bytes: "
                    "{}", largest.limit_bytes, describe(*largest.refusal)),
        largest.refusal});
  if (largest.refusal)
    return std::unexpected(WorkloadError{
        WorkloadError::Kind::fails_at_max_budget,
        fmt::format("min_budget: the workload fails even under the largest budget, {} bytes: {}",
                    largest.limit_bytes, describe(*largest.refusal)),
        largest.refusal});
  uint64_t lo = 0, hi = largest.limit_bytes;  // hi succeeded; lo failed (or is 0, untried)
  report.peak_bytes = largest.peak_bytes;
  while (hi - lo > options.granularity_bytes) {
    const uint64_t mid = lo + (hi - lo) / 2;
    KILN_ASSIGN_OR_RETURN(Try attempt, try_budget(workload, options, mid));
    ++report.runs;
    if (attempt.refusal) {
      lo = mid;
      report.refused = std::move(attempt.refusal);
      report.refused_budget_bytes = mid;
    } else {
      hi = mid;
      report.peak_bytes = attempt.peak_bytes;
    }
  }
  report.budget_bytes = hi;
  return report;
}

}  // namespace kiln::testing
