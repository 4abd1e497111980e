// The testing kit's workloads (kiln::testing): a callable run against an executor the kit makes,
// what one run of it gave, and the named errors of the kit's methods (sweep, min_budget).
#ifndef KILN_EXECUTOR_TESTING_WORKLOAD_H_
#define KILN_EXECUTOR_TESTING_WORKLOAD_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/executor/errors.h"
#include "kiln/executor/executor.h"

namespace kiln::testing {

/// A workload: the code under test, run on the executor the kit made for this run (a fresh one
/// per run, so nothing is carried from one run to the next). It returns success or the failure
/// it stopped at, or throws (kiln::Error from value_or_throw counts as its failure; any other
/// exception is caught and judged as "another error"). It must make its own arrays and must not
/// keep the executor. Deterministic workloads only: the kit re-runs it many times.
using Workload = std::function<RhiStatus(LlvmRuntimeExecutor &)>;

/// What one run of a workload gave.
struct WorkloadOutcome {
  std::optional<Failure> failure;  ///< its failure (a kiln::Error thrown counts); none: success
  std::string error_name;          ///< "" on success; the named error ("BudgetExceededError",
                                   ///< ...), or "C++ exception" for anything else thrown
  std::string detail;              ///< the failure's message, or the exception's what()
  /// Whether it succeeded or stopped at an out-of-memory error (the kit's contract).
  [[nodiscard]] bool ok_or_out_of_memory() const;
};

/// Runs `workload` on `executor`, catching every exception (kiln::Error: its Failure; anything
/// else: error_name "C++ exception"). Thread-safe as far as the workload is.
[[nodiscard]] WorkloadOutcome run_workload(const Workload &workload, LlvmRuntimeExecutor &executor);

/// Why a method of the kit (sweep, min_budget) has no answer. Named like kiln's Python
/// kiln.testing errors (see name()).
struct WorkloadError {
  enum class Kind : uint8_t {
    invalid_usage,         ///< bad options (a filter with a trigger, a granularity of 0)
    setup_failed,          ///< an executor for a run could not be made (`cause` says why)
    fails_without_fault,   ///< sweep: the counting run (no fault) did not succeed
    nondeterministic,      ///< a run made fewer requests than the counting run promised
    selects_nothing,       ///< sweep: the counting run made no (selected) request: nothing to test
    fails_at_max_budget,   ///< min_budget: the workload fails under the largest budget
    not_out_of_memory,     ///< min_budget: a smaller budget gave an error other than OOM
  };
  Kind kind = Kind::invalid_usage;
  std::string message;           ///< what was wrong, with the figures
  std::optional<Failure> cause;  ///< the failure behind it, when there is one

  /// "InvalidUsageError", the cause's name (setup_failed), "SweepError",
  /// "NondeterministicWorkloadError" or "MinBudgetError": Python kiln.testing's class names.
  [[nodiscard]] std::string_view name() const;
  /// "<name>: <message>".
  [[nodiscard]] std::string describe() const;
};

/// A result of the kit: T, or the named error saying why there is none.
template <class T>
using KitExpected = std::expected<T, WorkloadError>;

}  // namespace kiln::testing

#endif  // KILN_EXECUTOR_TESTING_WORKLOAD_H_
