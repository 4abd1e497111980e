// Operation-language kernels the unit tests share (runtime/kernel_language.h).
#ifndef KILN_TEST_KERNEL_SOURCES_H_
#define KILN_TEST_KERNEL_SOURCES_H_

#include "kiln/runtime/kernel_language.h"

namespace kiln::test {

/// y = sum of x * x over int64 (exact: any split and order gives the same value).
inline runtime::ReductionSource sum_of_squares_i64() {
  runtime::ReductionSource source;
  source.name = "sum_squares";
  source.map_expr = "x * x";
  source.reduce_expr = "a + b";
  source.post_map_expr = "y = a";
  source.identity = "0";
  source.inputs = {{"x", runtime::UserValueType::i64, true, false, {}}};
  source.outputs = {{"y", runtime::UserValueType::i64, true, true, {}}};
  source.reduce_type = runtime::UserValueType::i64;
  return source;
}

}  // namespace kiln::test

#endif  // KILN_TEST_KERNEL_SOURCES_H_
