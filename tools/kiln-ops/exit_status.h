// kiln-ops' exit statuses: what a CI system reads from a run, documented in --help and README.
#ifndef KILN_TOOLS_KILN_OPS_EXIT_STATUS_H_
#define KILN_TOOLS_KILN_OPS_EXIT_STATUS_H_

#include <string_view>

#include "methods.h"
#include "suite.h"

namespace kiln::ops {

/// The values follow conventions CI systems already know: 2 for bad usage (getopt tools,
/// CLI11, Python's argparse) and automake's test-driver 77 for "skipped", so a job can tell a
/// backend that is absent on this machine from one that is broken. New statuses take new
/// values; these never change meaning.
enum class ExitStatus : int {
  passed = 0,                ///< no case FAILed (a refusal is an answer, not a failure)
  failed = 1,                ///< a case FAILed, or the run broke (set-up failed for another
                             ///< reason than an absent backend, results could not be written)
  usage = 2,                 ///< bad command line; nothing ran
  no_answer = 3,             ///< --sweep / --min-budget had no answer (SweepError,
                             ///< NondeterministicWorkloadError, MinBudgetError)
  backend_unavailable = 77,  ///< NotSupportedError at set-up: no driver, a stub, no device
};

/// The exit-status table printed at the end of --help (and mirrored in README.md).
inline constexpr std::string_view kExitStatusHelp =
    "Exit status:\n"
    "  0   every case passed (OK or REFUSED: a refusal is an answer, not a failure);\n"
    "      --sweep: every run kept the contract; --min-budget: the budget was found\n"
    "  1   a case FAILed, a --sweep run broke the contract (a case FAILed, an error other\n"
    "      than out-of-memory, memory left held), or the run broke (set-up failed other\n"
    "      than for an absent backend, results could not be written)\n"
    "  2   usage error (bad option or value, unwritable --json/--junit path, conflicting\n"
    "      --sweep/--min-budget options); nothing ran\n"
    "  3   --sweep or --min-budget has no answer: the cases do not pass without a fault\n"
    "      (SweepError) or under the largest budget (MinBudgetError), make no request a\n"
    "      sweep could fail (SweepError), or allocate differently on each run\n"
    "      (NondeterministicWorkloadError)\n"
    "  77  the backend is not available here (no driver, a stub driver, no device:\n"
    "      NotSupportedError at set-up); automake's \"skipped\"\n";

/// The status a finished run ends with. Pure; `report` as run_suite returned it.
[[nodiscard]] ExitStatus exit_status_of(const SuiteReport &report);

/// The status of a --sweep: failed when a run broke the contract, no_answer for a named
/// error, backend_unavailable / failed when an executor could not be made. Pure.
[[nodiscard]] ExitStatus exit_status_of(const SweepModeReport &report);
/// The status of a --min-budget: passed with an answer, else as for a sweep. Pure.
[[nodiscard]] ExitStatus exit_status_of(const MinBudgetModeReport &report);

/// "passed", "failed", "usage_error", "backend_unavailable", "no_answer": the JSON report's `status`.
[[nodiscard]] std::string_view to_string(ExitStatus status);

}  // namespace kiln::ops

#endif  // KILN_TOOLS_KILN_OPS_EXIT_STATUS_H_
