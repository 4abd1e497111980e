// kiln-bench's baselines: a STREAM triad, a memcpy, a read-only sum and an axpy over host arrays, split over persistent
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
/// The read roofline: sum of one f64 array of `size_bytes` over the same threads, 32
/// independent accumulators per thread (as kiln's reduce_sum), built for the best of
/// AVX-512 / AVX2 / SSE2 this CPU has (GCC target_clones). Bytes counted: size.
void bench_read_sum(benchmark::State &state, uint64_t size_bytes);
/// One pass of bench_read_sum's loop over `size_bytes` (what it times per iteration), for a
/// benchmark that alternates it with kiln's reduce_sum; returns the sum.
double read_sum_once(uint64_t size_bytes);
/// y[i] = alpha * x[i] + y[i] over two f64 arrays of `size_bytes`, the same threads and ISA
/// choice; bytes counted as kiln's axpy: 3 * size (x read, y read, y written).
void bench_axpy(benchmark::State &state, uint64_t size_bytes);

}  // namespace kiln::bench

#endif  // KILN_BENCH_HOST_BASELINE_H_
