// An installed kiln's user: an executor on the CPU under a 64 MiB budget; an array that fits is
// filled and summed, one that does not is a named BudgetExceeded error (not an exception, not an
// abort), and the executor is still usable after it. Prints "kiln consumer: ok" and exits 0.
#include <cstdio>
#include <vector>

#include "kiln/executor/errors.h"
#include "kiln/executor/executor.h"

int main() {
  kiln::ExecutorConfig config;
  config.backend = kiln::Backend::cpu;
  config.budget.limit_bytes = 64u << 20;
  auto executor = kiln::LlvmRuntimeExecutor::create(config);
  if (!executor) {
    std::fprintf(stderr, "create: %s\n", executor.error().message().c_str());
    return 1;
  }
  auto &ex = **executor;
  auto too_big = ex.ndarray(kiln::DataType::f32, std::vector<int64_t>{64 << 20});
  if (too_big || kiln::classify(too_big.error()) != kiln::ErrorKind::budget_exceeded) {
    std::fprintf(stderr, "a 256 MiB array under a 64 MiB budget was not BudgetExceeded\n");
    return 2;
  }
  std::printf("refused as expected: %s\n", too_big.error().message().c_str());
  auto x = ex.ndarray(kiln::DataType::f32, std::vector<int64_t>{1000});
  if (!x || !ex.fill(*x, kiln::Scalar::of(0.5))) return 3;
  auto sum = ex.reduce_sum(*x);
  if (!sum || sum->f64 != 500.0) return 4;
  if (!ex.free(*x)) return 5;
  std::printf("kiln consumer: ok\n");
  return 0;
}
