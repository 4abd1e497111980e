// Kernels the unit tests share: operation-language sources (runtime/kernel_language.h) and LLVM IR
// user kernels in kiln's user-kernel ABI (kiln/runtime/kernel_abi.h).
#ifndef KILN_TEST_KERNEL_SOURCES_H_
#define KILN_TEST_KERNEL_SOURCES_H_

#include <string>

#include "kiln/runtime/kernel_language.h"

namespace kiln::test {

/// z[i] = (x[i] - y[i])^2 * scale: CuPy's squared difference, with a scalar; parameters x, y, z
/// (f32 pointers) and scale (f32). With `heap_scratch`, each element also takes 16 bytes from the
/// device heap: a user kernel that calls into kiln's device runtime.
inline std::string squared_diff_ir(bool heap_scratch = false) {
  std::string ir = "\ndeclare i64 @kiln_index(ptr)\n";
  if (heap_scratch) ir += "declare ptr @kiln_heap_allocate(ptr, i64, i64)\n";
  ir += "define void @squared_diff(ptr %ctx, ptr %x, ptr %y, ptr %z, float %scale) {\n"
        "  %i = call i64 @kiln_index(ptr %ctx)\n";
  if (heap_scratch) ir += "  %scratch = call ptr @kiln_heap_allocate(ptr %ctx, i64 16, i64 8)\n";
  ir += R"(  %px = getelementptr float, ptr %x, i64 %i
  %py = getelementptr float, ptr %y, i64 %i
  %pz = getelementptr float, ptr %z, i64 %i
  %a = load float, ptr %px
  %b = load float, ptr %py
  %d = fsub float %a, %b
  %s = fmul float %d, %d
  %r = fmul float %s, %scale
  store float %r, ptr %pz
  ret void
}
)";
  return ir;
}

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
