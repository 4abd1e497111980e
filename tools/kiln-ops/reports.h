// The machine-readable reports of a kiln-ops run, for CI systems: JSON (--json) and JUnit XML
// (--junit). Both are built from the same SuiteReport and RunInfo; neither runs anything.
#ifndef KILN_TOOLS_KILN_OPS_REPORTS_H_
#define KILN_TOOLS_KILN_OPS_REPORTS_H_

#include <string>
#include <string_view>
#include <vector>

#include "exit_status.h"
#include "suite.h"

namespace kiln::ops {

/// The JSON report's layout version: raised when a field changes meaning or goes away (adding
/// a field does not raise it). 1: the first versioned layout (before it, no schema_version).
inline constexpr int kJsonSchemaVersion = 1;

/// What the reports say about the run beside its cases.
struct RunInfo {
  std::string_view kiln_version;  ///< CMake's project(VERSION)
  const SuiteOptions *options = nullptr;
  /// Where the budget's limit came from: "--budget-mb", "KILN_POOL_LIMIT_MB" or "device"
  /// (the device's total minus the reserve).
  std::string budget_source;
  ExitStatus exit_status = ExitStatus::passed;
  /// The selected cases, in order: a set-up failure reports each of these as not run.
  std::vector<std::string> case_names;
  const SweepModeReport *sweep = nullptr;           ///< --sweep's findings, or null
  const MinBudgetModeReport *min_budget = nullptr;  ///< --min-budget's findings, or null
};

/// The device the run used as a user names it: "cuda", "cuda:1" (the ordinal only when not 0).
[[nodiscard]] std::string device_label(const ExecutorConfig &config);

/// The JSON report (schema in README.md, "kiln-ops"). Pure. Invalid UTF-8 in a message (a
/// driver path, say) becomes U+FFFD, never an exception.
[[nodiscard]] std::string json_report(const SuiteReport &report, const RunInfo &info);
/// The JUnit XML report: one <testsuite>, one <testcase> per case run (per repetition); a
/// REFUSED case is <skipped>, a FAIL a <failure> whose type is the kiln error's name. A set-up
/// failure gives each selected case as <skipped> (backend unavailable) or <error>. Pure.
[[nodiscard]] std::string junit_report(const SuiteReport &report, const RunInfo &info);

/// Whether `path` can be written, found out before a run ("-": stdout, always). Creates the
/// file if it is missing, leaving it empty. Errors: invalid_usage naming `flag`, the path and
/// the system's reason.
[[nodiscard]] RhiStatus check_writable(std::string_view flag, const std::string &path);
/// Writes `text` to `path` ("-": stdout, flushed), replacing the file. Errors: error naming the
/// path and the system's reason.
[[nodiscard]] RhiStatus write_text(const std::string &text, const std::string &path);

}  // namespace kiln::ops

#endif  // KILN_TOOLS_KILN_OPS_REPORTS_H_
