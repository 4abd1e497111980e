// The testing kit's workload runner and named errors (kiln/executor/testing/workload.h).
#include "kiln/executor/testing/workload.h"

#include <exception>

#include <fmt/format.h>

namespace kiln::testing {

bool WorkloadOutcome::ok_or_out_of_memory() const {
  if (error_name.empty()) return true;
  return failure.has_value() && is_out_of_memory(classify(*failure));
}

namespace {

WorkloadOutcome outcome_of(Failure failure) {
  WorkloadOutcome outcome;
  outcome.error_name = std::string(error_name(classify(failure)));
  outcome.detail = failure.message();
  outcome.failure = std::move(failure);
  return outcome;
}

}  // namespace

WorkloadOutcome run_workload(const Workload &workload, LlvmRuntimeExecutor &executor) {
  try {
    RhiStatus status = workload(executor);
    if (status) return {};
    return outcome_of(std::move(status).error());
  } catch (const Error &e) {  // value_or_throw's named errors carry their Failure
    return outcome_of(e.failure());
  } catch (const std::exception &e) {
    return WorkloadOutcome{.failure = std::nullopt, .error_name = "C++ exception", .detail = e.what()};
  } catch (...) {
    return WorkloadOutcome{.failure = std::nullopt, .error_name = "C++ exception",
                           .detail = "an exception of unknown type"};
  }
}

std::string_view WorkloadError::name() const {
  switch (kind) {
    case Kind::invalid_usage: return "InvalidUsageError";
    case Kind::setup_failed: return cause ? error_name(classify(*cause)) : "RuntimeFaultError";
    case Kind::fails_without_fault:
    case Kind::selects_nothing: return "SweepError";
    case Kind::nondeterministic: return "NondeterministicWorkloadError";
    case Kind::fails_at_max_budget:
    case Kind::not_out_of_memory: return "MinBudgetError";
  }
  return "SweepError";
}

std::string WorkloadError::describe() const { return fmt::format("{}: {}", name(), message); }

}  // namespace kiln::testing
