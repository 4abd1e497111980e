#include "exit_status.h"

#include "kiln/executor/errors.h"

namespace kiln::ops {

ExitStatus exit_status_of(const SuiteReport &report) {
  // A failed case is never hidden behind "skipped" (a later repetition's set-up may fail).
  if (report.failed != 0) return ExitStatus::failed;
  if (report.setup_failure)
    return classify(*report.setup_failure) == ErrorKind::not_supported
               ? ExitStatus::backend_unavailable
               : ExitStatus::failed;
  return report.failed == 0 ? ExitStatus::passed : ExitStatus::failed;
}

namespace {

/// The status for a method's named error (kiln::testing::WorkloadError).
ExitStatus status_of(const testing::WorkloadError &error) {
  if (error.kind == testing::WorkloadError::Kind::invalid_usage) return ExitStatus::usage;
  if (error.kind != testing::WorkloadError::Kind::setup_failed) return ExitStatus::no_answer;
  return error.cause && classify(*error.cause) == ErrorKind::not_supported
             ? ExitStatus::backend_unavailable
             : ExitStatus::failed;
}

}  // namespace

ExitStatus exit_status_of(const SweepModeReport &report) {
  if (report.error) return status_of(*report.error);
  return report.broken == 0 ? ExitStatus::passed : ExitStatus::failed;
}

ExitStatus exit_status_of(const MinBudgetModeReport &report) {
  return report.error ? status_of(*report.error) : ExitStatus::passed;
}

std::string_view to_string(ExitStatus status) {
  switch (status) {
    case ExitStatus::passed: return "passed";
    case ExitStatus::failed: return "failed";
    case ExitStatus::usage: return "usage_error";
    case ExitStatus::no_answer: return "no_answer";
    case ExitStatus::backend_unavailable: return "backend_unavailable";
  }
  return "unknown";
}

}  // namespace kiln::ops
