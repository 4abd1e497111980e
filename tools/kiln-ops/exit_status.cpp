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

std::string_view to_string(ExitStatus status) {
  switch (status) {
    case ExitStatus::passed: return "passed";
    case ExitStatus::failed: return "failed";
    case ExitStatus::usage: return "usage_error";
    case ExitStatus::backend_unavailable: return "backend_unavailable";
  }
  return "unknown";
}

}  // namespace kiln::ops
