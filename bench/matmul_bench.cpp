// kiln-matmul-bench: kiln.matmul on the cpu backend beside OpenBLAS sgemm/dgemm, in the same run,
// with the same number of threads.
//
// What is measured (square n x n x n, row-major, C = A @ B, inputs uniform in [-1, 1)):
//   openblas_gemm/<dtype>/<n>   cblas_sgemm / cblas_dgemm called directly (alpha 1, beta 0), with
//                               openblas_set_num_threads(threads). OpenBLAS is linked into this
//                               program only, never into kiln.
//   kiln_matmul/<dtype>/<n>     LlvmRuntimeExecutor::matmul(c, a, b) on the cpu backend, the
//                               executor made with num_threads = threads.
// threads = hardware_concurrency() (as kiln-bench). n = 256, 1024, 2048; dtype f32, f64.
// FLOPs counted: 2 * n^3 per multiply. The summary prints GFLOP/s (1e9 FLOP/s) of both and the
// ratio kiln / OpenBLAS with the target beside it: >= 0.5x at n = 1024 and 2048 (half of a tuned BLAS);
// n = 256 has no target (there the launch and the packing dominate).
//
// Agreement, checked once per (dtype, n) before kiln's first timing of it: both results are compared element
// by element against the documented tolerance of kiln's matmul (runtime/device/cpu_matmul.h):
// any summation order of a k-term dot product is within gamma_k * (|A| |B|)_ij of the exact
// value (gamma_k = k u / (1 - k u), u = eps / 2; Higham, "Accuracy and Stability of Numerical
// Algorithms", 2nd ed., section 3.5), so two orders differ by at most 2 gamma_k (|A||B|)_ij, which
// is bounded here by k * eps * (|A||B|)_ij. The summary prints the largest
// |kiln - OpenBLAS| / (eps * (|A||B|)_ij) ("err/eps", the bound is k) and the largest absolute
// difference. (|A||B| is computed by OpenBLAS from the absolute values.)
//
// OpenBLAS reads OPENBLAS_CORETYPE (forces a kernel, e.g. Haswell's AVX2 one on an AVX-512 CPU)
// and OPENBLAS_L2_SIZE at load time; `make bench` runs this program with both unset, so OpenBLAS
// picks its best kernel. The summary prints the core OpenBLAS chose and warns when either is set.
//
// Usage: kiln-matmul-bench [Google Benchmark flags]. Default --benchmark_min_time=0.5 (whole run
// ~1 minute on 2 cores). With --benchmark_repetitions the summary uses the median. Nothing here
// fails on a number; exit status 0, 1 when the executor or an array cannot be made, 2 on an
// unrecognized argument, 3 when a result is outside the tolerance.
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <fmt/core.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bench_main.h"
#include "cpu_executor.h"
#include "host_baseline.h"
#include "summary_reporter.h"
#include "kiln/executor/errors.h"
#include "kiln/executor/executor.h"

namespace {

using kiln::DataType;
using kiln::bench::SummaryReporter;

constexpr int64_t kSizes[] = {256, 1024, 2048};
constexpr DataType kDataTypes[] = {DataType::f32, DataType::f64};
constexpr const char *kDefaultMinTime = "--benchmark_min_time=0.5";
constexpr double kTargetRatio = 0.5;  // kiln >= 0.5x OpenBLAS at n = 1024 and 2048

/// One (dtype, n) case: host inputs and OpenBLAS's output, kiln's arrays. Host vectors hold f32
/// or f64 values in a std::vector<double> / <float> chosen by `dtype`.
struct Case {
  DataType dtype = DataType::f32;
  int64_t n = 0;
  std::vector<float> a32, b32, c32;
  std::vector<double> a64, b64, c64;
  kiln::Ndarray a, b, c;
};

kiln::LlvmRuntimeExecutor *g_executor = nullptr;
std::map<std::pair<DataType, int64_t>, Case> g_cases;

/// Deterministic values uniform in [-1, 1) (a 64-bit LCG; the same inputs every run).
template <class T>
std::vector<T> random_matrix(int64_t n, uint64_t seed) {
  std::vector<T> out(static_cast<std::size_t>(n * n));
  uint64_t state = seed * 6364136223846793005ULL + 1442695040888963407ULL;
  for (T &x : out) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<T>(static_cast<double>(state >> 11) * 0x1.0p-52 - 1.0);
  }
  return out;
}

void openblas_gemm(Case &c) {
  const int n = static_cast<int>(c.n);
  if (c.dtype == DataType::f32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, c.a32.data(), n,
                c.b32.data(), n, 0.0f, c.c32.data(), n);
  } else {
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0, c.a64.data(), n,
                c.b64.data(), n, 0.0, c.c64.data(), n);
  }
}

std::span<const std::byte> bytes_of(const Case &c, bool b_operand) {
  if (c.dtype == DataType::f32) return std::as_bytes(std::span(b_operand ? c.b32 : c.a32));
  return std::as_bytes(std::span(b_operand ? c.b64 : c.a64));
}

/// The case for (dtype, n), made on first use: inputs written to kiln, OpenBLAS's output computed.
kiln::RhiExpected<Case *> get_case(DataType dtype, int64_t n) {
  const auto key = std::make_pair(dtype, n);
  if (auto it = g_cases.find(key); it != g_cases.end()) return &it->second;
  Case c;
  c.dtype = dtype;
  c.n = n;
  if (dtype == DataType::f32) {
    c.a32 = random_matrix<float>(n, 1);
    c.b32 = random_matrix<float>(n, 2);
    c.c32.assign(static_cast<std::size_t>(n * n), 0.0f);
  } else {
    c.a64 = random_matrix<double>(n, 1);
    c.b64 = random_matrix<double>(n, 2);
    c.c64.assign(static_cast<std::size_t>(n * n), 0.0);
  }
  const int64_t shape[] = {n, n};
  KILN_ASSIGN_OR_RETURN(c.a, g_executor->ndarray(dtype, shape));
  KILN_ASSIGN_OR_RETURN(c.b, g_executor->ndarray(dtype, shape));
  KILN_ASSIGN_OR_RETURN(c.c, g_executor->ndarray(dtype, shape));
  KILN_RETURN_IF_ERROR(g_executor->write(c.a, bytes_of(c, false)));
  KILN_RETURN_IF_ERROR(g_executor->write(c.b, bytes_of(c, true)));
  return &g_cases.emplace(key, std::move(c)).first->second;
}

/// What the agreement check found for one case.
struct Agreement {
  double max_err_over_eps = 0;  // max |kiln - blas| / (eps * (|A||B|)_ij)
  double max_abs_diff = 0;
  double bound_over_eps = 0;  // k: the documented tolerance in the same unit
};

template <class T>
Agreement compare(const std::vector<T> &kiln, const std::vector<T> &blas, const std::vector<T> &a,
                  const std::vector<T> &b, int64_t n) {
  // |A| |B| by the same BLAS, in double (its own rounding is far below the bound).
  std::vector<double> abs_a(a.size()), abs_b(b.size()), abs_ab(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) abs_a[i] = std::fabs(static_cast<double>(a[i]));
  for (std::size_t i = 0; i < b.size(); ++i) abs_b[i] = std::fabs(static_cast<double>(b[i]));
  const int ni = static_cast<int>(n);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, ni, ni, ni, 1.0, abs_a.data(), ni,
              abs_b.data(), ni, 0.0, abs_ab.data(), ni);
  const double eps = std::numeric_limits<T>::epsilon();
  Agreement out;
  out.bound_over_eps = static_cast<double>(n);
  for (std::size_t i = 0; i < kiln.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(kiln[i]) - static_cast<double>(blas[i]));
    out.max_abs_diff = std::max(out.max_abs_diff, diff);
    const double scale = eps * abs_ab[i];
    // NaN-safe: a NaN difference must count as a failure, so compare with !(x <= y).
    const double rel = scale > 0 ? diff / scale : (diff == 0 ? 0.0 : HUGE_VAL);
    if (!(rel <= out.max_err_over_eps)) out.max_err_over_eps = std::isnan(rel) ? HUGE_VAL : rel;
  }
  return out;
}

/// Runs both once for `c` and compares them; the result stays in c's buffers.
kiln::RhiExpected<Agreement> check_agreement(Case &c) {
  openblas_gemm(c);
  KILN_RETURN_IF_ERROR(g_executor->matmul(c.c, c.a, c.b));
  if (c.dtype == DataType::f32) {
    std::vector<float> got(c.c32.size());
    KILN_RETURN_IF_ERROR(g_executor->read(c.c, std::as_writable_bytes(std::span(got))));
    return compare(got, c.c32, c.a32, c.b32, c.n);
  }
  std::vector<double> got(c.c64.size());
  KILN_RETURN_IF_ERROR(g_executor->read(c.c, std::as_writable_bytes(std::span(got))));
  return compare(got, c.c64, c.a64, c.b64, c.n);
}

/// The agreement of each (dtype, n) kiln case, found before its first timing.
std::map<std::pair<DataType, int64_t>, Agreement> g_agreement;

void bench_openblas(benchmark::State &state, DataType dtype, int64_t n) {
  auto c = get_case(dtype, n);
  if (!c) {
    state.SkipWithError(kiln::describe(c.error()).c_str());
    return;
  }
  for (auto _ : state) openblas_gemm(**c);
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(n * n * n) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void bench_kiln(benchmark::State &state, DataType dtype, int64_t n) {
  auto c = get_case(dtype, n);
  if (!c) {
    state.SkipWithError(kiln::describe(c.error()).c_str());
    return;
  }
  // Once per case, before its first timing (also warms the JIT'd kernel).
  if (!g_agreement.contains({dtype, n})) {
    auto checked = check_agreement(**c);
    if (!checked) {
      state.SkipWithError(kiln::describe(checked.error()).c_str());
      return;
    }
    g_agreement.emplace(std::make_pair(dtype, n), *checked);
  }
  for (auto _ : state) {
    auto status = g_executor->matmul((*c)->c, (*c)->a, (*c)->b);
    if (!status) {
      state.SkipWithError(kiln::describe(status.error()).c_str());
      break;
    }
  }
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * static_cast<double>(n * n * n) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

std::string case_name(const char *what, DataType dtype, int64_t n) {
  return fmt::format("{}/{}/{}", what, kiln::to_string(dtype), n);
}

/// GFLOP/s of the case named `name`, or a negative number if it did not run.
double gflops(const SummaryReporter &reporter, const std::string &name) {
  const SummaryReporter::Run *run = reporter.find(name);
  if (run == nullptr) return -1.0;
  auto it = run->counters.find("GFLOP/s");
  return it == run->counters.end() ? -1.0 : it->second.value;
}

void print_summary(const SummaryReporter &reporter, unsigned threads,
                   const std::map<std::pair<DataType, int64_t>, Agreement> &agreement) {
  fmt::print("\nSummary (GFLOP/s = 1e9 FLOP/s, 2n^3 per multiply; ratio = kiln / OpenBLAS; {} "
             "threads; OpenBLAS core {}):\n",
             threads, openblas_get_corename());
  for (const DataType dtype : kDataTypes) {
    for (const int64_t n : kSizes) {
      const double blas = gflops(reporter, case_name("openblas_gemm", dtype, n));
      const double kiln = gflops(reporter, case_name("kiln_matmul", dtype, n));
      if (blas < 0 && kiln < 0) continue;
      std::string ratio = "n/a";
      if (blas > 0 && kiln >= 0) {
        const double r = kiln / blas;
        ratio = n >= 1024 ? fmt::format("{:.2f}x (target >= {:.1f}x: {})", r, kTargetRatio,
                                        r >= kTargetRatio ? "met" : "MISSED")
                          : fmt::format("{:.2f}x (no target at this size)", r);
      }
      fmt::print("  matmul {} n={}: kiln {:.1f} GFLOP/s, OpenBLAS {:.1f} GFLOP/s, ratio {}\n",
                 kiln::to_string(dtype), n, kiln, blas, ratio);
      if (auto it = agreement.find({dtype, n}); it != agreement.end()) {
        fmt::print("      agreement: max err/eps {:.2f} (tolerance k = {:.0f}), max |diff| {:.3g}\n",
                   it->second.max_err_over_eps, it->second.bound_over_eps,
                   it->second.max_abs_diff);
      }
    }
  }
  for (const char *name : {"OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE"}) {
    if (const char *value = std::getenv(name))
      fmt::print("  warning: {}={} is set: OpenBLAS may not run its best kernel "
                 "(make bench unsets it)\n", name, value);
  }
  std::fflush(stdout);
}

void register_benchmarks() {
  for (const DataType dtype : kDataTypes) {
    for (const int64_t n : kSizes) {
      benchmark::RegisterBenchmark(case_name("openblas_gemm", dtype, n).c_str(), bench_openblas,
                                   dtype, n)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(case_name("kiln_matmul", dtype, n).c_str(), bench_kiln, dtype,
                                   n)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
}

}  // namespace

int main(int argc, char **argv) {
  const auto started = kiln::bench::start(argc, argv, kDefaultMinTime, "kiln-matmul-bench");
  if (!started) return started.error();
  const bool console_format = started->console_format;
  const unsigned threads = started->threads;
  openblas_set_num_threads(static_cast<int>(threads));  // OpenBLAS's team as kiln's
  g_executor = started->executor.get();

  register_benchmarks();
  kiln::bench::run_benchmarks(console_format, "median", [threads](const SummaryReporter &reporter) {
    print_summary(reporter, threads, g_agreement);
  });

  g_cases.clear();  // the arrays go before the executor
  g_executor = nullptr;
  const bool agreed = std::all_of(g_agreement.begin(), g_agreement.end(), [](const auto &entry) {
    return entry.second.max_err_over_eps <= entry.second.bound_over_eps;
  });
  if (!agreed) {
    std::fprintf(stderr, "kiln-matmul-bench: a result is outside the documented tolerance\n");
    return 3;
  }
  return 0;
}
