// The bodies of the GPU entry points kiln_<op>_<dtype>_gpu, written once as templates over an
// execution context, so that the same code runs on the GPU (runtime/device/kiln_runtime.cpp,
// nvptx64 and amdgcn) and in the fake CUDA/HIP drivers on the host (test/fake_gpu/
// fake_kernels.cpp), which therefore check exactly what a GPU computes.
//
// Freestanding C++17 (stdint only), valid for clang-19's device build and for the host g++.
//
// Execution model: a kernel body runs for ONE block of ctx.block_threads() threads. It is a
// sequence of phases separated by ctx.barrier() and closed by ctx.end(); each phase is
// `ctx.each_thread([&](int32_t tid) { ... })`. On a GPU each_thread calls the lambda once with the
// hardware thread index, barrier() is the block barrier and end() does nothing. The host
// emulation (test/fake_gpu/fake_kernels.cpp) keeps the phases until the next barrier() or end()
// and then runs them thread by thread (thread 0 all its phases, then thread 1, ...), a valid
// order of a GPU's threads between two barriers in which a read of another thread's shared
// write with no barrier between them sees the old value: a missing barrier gives wrong results
// there too. Rules that keep both the same:
// - code outside each_thread is uniform (every thread computes the same value), so every thread
//   reaches every barrier (no barrier under a thread-dependent branch);
// - state a thread carries from one phase to the next lives in `typename Ctx::template
//   Private<T>` (a register on the GPU, one slot per thread on the host), indexed by tid;
// - threads exchange data only through ctx.shared<T>() (at least kGpuSharedBytes, addrspace(3)
//   on the GPU) with a barrier between the write and the read;
// - a phase captures by value each uniform local that changes before the next barrier() or
//   end() (a loop variable; the emulation runs the phase only there), and every body ends with
//   ctx.end() on each path that ran a phase.
//
// The Ctx interface: int64_t block(), blocks() (the grid size in blocks); int32_t
// block_threads(); int64_t global_index(tid) (block * block_threads + tid); int64_t
// grid_threads() (blocks * block_threads); each_thread(f); barrier(); end(); template <class T> T
// *shared(); template <class T> struct Private { T &operator()(int32_t tid); }.
#ifndef KILN_RUNTIME_DEVICE_GPU_KERNELS_H_
#define KILN_RUNTIME_DEVICE_GPU_KERNELS_H_

#include <stdint.h>

#include "kiln/runtime/kernel_abi.h"
#include "dtype_arith.h"

namespace kiln_gpu {

/// Threads per block the launcher uses and the most any GPU kernel here supports (the codegen
/// declares flat-work-group-size 1,256 / maxntid 256).
constexpr int32_t kMaxBlockThreads = 256;
/// Bytes of block-shared memory a context provides: 2 tiles of 16x16 doubles (matmul f64).
constexpr int32_t kGpuSharedBytes = 4096;
/// Side of the square matmul tile: one C element per thread, kTile * kTile == kMaxBlockThreads.
constexpr int32_t kTile = 16;
static_assert(kTile * kTile == kMaxBlockThreads, "one matmul C element per thread");

// Per-dtype arithmetic: dtype_arith.h, the same code as kiln_runtime.cpp's range kernels.
using kiln_device::Arith;
using kiln_device::operand;
using kiln_device::SumTraits;

/// Records KILN_DEVICE_ASSERTION (arg0 = `what`, arg1/arg2 = the figures) unless an error was
/// recorded first. `message` is a short NUL-terminated text. Thread-safe (CAS on error_code).
inline void gpu_record_assertion(KilnRuntime *rt, uint64_t what, uint64_t arg1, uint64_t arg2,
                                 const char *message) {
  if (__sync_val_compare_and_swap(&rt->error_code, int32_t{KILN_DEVICE_OK},
                                  int32_t{KILN_DEVICE_ASSERTION}) != KILN_DEVICE_OK) {
    return;
  }
  rt->error_arg0 = what;
  rt->error_arg1 = arg1;
  rt->error_arg2 = arg2;
  uint64_t i = 0;
  for (; message[i] != '\0' && i + 1 < sizeof(rt->error_message); ++i) {
    rt->error_message[i] = message[i];
  }
  rt->error_message[i] = '\0';
}

/// arg0 of the KILN_DEVICE_ASSERTION a GPU kernel records.
enum GpuAssertion : uint64_t {
  kMoreBlocksThanSlots = 1,  ///< reduce_sum: blocks() > num_tasks (result slots); arg1, arg2
  kMatmulBlockShape = 2,     ///< matmul: block_threads() != kTile * kTile; arg1 = threads
};

// --- element-wise kernels: grid-stride loops --------------------------------------------------
//
// Thread g of the grid handles elements g, g + G, g + 2G, ... (G = grid_threads()), so in every
// step the threads of a warp touch consecutive elements (coalesced) and any grid size covers all
// n elements (the launcher bounds the grid; see GpuKernelLauncher::kMaxGridBlocks). Pattern:
// M. Harris, "CUDA Pro Tip: Write Flexible Kernels with Grid-Stride Loops", NVIDIA blog, 2013.

template <class T, class Ctx>
void fill_gpu(Ctx &ctx, KilnRuntime *, const KilnKernelArgs *args, KilnKernelFn) {
  T *out = operand<T>(args, 0);
  const T value = Arith<T>::scalar(args);
  const int64_t n = args->iteration_size;
  const int64_t stride = ctx.grid_threads();
  ctx.each_thread([&](int32_t tid) {
    for (int64_t i = ctx.global_index(tid); i < n; i += stride) out[i] = value;
  });
  ctx.end();
}

template <class T, class Ctx>
void copy_gpu(Ctx &ctx, KilnRuntime *, const KilnKernelArgs *args, KilnKernelFn) {
  T *dst = operand<T>(args, 0);
  const T *src = operand<T>(args, 1);
  const int64_t n = args->iteration_size;
  const int64_t stride = ctx.grid_threads();
  ctx.each_thread([&](int32_t tid) {
    for (int64_t i = ctx.global_index(tid); i < n; i += stride) dst[i] = src[i];
  });
  ctx.end();
}

template <class T, class Ctx>
void axpy_gpu(Ctx &ctx, KilnRuntime *, const KilnKernelArgs *args, KilnKernelFn) {
  using A = Arith<T>;
  T *y = operand<T>(args, 0);
  const T *x = operand<T>(args, 1);
  const T alpha = A::scalar(args);
  const int64_t n = args->iteration_size;
  const int64_t stride = ctx.grid_threads();
  ctx.each_thread([&](int32_t tid) {
    for (int64_t i = ctx.global_index(tid); i < n; i += stride) {
      y[i] = A::add(A::mul(alpha, x[i]), y[i]);
    }
  });
  ctx.end();
}

// --- reduce_sum: grid-stride partials, then a tree in shared memory, one partial per block ------
//
// Each thread sums its grid-stride elements; the block then halves the live partials in shared
// memory until one remains (the "sequential addressing" tree of M. Harris, "Optimizing Parallel
// Reduction in CUDA", NVIDIA 2007), with a barrier before every step. Shared memory only, no
// warp shuffles: the Acc is 64-bit (double or wrapping u64) on every dtype, which a shuffle moves
// as two 32-bit halves, and the tree over 256 partials is a small part of a bandwidth-bound pass.
// Block b writes its partial into result slot b (args->num_tasks >= blocks(), else
// KILN_DEVICE_ASSERTION kMoreBlocksThanSlots). Any block size 1..kMaxBlockThreads works.

/// The smallest power of two >= `value` (value >= 1).
inline int32_t gpu_ceil_pow2(int32_t value) {
  int32_t p = 1;
  while (p < value) p *= 2;
  return p;
}

template <class T, class Ctx>
void reduce_sum_gpu(Ctx &ctx, KilnRuntime *rt, const KilnKernelArgs *args, KilnKernelFn) {
  using S = SumTraits<T>;
  using Acc = typename S::Acc;
  if (ctx.blocks() > args->num_tasks) {  // uniform: the whole grid stops here
    gpu_record_assertion(rt, kMoreBlocksThanSlots, static_cast<uint64_t>(ctx.blocks()),
                         static_cast<uint64_t>(args->num_tasks),
                         "reduce_sum launched with more blocks than result slots");
    return;
  }
  const T *x = operand<T>(args, 0);
  const int64_t n = args->iteration_size;
  const int64_t stride = ctx.grid_threads();
  const int32_t threads = ctx.block_threads();
  Acc *partial = ctx.template shared<Acc>();
  ctx.each_thread([&](int32_t tid) {
    Acc acc = 0;
    for (int64_t i = ctx.global_index(tid); i < n; i += stride) acc = S::add(acc, x[i]);
    partial[tid] = acc;
  });
  for (int32_t half = gpu_ceil_pow2(threads) / 2; half > 0; half /= 2) {
    ctx.barrier();
    ctx.each_thread([&, half](int32_t tid) {  // by value: the loop halves it before the next barrier
      if (tid < half && tid + half < threads) {
        partial[tid] = S::combine(partial[tid], partial[tid + half]);
      }
    });
  }
  // Thread 0 wrote partial[0] in the last step itself, so no barrier is needed before it reads.
  ctx.each_thread([&](int32_t tid) {
    if (tid != 0) return;
    KilnTaskResult *slot = reinterpret_cast<KilnTaskResult *>(
                               static_cast<uintptr_t>(args->result_buffer)) +
                           ctx.block();
    slot->value_bits = S::bits(partial[0]);
  });
  ctx.end();
}

// --- matmul: 16x16 tiles through shared memory ------------------------------------------------
//
// C (m x n) = A (m x k) * B (k x n), row-major. Each block computes kTile x kTile tiles of C,
// tile t = (t / tile_cols, t % tile_cols), for t = block(), block() + blocks(), ... (a grid
// stride over tiles, so any grid size covers C); thread tid owns C element (tid / 16, tid % 16)
// of the tile. For each k-slab of 16 the block stages a 16x16 tile of A and of B in shared
// memory (coalesced loads: consecutive threads read consecutive columns; elements outside the
// matrices are 0, so any m, n, k >= 1 works), waits, and every thread accumulates 16 products
// from shared memory. The products are added in increasing p, like the CPU kernel's i-k-j loop.
// Tiling as in the CUDA C Programming Guide, "Shared Memory" (matrix multiplication example).
// Needs block_threads() == 256 (else KILN_DEVICE_ASSERTION kMatmulBlockShape).

template <class T, class Ctx>
void matmul_gpu(Ctx &ctx, KilnRuntime *rt, const KilnKernelArgs *args, KilnKernelFn) {
  using A = Arith<T>;
  if (ctx.block_threads() != kTile * kTile) {  // uniform
    gpu_record_assertion(rt, kMatmulBlockShape, static_cast<uint64_t>(ctx.block_threads()), 0,
                         "matmul needs blocks of 256 threads");
    return;
  }
  const int64_t m = static_cast<int64_t>(args->dims[0]);
  const int64_t n = static_cast<int64_t>(args->dims[1]);
  const int64_t k = static_cast<int64_t>(args->dims[2]);
  T *c = operand<T>(args, 0);
  const T *a = operand<T>(args, 1);
  const T *b = operand<T>(args, 2);
  const int64_t tile_rows = (m + kTile - 1) / kTile;
  const int64_t tile_cols = (n + kTile - 1) / kTile;
  const int64_t tiles = tile_rows * tile_cols;
  T *a_tile = ctx.template shared<T>();
  T *b_tile = a_tile + kTile * kTile;
  typename Ctx::template Private<T> acc;
  for (int64_t tile = ctx.block(); tile < tiles; tile += ctx.blocks()) {
    const int64_t row0 = tile / tile_cols * kTile;
    const int64_t col0 = tile % tile_cols * kTile;
    ctx.each_thread([&](int32_t tid) { acc(tid) = T(0); });
    for (int64_t p0 = 0; p0 < k; p0 += kTile) {
      ctx.each_thread([&](int32_t tid) {
        const int64_t ty = tid / kTile, tx = tid % kTile;
        const int64_t row = row0 + ty, a_col = p0 + tx;
        a_tile[tid] = row < m && a_col < k ? a[row * k + a_col] : T(0);
        const int64_t b_row = p0 + ty, col = col0 + tx;
        b_tile[tid] = b_row < k && col < n ? b[b_row * n + col] : T(0);
      });
      ctx.barrier();
      ctx.each_thread([&](int32_t tid) {
        const int32_t ty = tid / kTile, tx = tid % kTile;
        // The zero padding beyond k would add +0 products; stop at k so the sum is the CPU's.
        const int32_t depth = k - p0 < kTile ? static_cast<int32_t>(k - p0) : kTile;
        const T *a_row = a_tile + ty * kTile;
        const T *b_col = b_tile + tx;
        T sum = acc(tid);
        if (depth == kTile) {  // every slab but the last: a constant trip count, fully unrolled
          for (int32_t q = 0; q < kTile; ++q) sum = A::add(sum, A::mul(a_row[q], b_col[q * kTile]));
        } else {
          for (int32_t q = 0; q < depth; ++q) sum = A::add(sum, A::mul(a_row[q], b_col[q * kTile]));
        }
        acc(tid) = sum;
      });
      ctx.barrier();  // before the next slab overwrites the tiles
    }
    ctx.each_thread([&, row0, col0](int32_t tid) {  // by value: the next tile changes them
      const int64_t row = row0 + tid / kTile, col = col0 + tid % kTile;
      if (row < m && col < n) c[row * n + col] = acc(tid);
    });
  }
  ctx.end();
}

// --- compact_positive: one task per thread (unchanged) ------------------------------------------
//
// Thread g < num_tasks runs the range kernel on [split(g), split(g + 1)) of the iteration space
// (kiln_task_split_point), as before: the per-task heap blocks keep the output in order.

template <class T, class Ctx>
void compact_positive_gpu(Ctx &ctx, KilnRuntime *rt, const KilnKernelArgs *args,
                          KilnKernelFn range_kernel) {
  const int64_t num_tasks = args->num_tasks;
  const int64_t size = args->iteration_size;
  ctx.each_thread([&](int32_t tid) {
    const int64_t task = ctx.global_index(tid);
    if (task >= num_tasks) return;
    range_kernel(rt, args, kiln_task_split_point(size, task, num_tasks),
                 kiln_task_split_point(size, task + 1, num_tasks), task);
  });
  ctx.end();
}

}  // namespace kiln_gpu

#endif  // KILN_RUNTIME_DEVICE_GPU_KERNELS_H_
