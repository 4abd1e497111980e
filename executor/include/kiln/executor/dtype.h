// Element types of ndarrays.
#ifndef KILN_EXECUTOR_DTYPE_H_
#define KILN_EXECUTOR_DTYPE_H_

#include <cstdint>
#include <string_view>

#include "kiln/rhi/result.h"

namespace kiln {

enum class DataType : uint8_t { f32, f64, i32, i64 };
inline constexpr DataType kAllDataTypes[] = {DataType::f32, DataType::f64, DataType::i32,
                                             DataType::i64};

/// Whether `dtype` is one of kAllDataTypes (a value cast from an integer may not be).
[[nodiscard]] constexpr bool is_valid(DataType dtype) {
  for (DataType d : kAllDataTypes)
    if (d == dtype) return true;
  return false;
}
/// Bytes per element.
[[nodiscard]] constexpr uint64_t itemsize(DataType dtype) {
  return (dtype == DataType::f32 || dtype == DataType::i32) ? 4 : 8;
}
[[nodiscard]] constexpr bool is_floating(DataType dtype) {
  return dtype == DataType::f32 || dtype == DataType::f64;
}
/// "f32", "f64", "i32", "i64": also the suffix of the kernel names.
[[nodiscard]] constexpr std::string_view to_string(DataType dtype) {
  switch (dtype) {
    case DataType::f32: return "f32";
    case DataType::f64: return "f64";
    case DataType::i32: return "i32";
    case DataType::i64: return "i64";
  }
  return "?";
}
/// "f32" -> DataType::f32; anything else -> invalid_usage.
[[nodiscard]] RhiExpected<DataType> parse_dtype(std::string_view name);

/// A scalar operand: `f64` is used for floating dtypes, `i64` for integer ones.
struct Scalar {
  double f64 = 0.0;
  int64_t i64 = 0;
  /// `i64` is v truncated toward zero, or 0 when v is not finite or out of int64's range.
  [[nodiscard]] static Scalar of(double v) {
    const bool fits = v > -9223372036854775808.0 && v < 9223372036854775808.0;  // NaN fails both
    return Scalar{v, fits ? static_cast<int64_t>(v) : 0};
  }
  [[nodiscard]] static Scalar of_int(int64_t v) { return Scalar{static_cast<double>(v), v}; }
};

}  // namespace kiln

#endif  // KILN_EXECUTOR_DTYPE_H_
