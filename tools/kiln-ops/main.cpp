// kiln-ops: runs the operation suite on one backend and prints one verdict per case.
// Exit status: 0 when no case FAILed (a refusal is not a failure), 1 when one did or the
// executor could not be set up, 2 on bad usage.
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstring>
#include <cstdio>
#include <set>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "suite.h"

namespace {

constexpr const char *kUsage = R"(usage: kiln-ops [options]
  --backend cpu|mock|cuda|amdgpu
                         device to run on (default cpu; cuda loads KILN_CUDA_DRIVER or
                         libcuda.so.1; amdgpu loads KILN_HIP_RUNTIME or libamdhip64.so)
  --budget-mb N          fixed memory budget for this run, in MiB (else KILN_POOL_LIMIT_MB, else
                         device total minus reserve)
  --heap-mb N            device heap chunk for kernels that allocate while running (default 16)
  --max-array-mb N       skip cases whose arrays exceed N MiB (default 256 on cpu, 16 on mock)
  --mock-capacity-mb N   capacity of the mock device (default 1024)
  --filter REGEX         run only cases whose name matches REGEX (RE2 syntax)
  --repeat N             run the suite N times, each with a fresh executor
  --fault-at N           the N-th allocation, counted from the first case, fails (out of
                         memory); 0 injects nothing
  --threads N            CPU worker threads (default: all cores)
  --json PATH            also write the results as JSON ('-': to stdout, the verdict lines
                         then go to stderr)
  --list                 print the case names and exit
  --help                 this text
)";

struct Args {
  kiln::ops::SuiteOptions suite;
  std::string json_path;
  bool list = false;
  bool max_array_set = false;
};

bool parse_u64(std::string_view text, uint64_t *out) {
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
  return ec == std::errc() && ptr == text.data() + text.size();
}

bool is_numeric_flag(std::string_view flag) {
  for (std::string_view f : {"--budget-mb", "--heap-mb", "--max-array-mb", "--mock-capacity-mb",
                             "--repeat", "--fault-at", "--threads"})
    if (flag == f) return true;
  return false;
}

// Status 2 even when stderr cannot be written (fmt::print would throw, and end in status 1).
int usage_error(const std::string &why) {
  (void)std::fputs(fmt::format("kiln-ops: {}\n{}", why, kUsage).c_str(), stderr);
  return 2;
}

// Returns 0 to go on, or the exit status. Every option may be given once; a repeated one is a
// usage error (which value was meant cannot be known).
int parse_args(int argc, char **argv, Args &args) {
  kiln::ExecutorConfig &config = args.suite.config;
  std::set<std::string_view> seen;
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    const bool known = flag == "--help" || flag == "-h" || flag == "--list" || flag == "--backend" ||
                       flag == "--filter" || flag == "--json" || is_numeric_flag(flag);
    if (known && !seen.insert(flag).second)
      return usage_error(fmt::format("{} is given more than once", flag));
    if (flag == "--help" || flag == "-h") {
      fmt::print("{}", kUsage);
      return -1;
    }
    if (flag == "--list") {
      args.list = true;
      continue;
    }
    const bool takes_text = flag == "--backend" || flag == "--filter" || flag == "--json";
    if (!takes_text && !is_numeric_flag(flag)) return usage_error(fmt::format("unknown option {}", flag));
    if (i + 1 >= argc) return usage_error(fmt::format("{} needs a value", flag));
    const std::string_view value = argv[++i];
    uint64_t n = 0;
    const bool numeric = parse_u64(value, &n);
    const bool mb_ok = numeric && n <= (UINT64_MAX >> 20);
    if (value.starts_with("--") && value.size() > 2)
      return usage_error(fmt::format("{} needs a value, got the option {}", flag, value));
    if (flag == "--backend") {
      auto backend = kiln::parse_backend(value);
      if (!backend) return usage_error(backend.error().detail);
      config.backend = *backend;
    } else if (flag == "--filter") {
      if (auto valid = kiln::ops::check_filter(std::string(value)); !valid)
        return usage_error(valid.error().detail);
      args.suite.filter = value;
    } else if (flag == "--json") {
      if (value.empty()) return usage_error("--json needs a file name, got an empty one");
      args.json_path = value;
    } else if (!numeric) {
      return usage_error(fmt::format("{} needs a non-negative integer, got '{}'", flag, value));
    } else if (flag == "--budget-mb" && mb_ok) {
      config.budget.limit_bytes = n << 20;
    } else if (flag == "--heap-mb" && mb_ok) {
      config.device_heap_bytes = n << 20;
    } else if (flag == "--max-array-mb" && mb_ok) {
      args.suite.max_array_bytes = n << 20;
      args.max_array_set = true;
    } else if (flag == "--mock-capacity-mb" && mb_ok) {
      config.mock.capacity_bytes = n << 20;
    } else if (flag == "--repeat" && n >= 1 && n <= 1000000) {
      args.suite.repeat = static_cast<int>(n);
    } else if (flag == "--fault-at") {
      args.suite.fault_at = n;
    } else if (flag == "--threads" && n <= 4096) {
      config.num_threads = static_cast<unsigned>(n);
    } else {
      return usage_error(fmt::format("{} {} is out of range", flag, value));
    }
  }
  if (!args.max_array_set && config.backend == kiln::Backend::mock)
    args.suite.max_array_bytes = 16ull << 20;
  return 0;
}

}  // namespace

int run(int argc, char **argv) {
  Args args;
  if (int status = parse_args(argc, argv, args); status != 0) return status < 0 ? 0 : status;
  const std::vector<kiln::ops::Case> cases = kiln::ops::selected_cases(args.suite);
  if (cases.empty()) return usage_error(fmt::format("no case matches --filter '{}'", args.suite.filter));
  if (args.list) {
    for (const auto &c : cases) fmt::print("{}\n", c.name);
    return 0;
  }
  if (args.json_path == "-") {
    args.suite.out = stderr;  // stdout carries the JSON alone
  } else if (!args.json_path.empty()) {
    // Find out now, not after a long run, that the results cannot be written.
    std::FILE *probe = std::fopen(args.json_path.c_str(), "a");
    if (probe == nullptr) return usage_error(fmt::format("--json {}: cannot write there", args.json_path));
    std::fclose(probe);
  }
  args.suite.progress = isatty(STDERR_FILENO) != 0;
  const kiln::ops::SuiteReport report = kiln::ops::run_suite(args.suite);
  if (!args.json_path.empty()) {
    if (auto written = kiln::ops::write_json(report, args.json_path); !written) {
      fmt::print(stderr, "{}\n", written.error().message());
      return 1;
    }
  }
  if (report.setup_failure) {
    fmt::print(stderr, "kiln-ops: could not set up the {} backend: {}\n",
               kiln::to_string(args.suite.config.backend),
               kiln::describe(*report.setup_failure, kiln::ops::kKilnOpsKnobs));
    return 1;
  }
  return report.failed == 0 ? 0 : 1;
}

/// Flushes stdout and says whether everything printed reached it: a full disk or a closed
/// pipe must not end in status 0 with every verdict lost.
bool stdout_ok() {
  const bool flushed = std::fflush(stdout) == 0;
  if (flushed && std::ferror(stdout) == 0) return true;
  const int saved = errno;
  std::fprintf(stderr, "kiln-ops: could not write the results to stdout: %s\n",
               std::strerror(saved != 0 ? saved : EIO));
  return false;
}

int main(int argc, char **argv) {
  // kiln-ops never crashes: anything unexpected ends the run with a message and status 1.
  int status = 1;
  try {
    status = run(argc, argv);
  } catch (const std::exception &e) {
    std::fprintf(stderr, "kiln-ops: stopped: %s\n", e.what());
  } catch (...) {
    std::fprintf(stderr, "kiln-ops: stopped by an unknown exception\n");
  }
  if (!stdout_ok() && status == 0) status = 1;
  return status;
}
