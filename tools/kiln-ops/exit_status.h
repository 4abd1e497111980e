// kiln-ops' exit statuses: what a CI system reads from a run, documented in --help and README.
#ifndef KILN_TOOLS_KILN_OPS_EXIT_STATUS_H_
#define KILN_TOOLS_KILN_OPS_EXIT_STATUS_H_

#include <string_view>

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
  backend_unavailable = 77,  ///< NotSupportedError at set-up: no driver, a stub, no device
};

/// The exit-status table printed at the end of --help (and mirrored in README.md).
inline constexpr std::string_view kExitStatusHelp =
    "Exit status:\n"
    "  0   every case passed (OK or REFUSED: a refusal is an answer, not a failure)\n"
    "  1   a case FAILed, or the run broke (set-up failed other than for an absent backend,\n"
    "      results could not be written)\n"
    "  2   usage error (bad option or value, unwritable --json/--junit path); nothing ran\n"
    "  77  the backend is not available here (no driver, a stub driver, no device:\n"
    "      NotSupportedError at set-up); automake's \"skipped\"\n";

/// The status a finished run ends with. Pure; `report` as run_suite returned it.
[[nodiscard]] ExitStatus exit_status_of(const SuiteReport &report);

/// "passed", "failed", "usage_error", "backend_unavailable": the JSON report's `status`.
[[nodiscard]] std::string_view to_string(ExitStatus status);

}  // namespace kiln::ops

#endif  // KILN_TOOLS_KILN_OPS_EXIT_STATUS_H_
