// Per-dtype element arithmetic and operand access of the device runtime's kernels, shared by the
// CPU range kernels (kiln_runtime.cpp) and the GPU kernel bodies (gpu_kernels.h, which the fake
// CUDA/HIP drivers compile for the host too), so every backend computes the same values.
//
// Freestanding C++17 (stdint only). Integer arithmetic is done in the unsigned type of the same
// width, so overflow wraps instead of being undefined behaviour.
#ifndef KILN_RUNTIME_DEVICE_DTYPE_ARITH_H_
#define KILN_RUNTIME_DEVICE_DTYPE_ARITH_H_

#include <stdint.h>

#include "kiln/runtime/kernel_abi.h"

namespace kiln_device {

/// Scalar operand and element arithmetic per dtype: plain IEEE operations for floating types,
/// wrapping for integers (the specializations below).
template <class T>
struct Arith {
  static T scalar(const KilnKernelArgs *args) { return static_cast<T>(args->scalar_f64); }
  static T add(T a, T b) { return a + b; }
  static T mul(T a, T b) { return a * b; }
};

template <class T, class U>
struct WrappingArith {
  static T scalar(const KilnKernelArgs *args) { return static_cast<T>(args->scalar_i64); }
  static T add(T a, T b) { return static_cast<T>(static_cast<U>(a) + static_cast<U>(b)); }
  static T mul(T a, T b) { return static_cast<T>(static_cast<U>(a) * static_cast<U>(b)); }
};

template <>
struct Arith<int32_t> : WrappingArith<int32_t, uint32_t> {};
template <>
struct Arith<int64_t> : WrappingArith<int64_t, uint64_t> {};

/// reduce_sum partials: floating dtypes accumulate in double, integer dtypes in wrapping 64-bit;
/// the host adds the partials the same way (executor/src/ops.cpp).
template <class T>
struct SumTraits {
  using Acc = double;
  static Acc add(Acc acc, T x) { return acc + static_cast<double>(x); }
  static Acc combine(Acc a, Acc b) { return a + b; }
  static uint64_t bits(Acc acc) { return __builtin_bit_cast(uint64_t, acc); }
};

template <class T>
struct IntSumTraits {
  using Acc = uint64_t;
  static Acc add(Acc acc, T x) { return acc + static_cast<uint64_t>(static_cast<int64_t>(x)); }
  static Acc combine(Acc a, Acc b) { return a + b; }
  static uint64_t bits(Acc acc) { return acc; }
};

template <>
struct SumTraits<int32_t> : IntSumTraits<int32_t> {};
template <>
struct SumTraits<int64_t> : IntSumTraits<int64_t> {};

/// Array operand `index` of a launch (KilnKernelArgs::ptr) as a T pointer.
template <class T>
T *operand(const KilnKernelArgs *args, int index) {
  return reinterpret_cast<T *>(static_cast<uintptr_t>(args->ptr[index]));
}

}  // namespace kiln_device

#endif  // KILN_RUNTIME_DEVICE_DTYPE_ARITH_H_
