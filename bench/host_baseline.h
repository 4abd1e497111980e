// kiln-bench's baseline: a STREAM triad and a memcpy over host arrays, split over persistent
// host threads (as kiln's worker pool is), measured in the same run as kiln's kernels.
#ifndef KILN_BENCH_HOST_BASELINE_H_
#define KILN_BENCH_HOST_BASELINE_H_

#include <benchmark/benchmark.h>

#include <cstdint>

namespace kiln::bench {

/// The threads the baseline (and kiln's executor in kiln-bench) use: hardware_concurrency(), >= 1.
[[nodiscard]] unsigned host_thread_count();
/// a[i] = b[i] + 3 * c[i] over three f64 arrays of `size_bytes` each; bytes counted: 3 * size.
void bench_triad(benchmark::State &state, uint64_t size_bytes);
/// std::memcpy of `size_bytes`, split over the same threads; bytes counted: 2 * size.
void bench_memcpy(benchmark::State &state, uint64_t size_bytes);

}  // namespace kiln::bench

#endif  // KILN_BENCH_HOST_BASELINE_H_
