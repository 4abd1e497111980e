// kiln-ops: runs the operation suite on one backend and prints one verdict per case; --json and
// --junit also write it for CI systems. Exit statuses: exit_status.h (0 passed, 1 failed,
// 2 usage, 77 backend unavailable).
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "command_line.h"
#include "kiln/executor/errors.h"
#include "reports.h"

namespace kiln::ops {
namespace {

bool stdout_ok();

/// Whether a failed write to stdout was already said on stderr: said once, not again by the
/// final stdout_ok().
bool g_stdout_failure_said = false;

/// Delivers the run: the verdict lines already printed (stdout flushed), the JUnit report, then
/// the JSON report last, so that its exit_status is the one kiln-ops exits with even when an
/// earlier output failed (a full disk, a closed pipe). Returns that status: failed when any
/// output could not be written (said on stderr), else `info.exit_status`.
ExitStatus deliver(const CommandLine &cl, const SuiteReport &report, RunInfo &info) {
  const auto failed = [&info](const RhiStatus &written, const std::string &path) {
    if (written) return;
    fmt::print(stderr, "kiln-ops: {}\n", written.error().detail);  // "cannot write PATH (why)"
    info.exit_status = ExitStatus::failed;
    if (path == "-") g_stdout_failure_said = true;
  };
  if (!stdout_ok()) info.exit_status = ExitStatus::failed;
  if (!cl.junit_path.empty())
    failed(write_text(junit_report(report, info), cl.junit_path), cl.junit_path);
  if (!cl.json_path.empty()) failed(write_text(json_report(report, info), cl.json_path), cl.json_path);
  return info.exit_status;
}

/// --sweep or --min-budget over `cases` (methods.h): prints its lines, says a named error on
/// stderr, writes the reports (the first run's cases, and a "sweep" or "min_budget" object).
ExitStatus run_method(const CommandLine &cl, const std::vector<Case> &cases) {
  SweepModeReport sweep;
  MinBudgetModeReport budget;
  RunInfo info{.kiln_version = KILN_VERSION, .options = &cl.suite,
               .budget_source = cl.budget_source, .exit_status = ExitStatus::passed,
               .case_names = {}};
  for (const Case &c : cases) info.case_names.push_back(c.name);
  if (cl.sweep) {
    sweep = run_sweep_mode(cl.suite);
    info.exit_status = exit_status_of(sweep);
    info.sweep = &sweep;
  } else {
    budget = run_min_budget_mode(cl.suite);
    info.exit_status = exit_status_of(budget);
    info.min_budget = &budget;
  }
  const SuiteReport &first = cl.sweep ? sweep.clean : budget.clean;
  if (const auto &error = cl.sweep ? sweep.error : budget.error)
    fmt::print(stderr, "kiln-ops: {}\n",
               error->cause && error->kind == testing::WorkloadError::Kind::setup_failed
                   ? fmt::format("could not set up the {} backend: {}",
                                 to_string(cl.suite.config.backend),
                                 describe(*error->cause, kKilnOpsKnobs))
                   : error->describe());
  return deliver(cl, first, info);
}

/// Why `options` select no case: the size cap left none, or the filter matched none of what it
/// left.
std::string no_case_reason(const SuiteOptions &options) {
  const std::vector<Case> sized = make_cases(options.max_array_bytes);
  if (sized.empty()) {
    uint64_t smallest = UINT64_MAX;
    for (const Case &c : make_cases(UINT64_MAX)) smallest = std::min(smallest, c.max_array_bytes);
    return fmt::format("no case fits --max-array-mb {} ({}): the smallest case's arrays take {}",
                       options.max_array_bytes >> 20, format_bytes(options.max_array_bytes),
                       format_bytes(smallest));
  }
  return fmt::format("no case matches --filter '{}' (among the {} case(s) that fit "
                     "--max-array-mb {})",
                     options.filter, sized.size(), options.max_array_bytes >> 20);
}

ExitStatus run(int argc, char **argv) {
  auto parsed = parse_command_line(argc, argv);
  if (!parsed) return parsed.error();
  CommandLine &cl = *parsed;
  const std::vector<Case> cases = selected_cases(cl.suite);
  if (cases.empty())
    return usage_error(no_case_reason(cl.suite));
  if (cl.list) {
    for (const Case &c : cases) fmt::print("{}\n", c.name);
    return ExitStatus::passed;
  }
  if (cl.json_path == "-" || cl.junit_path == "-")
    cl.suite.out = stderr;  // stdout carries the report alone
  cl.suite.progress = isatty(STDERR_FILENO) != 0;
  if (cl.sweep || cl.min_budget) return run_method(cl, cases);
  const SuiteReport report = run_suite(cl.suite);
  RunInfo info{.kiln_version = KILN_VERSION,
               .options = &cl.suite,
               .budget_source = cl.budget_source,
               .exit_status = exit_status_of(report),
               .case_names = {}};
  for (const Case &c : cases) info.case_names.push_back(c.name);
  if (report.setup_failure) {
    const bool absent = info.exit_status == ExitStatus::backend_unavailable;
    const std::string_view backend = to_string(cl.suite.config.backend);
    fmt::print(stderr, "kiln-ops: {}: {}\n",
               absent ? fmt::format("the {} backend is not available here", backend)
                      : fmt::format("could not set up the {} backend", backend),
               describe(*report.setup_failure, kKilnOpsKnobs));
  }
  return deliver(cl, report, info);
}

/// Flushes stdout and says whether everything printed reached it: a full disk or a closed
/// pipe must not end in status 0 with every verdict lost.
bool stdout_ok() {
  const bool flushed = std::fflush(stdout) == 0;
  if (flushed && std::ferror(stdout) == 0) return true;
  if (g_stdout_failure_said) return false;
  g_stdout_failure_said = true;
  const int saved = errno;
  std::fprintf(stderr, "kiln-ops: could not write the results to stdout: %s\n",
               std::strerror(saved != 0 ? saved : EIO));
  return false;
}

}  // namespace
}  // namespace kiln::ops

int main(int argc, char **argv) {
  // kiln-ops never crashes: anything unexpected ends the run with a message and status 1.
  auto status = kiln::ops::ExitStatus::failed;
  try {
    status = kiln::ops::run(argc, argv);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "kiln-ops: stopped: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "kiln-ops: stopped by an unknown exception\n");
  }
  // Output lost means the run's verdicts were not delivered: never status 0 (nor 77).
  if (!kiln::ops::stdout_ok() && status != kiln::ops::ExitStatus::usage)
    status = kiln::ops::ExitStatus::failed;
  return static_cast<int>(status);
}
