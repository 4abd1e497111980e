// The CPU matmul of the device runtime: cache-blocked and register-tiled, for f32 and f64.
//
// Freestanding C++17 (no libc, no std, no allocation): included by kiln_runtime.cpp, which is
// compiled by clang-19 to bitcode for the host (JIT-compiled later for the exact host CPU) and by
// the host C++ compiler into the fake GPU drivers. It is CPU-only: kiln_runtime.cpp includes it
// outside the nvptx/amdgcn builds, whose matmul keeps its own loop.
//
// Algorithm: the layered blocking of K. Goto and R. A. van de Geijn, "Anatomy of
// High-Performance Matrix Multiplication", ACM TOMS 34(3), 2008, as structured by BLIS
// (F. G. Van Zee and R. A. van de Geijn, "BLIS: A Framework for Rapidly Instantiating BLAS
// Functionality", ACM TOMS 41(3), 2015): for each kc-deep slab of the k dimension and each
// block of mc rows of A (kept in L2), each NR-wide column strip of B is packed into a kc x NR
// micro-panel (L1-resident), and an MR x NR micro-kernel sweeps the block's rows, keeping its
// tile of C in registers for the whole kc loop (MR * NR / lanes vector accumulators, NR / lanes
// vector loads of B and MR broadcasts of A per step). Written from the papers' description. One
// departure: A is not packed but read in place (MR row streams), which keeps the stack to the B
// micro-panel; measured as fast as packing A into a 96 KiB stack buffer on this machine
// (kiln-matmul-bench, AMD EPYC, 2 threads).
//
// Vectorization: the micro-kernel uses GCC/clang vector types of 64 bytes (16 f32 / 8 f64),
// which keep their width in the IR wherever vectorization happens; the JIT lowers each 64-byte
// operation to one AVX-512 instruction, two AVX2 ones or four SSE ones, whatever the host has;
// a*b+c is contracted to llvm.fmuladd, an FMA on a host that has one. The tile (6 x 32 f32,
// 6 x 16 f64: 12 accumulators of 64 bytes) is sized for AVX-512's 32 vector registers; an AVX2
// host runs it correctly, with some register spills.
//
// Results: the same C = A @ B, summed in a different order than the i-k-j loop (kc-long FMA
// chains per element, added to C slab by slab). Every summation order of a k-term dot product,
// with or without FMA, is within gamma_k * (|A||B|)_ij of the exact value, gamma_k = k*u/(1-k*u),
// u = eps/2 (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., 3.1 and 3.5), so
// this kernel, the naive loop and OpenBLAS pairwise agree within k * eps * (|A||B|)_ij per
// element (for k * eps < 1). test/unit checks that bound against a double-precision reference;
// kiln-matmul-bench prints it against OpenBLAS.
//
// Memory: the packed B micro-panel lives on the calling thread's stack: 32 KiB per running task
// (plus a 768-byte edge tile; the kernel calls nothing, so that is its whole frame).
// Thread-safety: a call reads A and B and writes only rows [row_begin, row_end) of C, so tasks on
// disjoint row ranges run concurrently.
#ifndef KILN_RUNTIME_DEVICE_CPU_MATMUL_H_
#define KILN_RUNTIME_DEVICE_CPU_MATMUL_H_

#include <stdint.h>

namespace kiln_cpu_matmul {

/// The 64-byte vector of T (16 f32 or 8 f64), usable at any address of a T and allowed to alias T
/// (so a pointer cast is a valid unaligned load or store).
template <class T>
struct Blocking;

template <>
struct Blocking<float> {
  typedef float Vec __attribute__((vector_size(64), aligned(4), may_alias));
};
template <>
struct Blocking<double> {
  typedef double Vec __attribute__((vector_size(64), aligned(8), may_alias));
};

/// Blocking sizes in elements. kLanes per vector; MR x NR register tile (NR = 2 vectors); a packed
/// B micro-panel is kKc x NR (32 KiB, fits L1); an A block kMc x kKc (192 KiB f32, 384 KiB f64,
/// read in place, stays in L2) is swept once per B micro-panel.
template <class T>
struct Sizes {
  static constexpr int64_t kLanes = 64 / static_cast<int64_t>(sizeof(T));
  static constexpr int64_t kMr = 6;
  static constexpr int64_t kNr = 2 * kLanes;
  static constexpr int64_t kKc = 256;
  static constexpr int64_t kMc = 192;
};

template <class T>
using Vec = typename Blocking<T>::Vec;

/// The vector at `p` (any T address), for loads and stores. Vectors are never passed by value,
/// so no function's ABI depends on the target's vector registers.
template <class T>
inline Vec<T> *vec_at(T *p) {
  return reinterpret_cast<Vec<T> *>(p);
}
template <class T>
inline const Vec<T> *vec_at(const T *p) {
  return reinterpret_cast<const Vec<T> *>(p);
}

/// Packs the kc x nr block of row-major B at `b` (row stride ldb) into out[p*NR + j], j < NR;
/// columns past nr are zero.
template <class T>
void pack_b(const T *b, int64_t ldb, int64_t kc, int64_t nr, T *__restrict out) {
  constexpr int64_t kNr = Sizes<T>::kNr;
  if (nr == kNr) {
    for (int64_t p = 0; p < kc; ++p) {
      const T *row = b + p * ldb;
      for (int64_t v = 0; v < kNr; v += Sizes<T>::kLanes) *vec_at(out + p * kNr + v) = *vec_at(row + v);
    }
    return;
  }
  for (int64_t p = 0; p < kc; ++p) {
    for (int64_t j = 0; j < kNr; ++j) out[p * kNr + j] = j < nr ? b[p * ldb + j] : T(0);
  }
}

/// The MR x NR tile of C at `c` (row stride ldc) = (accumulate ? C : 0) + A-sliver x B-panel over
/// kc, writing only the first mr rows and nr columns. A is read in place: row r of the sliver at
/// a + r * lda, columns [0, kc) (rows r >= mr are never read: row 0 stands in for them and their
/// results are dropped). `b`: one packed B micro-panel (pack_b).
template <class T>
void micro_kernel(int64_t kc, const T *a, int64_t lda, const T *__restrict b, T *c, int64_t ldc,
                  int64_t mr, int64_t nr, bool accumulate) {
  constexpr int64_t kMr = Sizes<T>::kMr;
  constexpr int64_t kNr = Sizes<T>::kNr;
  constexpr int64_t kLanes = Sizes<T>::kLanes;
  const T *rows[kMr];
  for (int64_t r = 0; r < kMr; ++r) rows[r] = a + (r < mr ? r : 0) * lda;
  Vec<T> acc0[kMr] = {}, acc1[kMr] = {};
  for (int64_t p = 0; p < kc; ++p) {
    const Vec<T> b0 = *vec_at(b + p * kNr);
    const Vec<T> b1 = *vec_at(b + p * kNr + kLanes);
    for (int64_t r = 0; r < kMr; ++r) {
      const T x = rows[r][p];
      acc0[r] = x * b0 + acc0[r];
      acc1[r] = x * b1 + acc1[r];
    }
  }
  if (mr == kMr && nr == kNr) {
    for (int64_t r = 0; r < kMr; ++r) {
      T *row = c + r * ldc;
      if (accumulate) {
        *vec_at(row) += acc0[r];
        *vec_at(row + kLanes) += acc1[r];
      } else {
        *vec_at(row) = acc0[r];
        *vec_at(row + kLanes) = acc1[r];
      }
    }
    return;
  }
  T tile[kMr * kNr];
  for (int64_t r = 0; r < kMr; ++r) {
    *vec_at(tile + r * kNr) = acc0[r];
    *vec_at(tile + r * kNr + kLanes) = acc1[r];
  }
  for (int64_t r = 0; r < mr; ++r) {
    for (int64_t j = 0; j < nr; ++j)
      c[r * ldc + j] = accumulate ? c[r * ldc + j] + tile[r * kNr + j] : tile[r * kNr + j];
  }
}

/// C[i, :] = A[i, :] @ B for the rows i in [row_begin, row_end) of row-major C (m x n), A (m x k)
/// and B (k x n); k >= 1. Rows outside the range are neither read nor written. No errors.
template <class T>
void gemm_rows(T *c, const T *a, const T *b, int64_t n, int64_t k, int64_t row_begin,
               int64_t row_end) {
  constexpr int64_t kMr = Sizes<T>::kMr, kNr = Sizes<T>::kNr;
  constexpr int64_t kKc = Sizes<T>::kKc, kMc = Sizes<T>::kMc;
  alignas(64) T b_packed[kKc * kNr];
  for (int64_t pc = 0; pc < k; pc += kKc) {
    const int64_t kc = k - pc < kKc ? k - pc : kKc;
    for (int64_t ic = row_begin; ic < row_end; ic += kMc) {
      const int64_t mc = row_end - ic < kMc ? row_end - ic : kMc;
      for (int64_t jr = 0; jr < n; jr += kNr) {
        const int64_t nr = n - jr < kNr ? n - jr : kNr;
        pack_b(b + pc * n + jr, n, kc, nr, b_packed);
        for (int64_t ir = 0; ir < mc; ir += kMr) {
          const int64_t mr = mc - ir < kMr ? mc - ir : kMr;
          micro_kernel(kc, a + (ic + ir) * k + pc, k, b_packed, c + (ic + ir) * n + jr, n, mr,
                       nr, pc > 0);
        }
      }
    }
  }
}

}  // namespace kiln_cpu_matmul

#endif  // KILN_RUNTIME_DEVICE_CPU_MATMUL_H_
