// The cpu backend's blocked matmul (runtime/device/cpu_matmul.h) against a double-precision
// reference, on shapes at and around its block sizes (MR = 6 rows; NR = 32 f32 / 16 f64 columns;
// KC = 256; MC = 192 rows) and with 1 and 2 threads (different row splits). The
// documented tolerance: |C - C_exact|_ij <= k * eps * (|A||B|)_ij per element.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "test_support.h"

using namespace kiln;
using namespace kiln::test;

namespace {

struct Shape {
  int64_t m, k, n;
};

// Odd shapes, every block edge (one below, at, one above), and several kc slabs. The MC edges
// need one task over more than 192 rows: the executor gives a launch one task while
// m <= 65536 / (n * k), so those shapes keep n * k small.
const Shape kShapes[] = {
    {1, 1, 1},     {7, 13, 5},    {65, 33, 129}, {6, 256, 32},  {5, 255, 31},  {7, 257, 33},
    {12, 1, 16},   {13, 2, 17},   {95, 64, 15},  {96, 70, 48},  {97, 40, 47},  {49, 513, 65},
    {48, 300, 97}, {3, 600, 200}, {200, 9, 3},   {192, 11, 31}, {193, 10, 33}, {197, 9, 36}};

/// Deterministic values in [-1, 1) (a 64-bit LCG).
template <class T>
std::vector<T> values(int64_t count, uint64_t seed) {
  std::vector<T> out(static_cast<std::size_t>(count));
  uint64_t state = seed * 0x9E3779B97F4A7C15ULL + 1;
  for (T &x : out) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    x = static_cast<T>(static_cast<double>(state >> 11) * 0x1.0p-52 - 1.0);
  }
  return out;
}

Ndarray make_matrix(LlvmRuntimeExecutor &ex, DataType dtype, int64_t rows, int64_t cols) {
  const int64_t shape[2] = {rows, cols};
  return value_or_throw(ex.ndarray(dtype, shape));
}

/// Checks kiln's C = A @ B for `shape` against the double reference within k * eps * (|A||B|)_ij.
/// C starts as NaN, so an element the kernel fails to overwrite (or accumulates into) shows.
template <class T>
void check_matmul(LlvmRuntimeExecutor &ex, DataType dtype, Shape s) {
  INFO("dtype " << to_string(dtype) << " m " << s.m << " k " << s.k << " n " << s.n);
  const std::vector<T> a = values<T>(s.m * s.k, 1 + static_cast<uint64_t>(s.m));
  const std::vector<T> b = values<T>(s.k * s.n, 2 + static_cast<uint64_t>(s.n));
  Ndarray da = make_matrix(ex, dtype, s.m, s.k);
  Ndarray db = make_matrix(ex, dtype, s.k, s.n);
  Ndarray dc = make_matrix(ex, dtype, s.m, s.n);
  value_or_throw(ex.write(da, bytes_of(a)));
  value_or_throw(ex.write(db, bytes_of(b)));
  value_or_throw(ex.fill(dc, Scalar::of(std::numeric_limits<double>::quiet_NaN())));
  REQUIRE(ex.matmul(dc, da, db));
  const std::vector<T> c = download<T>(ex, dc);

  const double eps = std::numeric_limits<T>::epsilon();
  int64_t bad = 0;
  double worst_over_eps = 0;
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      double exact = 0, magnitude = 0;
      for (int64_t p = 0; p < s.k; ++p) {
        const double x = a[i * s.k + p], y = b[p * s.n + j];
        exact += x * y;
        magnitude += std::fabs(x) * std::fabs(y);
      }
      const double got = c[i * s.n + j];
      const double err = std::fabs(got - exact);
      // The reference's own rounding (k * 2^-53 * magnitude) is far below the bound.
      const double bound = static_cast<double>(s.k) * eps * magnitude;
      if (!(err <= bound)) ++bad;  // NaN counts as bad
      if (magnitude > 0) worst_over_eps = std::max(worst_over_eps, err / (eps * magnitude));
    }
  }
  INFO("largest error / (eps * (|A||B|)_ij): " << worst_over_eps << " (bound k = " << s.k << ")");
  CHECK(bad == 0);
}

}  // namespace

TEST_CASE("cpu matmul f32 and f64 agree with a double reference within k*eps*|A||B|",
          "[executor][matmul]") {
  for (const unsigned threads : {1u, 2u}) {
    ExecutorConfig config;
    config.backend = Backend::cpu;
    config.num_threads = threads;
    auto ex = make_executor(config);
    INFO("threads " << threads);
    for (const Shape &s : kShapes) {
      check_matmul<float>(*ex, DataType::f32, s);
      check_matmul<double>(*ex, DataType::f64, s);
    }
  }
}

TEST_CASE("cpu matmul on integers wraps exactly at block edges", "[executor][matmul]") {
  auto ex = make_executor();
  const Shape s{7, 257, 33};
  std::vector<int32_t> a(static_cast<std::size_t>(s.m * s.k)), b(static_cast<std::size_t>(s.k * s.n));
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<int32_t>(i * 2654435761u);
  for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<int32_t>(i * 40503u + 7u);
  Ndarray da = make_matrix(*ex, DataType::i32, s.m, s.k);
  Ndarray db = make_matrix(*ex, DataType::i32, s.k, s.n);
  Ndarray dc = make_matrix(*ex, DataType::i32, s.m, s.n);
  value_or_throw(ex->write(da, bytes_of(a)));
  value_or_throw(ex->write(db, bytes_of(b)));
  REQUIRE(ex->matmul(dc, da, db));
  const std::vector<int32_t> c = download<int32_t>(*ex, dc);
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      uint32_t expect = 0;
      for (int64_t p = 0; p < s.k; ++p)
        expect += static_cast<uint32_t>(a[i * s.k + p]) * static_cast<uint32_t>(b[p * s.n + j]);
      CHECK(c[i * s.n + j] == static_cast<int32_t>(expect));
    }
  }
}
