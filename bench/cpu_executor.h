// The cpu executor kiln-bench and kiln-matmul-bench measure kiln with.
#ifndef KILN_BENCH_CPU_EXECUTOR_H_
#define KILN_BENCH_CPU_EXECUTOR_H_

#include <cstdio>
#include <memory>

#include "kiln/executor/errors.h"
#include "kiln/executor/executor.h"

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

}  // namespace kiln::bench

#endif  // KILN_BENCH_CPU_EXECUTOR_H_
