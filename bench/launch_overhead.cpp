// kiln-bench's launch-overhead pair (launch_overhead.h).
#include "launch_overhead.h"

#include <memory>

#include "kiln/executor/errors.h"
#include "kiln/runtime/cpu_jit.h"
#include "kiln/runtime/kernel_abi.h"

namespace kiln::bench {

void bench_launch_one_element(benchmark::State &state, LlvmRuntimeExecutor *executor) {
  const int64_t shape[] = {1};
  auto array = executor->ndarray(DataType::f32, shape);
  if (!array) {
    state.SkipWithError(describe(array.error()).c_str());
    return;
  }
  for (auto _ : state) {
    auto status = executor->fill(*array, Scalar::of(1.0));
    if (!status) {
      state.SkipWithError(describe(status.error()).c_str());
      break;
    }
  }
}

void bench_jit_call_one_element(benchmark::State &state) {
  static RhiExpected<std::unique_ptr<runtime::CpuJit>> jit = runtime::CpuJit::create();
  if (!jit) {
    state.SkipWithError(describe(jit.error()).c_str());
    return;
  }
  auto kernel = (*jit)->lookup_kernel(kLaunchOverheadKernel);
  if (!kernel) {
    state.SkipWithError(describe(kernel.error()).c_str());
    return;
  }
  float element = 0.0f;
  KilnRuntime runtime{};
  KilnKernelArgs args{};
  args.ptr[0] = reinterpret_cast<uintptr_t>(&element);
  args.num_elements = 1;
  args.scalar_f64 = 1.0;
  args.num_tasks = 1;
  args.iteration_size = 1;
  for (auto _ : state) {
    (*kernel)(&runtime, &args, 0, 1, 0);
    benchmark::ClobberMemory();
  }
  benchmark::DoNotOptimize(element);
}

}  // namespace kiln::bench
