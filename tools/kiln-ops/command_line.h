// kiln-ops' command line (CLI11): every option, its check and where its value goes.
#ifndef KILN_TOOLS_KILN_OPS_COMMAND_LINE_H_
#define KILN_TOOLS_KILN_OPS_COMMAND_LINE_H_

#include <expected>
#include <string>
#include <string_view>

#include "exit_status.h"
#include "suite.h"

namespace kiln::ops {

/// What the command line asked for.
struct CommandLine {
  SuiteOptions suite;
  std::string json_path;   ///< --json: "" none, "-" stdout
  std::string junit_path;  ///< --junit: "" none, "-" stdout
  /// Where the budget's limit comes from: "--budget-mb", "KILN_POOL_LIMIT_MB" or "device".
  std::string budget_source;
  bool list = false;
  /// --sweep: the cases once per allocation request, that request failing (methods.h).
  bool sweep = false;
  /// --min-budget: the smallest budget under which the cases pass (methods.h).
  bool min_budget = false;
};

/// Parses kiln-ops' arguments (argv[0] is the program). Returns the command line, or the status
/// to exit with at once: passed after --help or --version (printed on stdout), usage after a
/// usage error (said on stderr). Each option may be given once; every value is checked here,
/// and the report paths are found writable, before anything runs. Not thread-safe (reads the
/// environment).
[[nodiscard]] std::expected<CommandLine, ExitStatus> parse_command_line(int argc, char **argv);

/// Says "kiln-ops: <why>" and where the options are listed, on stderr. Returns
/// ExitStatus::usage, also when stderr cannot be written.
ExitStatus usage_error(std::string_view why);

}  // namespace kiln::ops

#endif  // KILN_TOOLS_KILN_OPS_COMMAND_LINE_H_
