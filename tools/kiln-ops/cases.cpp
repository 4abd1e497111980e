// The operation cases and their host references.
#include <cmath>
#include <type_traits>

#include <fmt/format.h>

#include "case_support.h"
#include "suite.h"

namespace kiln::ops {
namespace {

template <class T>
T wrap_axpy(T alpha, T x, T y) {
  if constexpr (std::is_floating_point_v<T>) return alpha * x + y;
  else {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(alpha) * static_cast<U>(x) + static_cast<U>(y)));
  }
}

template <class T>
Scalar scalar_of(T v) {
  if constexpr (std::is_floating_point_v<T>) return Scalar::of(static_cast<double>(v));
  else return Scalar::of_int(static_cast<int64_t>(v));
}

template <class T>
double tolerance_of() {
  return std::is_same_v<T, float> ? 1e-6 : 1e-12;
}

template <class T>
CaseOutcome case_allocate(LlvmRuntimeExecutor &ex, uint64_t n) {
  const std::vector<T> values = random_values<T>(n, n * 31 + 1);
  const int64_t shape[1] = {static_cast<int64_t>(n)};
  KILN_ASSIGN_OR_RETURN(Ndarray a, upload<T>(ex, values, shape));
  KILN_ASSIGN_OR_RETURN(const std::vector<T> got, download<T>(ex, a));
  KILN_RETURN_IF_ERROR(ex.free(a));
  return compare(got, values);
}

template <class T>
CaseOutcome case_fill(LlvmRuntimeExecutor &ex, uint64_t n) {
  const T value = static_cast<T>(std::is_floating_point_v<T> ? 2.5 : -7);
  const int64_t shape[1] = {static_cast<int64_t>(n)};
  KILN_ASSIGN_OR_RETURN(Ndarray a, ex.ndarray(dtype_for<T>(), shape));
  KILN_RETURN_IF_ERROR(ex.fill(a, scalar_of(value)));
  KILN_ASSIGN_OR_RETURN(const std::vector<T> got, download<T>(ex, a));
  return compare(got, std::vector<T>(n, value));
}

template <class T>
CaseOutcome case_copy(LlvmRuntimeExecutor &ex, uint64_t n) {
  const std::vector<T> values = random_values<T>(n, n + 7);
  const int64_t shape[1] = {static_cast<int64_t>(n)};
  KILN_ASSIGN_OR_RETURN(Ndarray src, upload<T>(ex, values, shape));
  KILN_ASSIGN_OR_RETURN(Ndarray dst, ex.ndarray(dtype_for<T>(), shape));
  KILN_RETURN_IF_ERROR(ex.copy(dst, src));
  KILN_ASSIGN_OR_RETURN(const std::vector<T> got, download<T>(ex, dst));
  return compare(got, values);
}

template <class T>
CaseOutcome case_axpy(LlvmRuntimeExecutor &ex, uint64_t n, bool staged) {
  const std::vector<T> x = random_values<T>(n, n + 11);
  std::vector<T> y = random_values<T>(n, n + 13);
  const T alpha = static_cast<T>(std::is_floating_point_v<T> ? 0.75 : 3);
  const int64_t shape[1] = {static_cast<int64_t>(n)};
  KILN_ASSIGN_OR_RETURN(Ndarray dy, upload<T>(ex, y, shape));
  if (staged) {
    KILN_RETURN_IF_ERROR(ex.axpy_from_host(scalar_of(alpha), bytes_of(x), dy));
  } else {
    KILN_ASSIGN_OR_RETURN(Ndarray dx, upload<T>(ex, x, shape));
    KILN_RETURN_IF_ERROR(ex.axpy(scalar_of(alpha), dx, dy));
  }
  KILN_ASSIGN_OR_RETURN(const std::vector<T> got, download<T>(ex, dy));
  for (uint64_t i = 0; i < n; ++i) y[i] = wrap_axpy(alpha, x[i], y[i]);
  return compare(got, y, std::is_floating_point_v<T> ? tolerance_of<T>() : 0.0);
}

template <class T>
CaseOutcome case_reduce_sum(LlvmRuntimeExecutor &ex, uint64_t n) {
  const std::vector<T> x = random_values<T>(n, n + 17);
  const int64_t shape[1] = {static_cast<int64_t>(n)};
  KILN_ASSIGN_OR_RETURN(Ndarray dx, upload<T>(ex, x, shape));
  KILN_ASSIGN_OR_RETURN(const Scalar got, ex.reduce_sum(dx));
  if constexpr (std::is_floating_point_v<T>) {
    long double want = 0, magnitude = 0;
    for (T v : x) {
      want += v;
      magnitude += std::fabs(v);
    }
    const double tol = 1e-9 * static_cast<double>(magnitude) + 1e-12;
    if (std::fabs(got.f64 - static_cast<double>(want)) > tol)
      return std::optional<std::string>(fmt::format("sum {} differs from {} by more than {}", got.f64,
                                                    static_cast<double>(want), tol));
  } else {
    uint64_t want = 0;
    for (T v : x) want += static_cast<uint64_t>(static_cast<int64_t>(v));
    if (static_cast<uint64_t>(got.i64) != want)
      return std::optional<std::string>(fmt::format("sum {} != {}", got.i64, static_cast<int64_t>(want)));
  }
  return std::optional<std::string>();
}

template <class T>
CaseOutcome case_matmul(LlvmRuntimeExecutor &ex, int64_t m, int64_t n, int64_t k) {
  const std::vector<T> a = random_values<T>(static_cast<uint64_t>(m * k), 5);
  const std::vector<T> b = random_values<T>(static_cast<uint64_t>(k * n), 6);
  const int64_t sa[2] = {m, k}, sb[2] = {k, n}, sc[2] = {m, n};
  KILN_ASSIGN_OR_RETURN(Ndarray da, upload<T>(ex, a, sa));
  KILN_ASSIGN_OR_RETURN(Ndarray db, upload<T>(ex, b, sb));
  KILN_ASSIGN_OR_RETURN(Ndarray dc, ex.ndarray(dtype_for<T>(), sc));
  KILN_RETURN_IF_ERROR(ex.matmul(dc, da, db));
  KILN_ASSIGN_OR_RETURN(const std::vector<T> got, download<T>(ex, dc));
  std::vector<T> want(static_cast<uint64_t>(m * n), T{});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t p = 0; p < k; ++p)
      for (int64_t j = 0; j < n; ++j) {
        T &c = want[static_cast<uint64_t>(i * n + j)];
        c = wrap_axpy(a[static_cast<uint64_t>(i * k + p)], b[static_cast<uint64_t>(p * n + j)], c);
      }
  // Float sums of k products of values in [-1, 1]: allow k * epsilon per element.
  const double rel = std::is_same_v<T, float> ? 1e-6 * static_cast<double>(k)
                                              : 1e-14 * static_cast<double>(k);
  return compare(got, want, std::is_floating_point_v<T> ? rel : 0.0);
}

template <class T>
CaseOutcome case_compact(LlvmRuntimeExecutor &ex, uint64_t n) {
  const std::vector<T> x = random_values<T>(n, n + 23);
  const int64_t shape[1] = {static_cast<int64_t>(n)};
  KILN_ASSIGN_OR_RETURN(Ndarray dx, upload<T>(ex, x, shape));
  KILN_ASSIGN_OR_RETURN(Ndarray out, ex.compact_positive(dx));
  KILN_ASSIGN_OR_RETURN(const std::vector<T> got, download<T>(ex, out));
  std::vector<T> want;
  for (T v : x)
    if (v > 0) want.push_back(v);
  return compare(got, want);
}

template <class T>
void add_cases_for(std::vector<Case> &cases, uint64_t max_bytes) {
  const std::string dt(to_string(dtype_for<T>()));
  const auto add = [&](std::string name, uint64_t array_bytes, auto fn) {
    if (array_bytes <= max_bytes) cases.push_back(Case{std::move(name), array_bytes, std::move(fn)});
  };
  for (const Size &s : kSizes) {
    const uint64_t n = s.bytes != 0 ? s.bytes / sizeof(T) : s.elements;
    const uint64_t bytes = n * sizeof(T);
    add(fmt::format("allocate/{}/{}", dt, s.name), bytes, [n](auto &ex) { return case_allocate<T>(ex, n); });
    add(fmt::format("fill/{}/{}", dt, s.name), bytes, [n](auto &ex) { return case_fill<T>(ex, n); });
    add(fmt::format("copy/{}/{}", dt, s.name), bytes, [n](auto &ex) { return case_copy<T>(ex, n); });
    add(fmt::format("axpy/{}/{}", dt, s.name), bytes, [n](auto &ex) { return case_axpy<T>(ex, n, false); });
    add(fmt::format("axpy_staged/{}/{}", dt, s.name), bytes, [n](auto &ex) { return case_axpy<T>(ex, n, true); });
    add(fmt::format("reduce_sum/{}/{}", dt, s.name), bytes, [n](auto &ex) { return case_reduce_sum<T>(ex, n); });
    // Compaction writes about n/2 elements into the device heap: the largest size stays at
    // 2 Mi elements so its output fits the default 16 MiB heap.
    const uint64_t cn = std::min<uint64_t>(n, 2u << 20);
    add(fmt::format("compact_heap/{}/{}", dt, s.name), cn * sizeof(T), [cn](auto &ex) { return case_compact<T>(ex, cn); });
  }
  struct Mm { const char *name; int64_t m, n, k; };
  for (const Mm &mm : {Mm{"tiny", 4, 4, 4}, Mm{"odd", 67, 45, 33}, Mm{"large", 512, 512, 512}}) {
    const uint64_t bytes = static_cast<uint64_t>(mm.m * mm.n) * sizeof(T);
    add(fmt::format("matmul/{}/{}", dt, mm.name), bytes,
        [mm](auto &ex) { return case_matmul<T>(ex, mm.m, mm.n, mm.k); });
  }
}

}  // namespace

std::vector<Case> make_cases(uint64_t max_array_bytes) {
  std::vector<Case> cases;
  add_cases_for<float>(cases, max_array_bytes);
  add_cases_for<double>(cases, max_array_bytes);
  add_cases_for<int32_t>(cases, max_array_bytes);
  add_cases_for<int64_t>(cases, max_array_bytes);
  add_user_kernel_cases(cases, max_array_bytes);
  return cases;
}

}  // namespace kiln::ops
