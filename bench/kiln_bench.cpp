// kiln-bench: memory bandwidth of kiln's operations on the cpu backend, beside a baseline
// measured in the same run on the same machine.
//
// What is measured (each <size> is the size of ONE array, in bytes):
//   baseline_triad/<size>           a[i] = b[i] + s * c[i] over three f64 host arrays, split over
//                                   hardware_concurrency() persistent threads (the number kiln's
//                                   executor is given below). This is the triad of STREAM
//                                   (J. D. McCalpin, "Memory Bandwidth and Machine Balance in
//                                   Current High Performance Computers", IEEE TCCA Newsletter,
//                                   1995; https://www.cs.virginia.edu/stream/), the source of the
//                                   baseline. Bytes counted: 3 * size (two reads, one write; as in
//                                   STREAM, write-allocate traffic is not counted).
//   baseline_memcpy/<size>          std::memcpy, split over the same threads. Bytes: 2 * size.
//   baseline_read_sum/<size>        the read roofline: a sum over one f64 host array, 32
//                                   accumulators per thread, built at -O3 for the widest vector
//                                   ISA this CPU has (GCC target_clones), same threads. Bytes: size.
//   baseline_axpy/<size>            the axpy roofline: y[i] = alpha * x[i] + y[i] over two f64
//                                   host arrays, same threads and ISA choice. Bytes: 3 * size.
//   kiln_axpy/<dtype>/<size>        LlvmRuntimeExecutor::axpy, y[i] = alpha * x[i] + y[i].
//                                   Bytes: 3 * size (x read, y read, y written).
//   kiln_reduce_sum/<dtype>/<size>  LlvmRuntimeExecutor::reduce_sum(x). Bytes: size.
//   paired_reduce_sum_vs_read_sum/<dtype>/64MiB
//                                   reduce_sum and the read-sum loop over the same bytes,
//                                   alternated pair by pair (this VM's bandwidth drifts between
//                                   the separate cases above); counter "ratio" = the median of
//                                   the pairs' roofline time / kiln time: the target.
//   kiln_launch/fill/f32/1          LlvmRuntimeExecutor::fill of a 1-element array: one whole
//                                   launch (checks, argument and result buffers, thread pool,
//                                   device-error check), time per launch.
//   baseline_jit_call/fill/f32/1    a direct call of the JIT-compiled kiln_fill_f32 on one
//                                   element: the floor. The difference is kiln's launch overhead.
//   kiln_cpu_jit_compile            runtime::CpuJit::create(): the CPU JIT's whole compile of the
//                                   device runtime (parse the embedded bitcode, O3 for this CPU,
//                                   ORC LLJIT code generation), wall time per compile in ms.
// Sizes: 64MiB (memory-bound) and 256KiB (cache-resident: the launch overhead shows).
//
// Reading the ratios: each kernel is compared with its own roofline measured in the same run
// (axpy with baseline_axpy, reduce_sum with baseline_read_sum); the target is
// reduce_sum >= 0.90x of the read roofline at 64 MiB, judged on the paired (alternated) case. The STREAM triad is printed beside them as
// the familiar reference (STREAM counts 3 * size for the triad although a write-allocating cache
// moves ~4 * size, so a kernel may exceed 1.0x of the triad).
// Units: the table's bytes_per_second column is Google Benchmark's, in binary units
// (G/s = 2^30 bytes per second). The summary printed after the table is in GB/s = 1e9 bytes per
// second, with ratio = kiln GB/s / triad GB/s at the same size. Ratios are printed, never
// asserted: nothing here fails on a number.
//
// Usage: kiln-bench [Google Benchmark flags]. Each case runs for --benchmark_min_time seconds
// (default here 0.5). --benchmark_filter, --benchmark_repetitions
// (the summary uses the mean), --benchmark_out etc. pass through; with a --benchmark_format other
// than console the table is printed in that format and the summary is left out.
// Exit status: 0, 1 when the executor cannot be created, 2 on an unrecognized argument.
#include <benchmark/benchmark.h>

#include "bench_main.h"
#include "cpu_executor.h"
#include "summary_reporter.h"
#include "host_baseline.h"
#include "launch_overhead.h"
#include <fmt/core.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/executor/errors.h"
#include "kiln/executor/executor.h"
#include "kiln/runtime/cpu_jit.h"

namespace {

using namespace kiln::bench;  // the baselines, the launch and JIT benchmarks, SummaryReporter
using kiln::DataType;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kSizesBytes[] = {64 * kMiB, 256 * kKiB};
constexpr DataType kDataTypes[] = {DataType::f32, DataType::f64};
constexpr const char *kDefaultMinTime = "--benchmark_min_time=0.5";

std::string size_label(uint64_t size_bytes) {
  if (size_bytes % kMiB == 0) return std::to_string(size_bytes / kMiB) + "MiB";
  return std::to_string(size_bytes / kKiB) + "KiB";
}

// ---------------------------------------------------------------------------------------------
// kiln: one executor for the whole run (made in main), and per (dtype, size) one pair of arrays
// x = 1, y = 0, made on first use and kept, so no timed iteration allocates.
kiln::LlvmRuntimeExecutor *g_executor = nullptr;

struct KilnArrays {
  kiln::Ndarray x, y;
};
std::map<std::pair<DataType, uint64_t>, KilnArrays> g_kiln_arrays;

kiln::RhiExpected<KilnArrays *> kiln_arrays(DataType dtype, uint64_t size_bytes) {
  const auto key = std::make_pair(dtype, size_bytes);
  if (auto it = g_kiln_arrays.find(key); it != g_kiln_arrays.end()) return &it->second;
  const int64_t shape[] = {static_cast<int64_t>(size_bytes / kiln::itemsize(dtype))};
  KilnArrays arrays;
  KILN_ASSIGN_OR_RETURN(arrays.x, g_executor->ndarray(dtype, shape));
  KILN_ASSIGN_OR_RETURN(arrays.y, g_executor->ndarray(dtype, shape));
  KILN_RETURN_IF_ERROR(g_executor->fill(arrays.x, kiln::Scalar::of(1.0)));
  KILN_RETURN_IF_ERROR(g_executor->fill(arrays.y, kiln::Scalar::of(0.0)));
  return &g_kiln_arrays.emplace(key, std::move(arrays)).first->second;
}

void bench_kiln_axpy(benchmark::State &state, DataType dtype, uint64_t size_bytes) {
  auto arrays = kiln_arrays(dtype, size_bytes);
  if (!arrays) {
    state.SkipWithError(kiln::describe(arrays.error()).c_str());
    return;
  }
  // y grows by 1e-6 per iteration: far from overflow or denormals for any run length.
  const kiln::Scalar alpha = kiln::Scalar::of(1e-6);
  for (auto _ : state) {
    auto status = g_executor->axpy(alpha, (*arrays)->x, (*arrays)->y);
    if (!status) {
      state.SkipWithError(kiln::describe(status.error()).c_str());
      break;
    }
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 3 * size_bytes));
}

void bench_kiln_reduce_sum(benchmark::State &state, DataType dtype, uint64_t size_bytes) {
  auto arrays = kiln_arrays(dtype, size_bytes);
  if (!arrays) {
    state.SkipWithError(kiln::describe(arrays.error()).c_str());
    return;
  }
  for (auto _ : state) {
    auto sum = g_executor->reduce_sum((*arrays)->x);
    if (!sum) {
      state.SkipWithError(kiln::describe(sum.error()).c_str());
      break;
    }
    benchmark::DoNotOptimize(sum->f64);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size_bytes));
}

/// reduce_sum and the read roofline's loop over the same bytes, alternated (their order swapped
/// each iteration) so that both see the same memory bandwidth: this VM's swings by 2x between
/// minutes, which a ratio of two cases measured one after the other inherits. Reports the median
/// of the per-pair ratios (roofline time / kiln time) as the counter "ratio".
void bench_paired_reduce_sum(benchmark::State &state, DataType dtype, uint64_t size_bytes) {
  auto arrays = kiln_arrays(dtype, size_bytes);
  if (!arrays) {
    state.SkipWithError(kiln::describe(arrays.error()).c_str());
    return;
  }
  using Clock = std::chrono::steady_clock;
  const auto time_kiln = [&]() -> kiln::RhiExpected<double> {
    const auto start = Clock::now();
    KILN_ASSIGN_OR_RETURN(const kiln::Scalar sum, g_executor->reduce_sum((*arrays)->x));
    benchmark::DoNotOptimize(sum.f64);
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  const auto time_roofline = [size_bytes] {
    const auto start = Clock::now();
    benchmark::DoNotOptimize(kiln::bench::read_sum_once(size_bytes));
    return std::chrono::duration<double>(Clock::now() - start).count();
  };
  // One untimed pass of each first: the roofline's host arrays are made and first touched on
  // their first use (hundreds of ms), which must not be a pair's time.
  if (!time_kiln()) {
    state.SkipWithError("reduce_sum failed before the timed pairs");
    return;
  }
  time_roofline();
  std::vector<double> ratios;
  for (auto _ : state) {
    const bool kiln_first = ratios.size() % 2 == 0;
    const double roofline_before = kiln_first ? 0.0 : time_roofline();
    auto kiln_s = time_kiln();
    if (!kiln_s) {
      state.SkipWithError(kiln::describe(kiln_s.error()).c_str());
      return;
    }
    const double roofline_s = kiln_first ? time_roofline() : roofline_before;
    ratios.push_back(roofline_s / *kiln_s);
  }
  std::sort(ratios.begin(), ratios.end());
  state.counters["ratio"] = ratios.empty() ? 0.0 : ratios[ratios.size() / 2];
  state.counters["pairs"] = static_cast<double>(ratios.size());
}

/// One full CPU JIT compile per iteration (the executor's own JIT is not reused).
void bench_cpu_jit_compile(benchmark::State &state) {
  for (auto _ : state) {
    auto jit = kiln::runtime::CpuJit::create();
    if (!jit) {
      state.SkipWithError(kiln::describe(jit.error()).c_str());
      break;
    }
    benchmark::DoNotOptimize(jit->get());
  }
}

// ---------------------------------------------------------------------------------------------
constexpr const char *kJitCompileName = "kiln_cpu_jit_compile";
constexpr const char *kLaunchName = "kiln_launch/fill/f32/1";
constexpr const char *kJitCallName = "baseline_jit_call/fill/f32/1";
/// The target: reduce_sum at 64 MiB reaches 90% of the read roofline.
constexpr double kReduceRooflineTarget = 0.90;
constexpr uint64_t kRooflineTargetSize = 64 * kMiB;

/// Counter `counter` of the case named `name`, or a negative number if it did not run.
double counter_of(const SummaryReporter &reporter, const std::string &name, const char *counter) {
  const SummaryReporter::Run *run = reporter.find(name);
  if (run == nullptr) return -1.0;
  auto it = run->counters.find(counter);
  return it == run->counters.end() ? -1.0 : it->second.value;
}

/// GB/s (1e9 bytes per second) of the case named `name`, or a negative number if it did not run.
double gb_per_s(const SummaryReporter &reporter, const std::string &name) {
  const double bytes_per_second = counter_of(reporter, name, "bytes_per_second");
  return bytes_per_second < 0 ? -1.0 : bytes_per_second / 1e9;
}

std::string triad_name(uint64_t size) { return "baseline_triad/" + size_label(size); }
std::string memcpy_name(uint64_t size) { return "baseline_memcpy/" + size_label(size); }
std::string read_sum_name(uint64_t size) { return "baseline_read_sum/" + size_label(size); }
std::string axpy_baseline_name(uint64_t size) { return "baseline_axpy/" + size_label(size); }
/// The roofline case of kiln's `op` at `size`.
std::string roofline_name(std::string_view op, uint64_t size) {
  return op == "axpy" ? axpy_baseline_name(size) : read_sum_name(size);
}
std::string kiln_name(std::string_view op, DataType dtype, uint64_t size) {
  return "kiln_" + std::string(op) + "/" + std::string(kiln::to_string(dtype)) + "/" +
         size_label(size);
}

std::string paired_name(DataType dtype, uint64_t size) {
  return "paired_reduce_sum_vs_read_sum/" + std::string(kiln::to_string(dtype)) + "/" +
         size_label(size);
}

std::string format_gb_per_s(double gb_per_s) {
  return gb_per_s < 0 ? std::string("n/a") : fmt::format("{:.2f} GB/s", gb_per_s);
}

std::string ratio_text(double value, double baseline) {
  return value >= 0 && baseline > 0 ? fmt::format("{:.2f}x", value / baseline) : "n/a";
}

void print_bandwidth_summary(const SummaryReporter &reporter, uint64_t size) {
  const std::string size_text = size_label(size);
  const double triad = gb_per_s(reporter, triad_name(size));
  fmt::print("  baseline {}: triad {}, memcpy {}, read-sum {}, axpy {}\n", size_text,
             format_gb_per_s(triad), format_gb_per_s(gb_per_s(reporter, memcpy_name(size))),
             format_gb_per_s(gb_per_s(reporter, read_sum_name(size))),
             format_gb_per_s(gb_per_s(reporter, axpy_baseline_name(size))));
  for (const std::string_view op : {"axpy", "reduce_sum"}) {
    const double roofline = gb_per_s(reporter, roofline_name(op, size));
    for (const DataType dtype : kDataTypes) {
      const double kiln = gb_per_s(reporter, kiln_name(op, dtype, size));
      if (kiln < 0) continue;
      fmt::print("  {} {} {}: {}, roofline {} ({}), ratio {}; triad ratio {}\n", op,
                 kiln::to_string(dtype), size_text, format_gb_per_s(kiln),
                 format_gb_per_s(roofline), op == "axpy" ? "axpy loop" : "read-sum loop",
                 ratio_text(kiln, roofline), ratio_text(kiln, triad));
    }
  }
}

/// The paired measurement of the target: reduce_sum over the read roofline, alternated.
void print_paired_summary(const SummaryReporter &reporter) {
  for (const DataType dtype : kDataTypes) {
    const std::string name = paired_name(dtype, kRooflineTargetSize);
    const double ratio = counter_of(reporter, name, "ratio");
    if (ratio < 0) continue;
    fmt::print("  reduce_sum {} {} alternated with the read-sum loop: median ratio {:.2f}x over "
               "{:.0f} pairs, target >= {:.2f}x: {}\n",
               kiln::to_string(dtype), size_label(kRooflineTargetSize), ratio,
               counter_of(reporter, name, "pairs"), kReduceRooflineTarget,
               ratio >= kReduceRooflineTarget ? "met" : "MISSED");
  }
}

void print_summary(const SummaryReporter &reporter, unsigned num_threads) {
  fmt::print("\nSummary (GB/s = 1e9 bytes/s; ratio = kiln / its roofline measured in this run; "
             "{} threads):\n",
             num_threads);
  for (const uint64_t size : kSizesBytes) print_bandwidth_summary(reporter, size);
  print_paired_summary(reporter);
  const double launch_s = reporter.seconds(kLaunchName);
  const double call_s = reporter.seconds(kJitCallName);
  if (launch_s >= 0 && call_s >= 0) {
    fmt::print("  launch overhead: a 1-element fill launch {:.0f} ns, a direct call of the JIT'd "
               "{} {:.1f} ns: kiln's own cost {:.0f} ns per launch ({} the call)\n",
               launch_s * 1e9, kiln::bench::kLaunchOverheadKernel, call_s * 1e9,
               (launch_s - call_s) * 1e9, ratio_text(launch_s, call_s));
  }
  if (const double jit_s = reporter.seconds(kJitCompileName); jit_s >= 0)
    fmt::print("  cpu jit compile (CpuJit::create): {:.0f} ms\n", jit_s * 1e3);
  std::fflush(stdout);
}

void register_benchmarks() {
  for (const uint64_t size : kSizesBytes) {
    benchmark::RegisterBenchmark(triad_name(size).c_str(), bench_triad, size)->UseRealTime();
    benchmark::RegisterBenchmark(memcpy_name(size).c_str(), bench_memcpy, size)->UseRealTime();
    benchmark::RegisterBenchmark(read_sum_name(size).c_str(), bench_read_sum, size)->UseRealTime();
    benchmark::RegisterBenchmark(axpy_baseline_name(size).c_str(), bench_axpy, size)->UseRealTime();
    for (const DataType dtype : kDataTypes) {
      benchmark::RegisterBenchmark(kiln_name("axpy", dtype, size).c_str(), bench_kiln_axpy, dtype,
                                   size)
          ->UseRealTime();
      benchmark::RegisterBenchmark(kiln_name("reduce_sum", dtype, size).c_str(),
                                   bench_kiln_reduce_sum, dtype, size)
          ->UseRealTime();
    }
  }
  for (const DataType dtype : kDataTypes)
    benchmark::RegisterBenchmark(paired_name(dtype, kRooflineTargetSize).c_str(),
                                 bench_paired_reduce_sum, dtype, kRooflineTargetSize)
        ->UseRealTime();
  benchmark::RegisterBenchmark(kLaunchName, bench_launch_one_element, g_executor)->UseRealTime();
  benchmark::RegisterBenchmark(kJitCallName, bench_jit_call_one_element)->UseRealTime();
  // A few whole compiles (each takes hundreds of ms), not a min time.
  benchmark::RegisterBenchmark(kJitCompileName, bench_cpu_jit_compile)
      ->Unit(benchmark::kMillisecond)
      ->Iterations(5)
      ->UseRealTime();
}

}  // namespace

int main(int argc, char **argv) {
  const auto started = kiln::bench::start(argc, argv, kDefaultMinTime, "kiln-bench");
  if (!started) return started.error();
  const bool console_format = started->console_format;
  const unsigned threads = started->threads;  // the baseline team's
  g_executor = started->executor.get();

  register_benchmarks();
  kiln::bench::run_benchmarks(console_format, "mean", [threads](const SummaryReporter &reporter) {
    print_summary(reporter, threads);
  });

  g_kiln_arrays.clear();  // the arrays go before the executor (they would also survive it)
  g_executor = nullptr;
  return 0;
}
