// The cpu executor kiln-bench and kiln-matmul-bench measure kiln with, and how both programs
// start: command line, thread count, executor.
#ifndef KILN_BENCH_CPU_EXECUTOR_H_
#define KILN_BENCH_CPU_EXECUTOR_H_

#include <cstdio>
#include <expected>
#include <memory>
#include <optional>
#include <utility>

#include "kiln/executor/errors.h"
#include "kiln/executor/executor.h"

#include "bench_main.h"
#include "host_baseline.h"

namespace kiln::bench {

/// A cpu executor with `num_threads` workers (the baseline's thread count, given explicitly), or
/// null after a line on stderr naming `program` and why (the caller exits 1).
inline std::unique_ptr<LlvmRuntimeExecutor> create_cpu_executor(unsigned num_threads,
                                                                const char *program) {
  ExecutorConfig config;
  config.backend = Backend::cpu;
  config.num_threads = num_threads;
  auto executor = LlvmRuntimeExecutor::create(config);
  if (!executor) {
    std::fprintf(stderr, "%s: could not create the cpu executor: %s\n", program,
                 describe(executor.error()).c_str());
    return nullptr;
  }
  return std::move(*executor);
}

/// What a benchmark program starts with: whether the console format is in use (initialize),
/// the host's thread count (the baseline team's), and a cpu executor with that many workers.
struct Started {
  bool console_format = true;
  unsigned threads = 0;
  std::unique_ptr<LlvmRuntimeExecutor> executor;
};

/// Starts `program` with `default_min_time` (see initialize); on failure, the exit status: 2
/// after an unrecognized argument, 1 when the executor could not be made (stderr says why).
inline std::expected<Started, int> start(int argc, char **argv, const char *default_min_time,
                                         const char *program) {
  const std::optional<bool> console_format = initialize(argc, argv, default_min_time);
  if (!console_format) return std::unexpected(2);
  const unsigned threads = host_thread_count();
  std::unique_ptr<LlvmRuntimeExecutor> executor = create_cpu_executor(threads, program);
  if (!executor) return std::unexpected(1);
  return Started{*console_format, threads, std::move(executor)};
}

}  // namespace kiln::bench

#endif  // KILN_BENCH_CPU_EXECUTOR_H_
