// What the operation cases share (cases.cpp, user_kernel_cases.cpp): deterministic inputs,
// upload and download, and the comparison with a host reference.
#ifndef KILN_TOOLS_KILN_OPS_CASE_SUPPORT_H_
#define KILN_TOOLS_KILN_OPS_CASE_SUPPORT_H_

#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "kiln/executor/executor.h"

namespace kiln::ops {

using CaseOutcome = RhiExpected<std::optional<std::string>>;

// splitmix64: a small deterministic generator (Steele, Lea, Flood 2014).
struct Rng {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
};

template <class T>
std::vector<T> random_values(uint64_t n, uint64_t seed) {
  std::vector<T> v(n);
  Rng rng{seed};
  for (T &x : v) {
    const uint64_t r = rng.next();
    if constexpr (std::is_floating_point_v<T>)
      x = static_cast<T>(static_cast<double>(r >> 11) * 0x1.0p-52 - 1.0);  // [-1, 1)
    else
      x = static_cast<T>(static_cast<int64_t>(r % 201) - 100);  // [-100, 100]
  }
  return v;
}

template <class T>
constexpr DataType dtype_for() {
  if constexpr (std::is_same_v<T, float>) return DataType::f32;
  else if constexpr (std::is_same_v<T, double>) return DataType::f64;
  else if constexpr (std::is_same_v<T, int32_t>) return DataType::i32;
  else return DataType::i64;
}

template <class T>
std::span<const std::byte> bytes_of(const std::vector<T> &v) {
  return std::as_bytes(std::span<const T>(v));
}

template <class T>
RhiExpected<Ndarray> upload(LlvmRuntimeExecutor &ex, const std::vector<T> &values,
                            std::span<const int64_t> shape) {
  KILN_ASSIGN_OR_RETURN(Ndarray a, ex.ndarray(dtype_for<T>(), shape));
  KILN_RETURN_IF_ERROR(ex.write(a, bytes_of(values)));
  return a;
}

template <class T>
RhiExpected<std::vector<T>> download(LlvmRuntimeExecutor &ex, const Ndarray &a) {
  std::vector<T> v(a.num_elements());
  KILN_RETURN_IF_ERROR(ex.read(a, std::as_writable_bytes(std::span<T>(v))));
  return v;
}

template <class T>
bool close(T got, double want, double tolerance) {
  if constexpr (std::is_floating_point_v<T>) return std::fabs(static_cast<double>(got) - want) <= tolerance;
  else return got == static_cast<T>(static_cast<int64_t>(want));
}

// The first index where got differs from want beyond `relative` tolerance, described.
template <class T>
std::optional<std::string> compare(const std::vector<T> &got, const std::vector<T> &want,
                                   double relative = 0.0) {
  if (got.size() != want.size())
    return fmt::format("got {} elements, want {}", got.size(), want.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double w = static_cast<double>(want[i]);
    const double tol = relative * std::max(1.0, std::fabs(w));
    if (!(got[i] == want[i] || (relative > 0.0 && close<T>(got[i], w, tol))))
      return fmt::format("element {}: got {}, want {}", i, got[i], want[i]);
  }
  return std::nullopt;
}

/// The sizes each operation runs at: a count of elements, or of bytes (then elements = bytes /
/// the element size).
struct Size {
  const char *name;
  uint64_t bytes;  // 0: use elements
  uint64_t elements;
  [[nodiscard]] constexpr uint64_t elements_of(uint64_t element_bytes) const {
    return bytes != 0 ? bytes / element_bytes : elements;
  }
};
inline constexpr Size kSizes[] = {{"tiny", 0, 7}, {"small", 0, 4099}, {"medium", 0, 1u << 20},
                                  {"large", 256ull << 20, 0}};

}  // namespace kiln::ops

#endif  // KILN_TOOLS_KILN_OPS_CASE_SUPPORT_H_
