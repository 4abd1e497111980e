// kiln-bench's launch-overhead pair: a whole 1-element launch through the executor beside a
// direct call of the same JIT-compiled kernel, so the runtime's own cost per launch (validation,
// the launch's argument and result buffers, the thread pool, the device-error check) is the
// difference of two numbers measured in the same run.
#ifndef KILN_BENCH_LAUNCH_OVERHEAD_H_
#define KILN_BENCH_LAUNCH_OVERHEAD_H_

#include <benchmark/benchmark.h>

#include "kiln/executor/executor.h"

namespace kiln::bench {

/// The kernel both cases run: kiln_fill_f32 on one element.
inline constexpr const char *kLaunchOverheadKernel = "kiln_fill_f32";

/// `executor.fill` of a 1-element f32 array per iteration (the array is made once, untimed).
void bench_launch_one_element(benchmark::State &state, LlvmRuntimeExecutor *executor);
/// A direct call of the JIT-compiled kiln_fill_f32 on one host element per iteration, through
/// its KilnKernelFn pointer from a CpuJit of its own (compiled once, untimed): the floor a launch
/// cannot go below.
void bench_jit_call_one_element(benchmark::State &state);

}  // namespace kiln::bench

#endif  // KILN_BENCH_LAUNCH_OVERHEAD_H_
