#include "command_line.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <functional>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "kiln/runtime/memory/fault_spec.h"
#include "reports.h"

namespace kiln::ops {
namespace {

constexpr std::string_view kEnvironmentHelp =
    "Environment:\n"
    "  KILN_POOL_LIMIT_MB  the budget in MiB when --budget-mb is not given\n"
    "  KILN_FAULT          a fault spec armed as --fault when neither --fault nor --fault-at is "
    "given\n"
    "                      (not by --sweep and --min-budget, which set faults and budgets)\n"
    "  KILN_CUDA_DRIVER    the CUDA driver library to load (default libcuda.so.1)\n"
    "  KILN_HIP_RUNTIME    the HIP runtime library to load (default libamdhip64.so)\n";

/// A bad value: the message is the whole usage error (CLI11 would prefix the option's name).
[[noreturn]] void bad_value(std::string message) { throw CLI::ValidationError(std::move(message)); }

/// The value of `flag`, refused when it is empty or is another option (CLI11 takes the next
/// argument as the value, even "--list"). `noun`: what the value is ("a file name").
const std::string &checked_text(const std::string &flag, const std::string &value,
                                std::string_view noun = "a value") {
  if (value.empty()) bad_value(fmt::format("{} needs {}, got an empty one", flag, noun));
  if (value.starts_with("--") && value.size() > 2)
    bad_value(fmt::format("{} needs a value, got the option {}", flag, value));
  return value;
}

/// A decimal integer in [min, max]: no sign, no base prefix, no fraction.
uint64_t checked_integer(const std::string &flag, const std::string &value, uint64_t min,
                         uint64_t max) {
  checked_text(flag, value);
  uint64_t n = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), n);
  if (ec == std::errc::invalid_argument || end != value.data() + value.size())
    bad_value(fmt::format("{} needs a non-negative integer, got '{}'", flag, value));
  if (ec == std::errc::result_out_of_range || n < min || n > max)
    bad_value(fmt::format("{} {} is out of range ({} to {})", flag, value, min, max));
  return n;
}

/// Adds an option taking one value; `store` checks the text and keeps what it means.
/// A second occurrence is refused after parsing (misuse_after_parse).
CLI::Option *add_value(CLI::App &app, const std::string &flag, const std::string &value_name,
                       const std::string &help, std::function<void(const std::string &)> store) {
  return app
      .add_option_function<std::string>(
          flag,
          [flag, store, noun = value_name == "PATH" ? "a file name" : "a value"](
              const std::string &value) { store(checked_text(flag, value, noun)); },
          help)
      ->option_text(value_name)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

/// Adds an option taking a size in MiB, at least `min_mib`; `store` receives bytes (at most
/// 2**64 - 1).
void add_mib(CLI::App &app, const std::string &flag, const std::string &help,
             std::function<void(uint64_t)> store, uint64_t min_mib = 0) {
  add_value(app, flag, "N", help, [flag, store, min_mib](const std::string &value) {
    store(checked_integer(flag, value, min_mib, UINT64_MAX >> 20) << 20);
  });
}

void add_options(CLI::App &app, CommandLine &cl, bool &version) {
  ExecutorConfig &config = cl.suite.config;
  add_value(app, "--backend", "cpu|mock|cuda[:N]|amdgpu[:N]",
            "device to run on (default cpu; cuda loads KILN_CUDA_DRIVER or libcuda.so.1, amdgpu "
            "KILN_HIP_RUNTIME or libamdhip64.so; :N picks the driver's device N, default 0)",
            [&config](const std::string &value) {
              auto device = parse_device_name(value);
              if (!device) bad_value(device.error().detail);
              const bool one_device = device->backend == Backend::cpu || device->backend == Backend::mock;
              if (one_device && device->ordinal != 0)  // a bad option value, known before set-up
                bad_value(fmt::format("{}: the {} backend has one device, {}:0", value,
                                      to_string(device->backend), to_string(device->backend)));
              config.backend = device->backend;
              config.device_ordinal = device->ordinal;
            });
  add_mib(app, "--budget-mb",
          "fixed memory budget in MiB (else KILN_POOL_LIMIT_MB, else device total minus reserve)",
          // A budget of 0 holds nothing, not even the runtime: a usage mistake, not a refusal.
          [&config](uint64_t bytes) { config.budget.limit_bytes = bytes; }, /*min_mib=*/1);
  add_mib(app, "--heap-mb",
          "device heap chunk for kernels that allocate while running (default 16)",
          [&config](uint64_t bytes) { config.device_heap_bytes = bytes; });
  add_mib(app, "--max-array-mb",
          "skip cases whose arrays exceed N MiB (default 256 on cpu, 16 on mock)",
          [&cl](uint64_t bytes) { cl.suite.max_array_bytes = bytes; });
  add_mib(app, "--mock-capacity-mb", "capacity of the mock device (default 1024)",
          [&config](uint64_t bytes) { config.mock.capacity_bytes = bytes; });
  add_value(app, "--filter", "REGEX", "run only the cases whose name matches REGEX (RE2 syntax)",
            [&cl](const std::string &value) {
              if (auto valid = check_filter(value); !valid) bad_value(valid.error().detail);
              cl.suite.filter = value;
            });
  add_value(app, "--repeat", "N",
            "run the suite N times (1 to 1000000), each with a fresh executor",
            [&cl](const std::string &value) {
              cl.suite.repeat = static_cast<int>(checked_integer("--repeat", value, 1, 1000000));
            });
  add_value(
      app, "--fault-at", "N",
      "the N-th allocation, counted from the first case, fails (out of memory); 0 injects nothing",
      [&cl](const std::string &value) {
        cl.suite.fault_at = checked_integer("--fault-at", value, 0, UINT64_MAX);
      });
  add_value(app, "--fault", "SPEC",
            "a fault spec armed from the first case of each repetition, e.g. nth=3, "
            "nth=2,category=staging, min_bytes=64MiB, p=0.25,seed=7 (grammar: README, Targeted faults)",
            [&cl](const std::string &value) {
              auto spec = runtime::FaultSpec::parse(value);
              if (!spec) bad_value(fmt::format("--fault: {}", spec.error().detail));
              if (auto known = check_fault_kernel(*spec, user_kernel_case_names()); !known)
                bad_value(fmt::format("--fault: {}", known.error().detail));
              cl.suite.fault = *spec;
            });
  add_value(app, "--threads", "N", "CPU worker threads (default: all cores; at most 4096)",
            [&config](const std::string &value) {
              config.num_threads =
                  static_cast<unsigned>(checked_integer("--threads", value, 0, 4096));
            });
  add_value(app, "--json", "PATH",
            "also write the results as JSON ('-': to stdout, the verdict lines then go to stderr)",
            [&cl](const std::string &value) { cl.json_path = value; });
  add_value(app, "--junit", "PATH",
            "also write the results as JUnit XML, one testcase per case ('-': to stdout)",
            [&cl](const std::string &value) { cl.junit_path = value; });
  app.add_flag("--sweep", cl.sweep,
               "run the cases once to count their allocation requests, then once per request "
               "with that one failing; one line per run (exit 1 if a run broke the contract: a "
               "case FAILed or memory was left held). --fault with category=/min_bytes=/kernel= sweeps "
               "only the requests it selects (none selected: exit 3). Runs: 1 + requests (313 on "
               "cpu for all cases; use --filter)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("--min-budget", cl.min_budget,
               "bisect the budget (from --budget-mb, KILN_POOL_LIMIT_MB or the device's) for "
               "the smallest one under which every case is OK, to 4 KiB; prints it, its peak "
               "per category and the request refused just below it")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("--list", cl.list, "print the case names and exit")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_flag("--version", version, "print kiln's version and exit")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
}

/// "--budget-mb" from CLI11's "--budget-mb: 1 required N missing"; empty for another mismatch.
std::string option_missing_its_value(const CLI::ArgumentMismatch &e) {
  const std::string_view what = e.what();
  const std::size_t colon = what.find(": ");
  if (!what.starts_with("--") || colon == std::string_view::npos || !what.ends_with(" missing"))
    return {};
  return std::string(what.substr(0, colon));
}

/// The first option given more than once, or an argument no option took; empty when none.
std::string misuse_after_parse(const CLI::App &app) {
  for (const CLI::Option *option : app.get_options())
    if (option->count() > 1) return fmt::format("{} is given more than once", option->get_name());
  const std::vector<std::string> extras = app.remaining();
  if (extras.empty()) return {};
  return extras[0].starts_with("-") ? fmt::format("unknown option {}", extras[0])
                                    : fmt::format("unexpected argument '{}'", extras[0]);
}

/// The options --sweep and --min-budget exclude, named; empty when none is given.
std::string method_conflict(const CommandLine &cl, const CLI::App &app) {
  if (cl.sweep && cl.min_budget) return "--sweep and --min-budget cannot both be given (one method per run)";
  if (!cl.sweep && !cl.min_budget) return {};
  const char *method = cl.sweep ? "--sweep" : "--min-budget";
  if (cl.suite.repeat > 1)
    return fmt::format("{} and --repeat {} cannot both be given ({} runs the cases as many "
                       "times as it needs)", method, cl.suite.repeat, method);
  if (app.count("--fault-at") != 0)
    return fmt::format("{} and --fault-at cannot both be given ({})", method,
                       cl.sweep ? "the sweep fails each request in turn"
                                : "a fault would refuse every budget");
  if (cl.min_budget && app.count("--fault") != 0)
    return "--min-budget and --fault cannot both be given (a fault would refuse every budget)";
  if (cl.sweep && cl.suite.fault && cl.suite.fault->kind != runtime::FaultKind::oom)
    return fmt::format("--sweep takes --fault of kind=oom only (the sweep checks the "
                       "out-of-memory contract), got '{}'", cl.suite.fault->to_text());
  if (cl.sweep && cl.suite.fault && (cl.suite.fault->nth != 0 || cl.suite.fault->probability))
    return fmt::format("--sweep takes --fault with category=, min_bytes= and kernel= terms only (the "
                       "sweep sets nth itself), got '{}'", cl.suite.fault->to_text());
  return {};
}

/// Checks that need every option: the report paths, and the size limit the backend implies.
std::string finish(CommandLine &cl, const CLI::App &app) {
  if (!cl.json_path.empty() && cl.json_path == cl.junit_path)
    return fmt::format("--json and --junit both write to {}",
                       cl.json_path == "-" ? "stdout" : cl.json_path);
  for (const auto &[flag, path] :
       {std::pair{"--json", &cl.json_path}, std::pair{"--junit", &cl.junit_path}})
    if (!cl.list && !path->empty())
      if (auto writable = check_writable(flag, *path); !writable) return writable.error().detail;
  if (app.count("--fault") != 0 && app.count("--fault-at") != 0)
    return "--fault and --fault-at cannot both be given (one fault setting per run)";
  if (std::string conflict = method_conflict(cl, app); !conflict.empty()) return conflict;
  // KILN_FAULT is checked even when a flag overrides it: every executor checks it too.
  auto env_fault = runtime::fault_spec_from_env();
  if (!env_fault) return env_fault.error().detail;
  if (*env_fault)
    if (auto known = check_fault_kernel(**env_fault); !known)
      return fmt::format("KILN_FAULT: {}", known.error().detail);
  const bool method = cl.sweep || cl.min_budget;  // they arm or clear the plan themselves
  if (app.count("--fault") == 0 && app.count("--fault-at") == 0 && !method)
    cl.suite.fault = *env_fault;
  if (app.count("--max-array-mb") == 0 && cl.suite.config.backend == Backend::mock)
    cl.suite.max_array_bytes = 16ull << 20;
  // As the runtime reads it (budget_config.cpp): set and not empty.
  const char *env_limit = std::getenv("KILN_POOL_LIMIT_MB");
  const bool env_limit_set = env_limit != nullptr && *env_limit != '\0';
  cl.budget_source = app.count("--budget-mb") != 0 ? "--budget-mb"
                     : env_limit_set                ? "KILN_POOL_LIMIT_MB"
                                                    : "device";
  return {};
}

}  // namespace

ExitStatus usage_error(std::string_view why) {
  // fputs, not fmt::print: a full stderr must not turn status 2 into an exception (status 1).
  (void)std::fputs(
      fmt::format("kiln-ops: {}\nrun 'kiln-ops --help' for the options\n", why).c_str(), stderr);
  return ExitStatus::usage;
}

std::expected<CommandLine, ExitStatus> parse_command_line(int argc, char **argv) {
  CommandLine cl;
  bool version = false;
  CLI::App app(
      "kiln-ops: runs kiln's operation cases on one backend, one verdict line per case "
      "(OK, FAIL or REFUSED with the named error).",
      "kiln-ops");
  app.allow_extras();  // named by misuse_after_parse, in kiln-ops' words
  app.footer(fmt::format("{}\n{}", kEnvironmentHelp, kExitStatusHelp));
  add_options(app, cl, version);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp &) {
    fmt::print("{}", app.help());
    return std::unexpected(ExitStatus::passed);
  } catch (const CLI::ArgumentMismatch &e) {
    const std::string flag = option_missing_its_value(e);
    return std::unexpected(
        usage_error(flag.empty() ? e.what() : fmt::format("{} needs a value", flag)));
  } catch (const CLI::ParseError &e) {
    return std::unexpected(usage_error(e.what()));
  }
  if (std::string misuse = misuse_after_parse(app); !misuse.empty())
    return std::unexpected(usage_error(misuse));
  if (version) {
    fmt::print("kiln-ops {}\n", KILN_VERSION);
    return std::unexpected(ExitStatus::passed);
  }
  if (std::string problem = finish(cl, app); !problem.empty())
    return std::unexpected(usage_error(problem));
  return cl;
}

}  // namespace kiln::ops
