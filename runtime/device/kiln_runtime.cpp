// The kiln device runtime module: the kernels and the device heap allocator.
//
// Freestanding C++17 (no libc, no std headers, no exceptions, no RTTI), compiled at build time by
// clang-19 into LLVM bitcode once per target triple (see cmake/KilnDeviceBitcode.cmake). It
// implements exactly the ABI of kiln/runtime/kernel_abi.h. On the CPU, several host threads run
// kernels concurrently on disjoint [begin, end) ranges with distinct task indices, so everything
// shared (the heap bump offset, the error area) is updated with atomics.
//
// Integer arithmetic is done in the unsigned type of the same width, so overflow wraps instead
// of being undefined behaviour.
#include <stddef.h>
#include <stdint.h>

#include "kiln/runtime/kernel_abi.h"
#include "dtype_arith.h"

#if !defined(__NVPTX__) && !defined(__AMDGCN__)
#include "cpu_matmul.h"  // the CPU's blocked f32/f64 matmul
#endif

namespace {

// --- tiny freestanding string helpers ------------------------------------------------------------

/// Appends NUL-terminated `text` to `out` at `*pos`, never writing past `capacity - 1`.
void append_text(char *out, size_t capacity, size_t *pos, const char *text) {
  while (*text != '\0' && *pos + 1 < capacity) out[(*pos)++] = *text++;
  out[*pos] = '\0';
}

/// Appends `value` in decimal to `out` at `*pos`, truncating at `capacity - 1`.
void append_u64(char *out, size_t capacity, size_t *pos, uint64_t value) {
  char digits[21];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0);
  char reversed[21];
  for (int i = 0; i < n; ++i) reversed[i] = digits[n - 1 - i];
  reversed[n] = '\0';
  append_text(out, capacity, pos, reversed);
}

// --- error recording -----------------------------------------------------------------------------
//
// Atomics use the __sync builtins on purpose: clang lowers them to native LLVM atomic instructions
// on every target, whereas the __atomic builtins become __atomic_* library calls on
// nvptx64-nvidia-cuda outside CUDA mode (its max inline atomic width is 0 there).

/// Claims the error area for `code` if no error was recorded yet (the first error wins).
/// Returns true if this call won and must fill in the arguments and the message.
bool claim_error(KilnRuntime *rt, int32_t code) {
  return __sync_val_compare_and_swap(&rt->error_code, int32_t{KILN_DEVICE_OK}, code) ==
         KILN_DEVICE_OK;
}

void record_heap_exhausted(KilnRuntime *rt, uint64_t requested, uint64_t used, uint64_t size) {
  if (!claim_error(rt, KILN_DEVICE_HEAP_EXHAUSTED)) return;
  rt->error_arg0 = requested;
  rt->error_arg1 = used;
  rt->error_arg2 = size;
  const size_t cap = sizeof(rt->error_message);
  size_t pos = 0;
  append_text(rt->error_message, cap, &pos, "device heap exhausted: requested ");
  append_u64(rt->error_message, cap, &pos, requested);
  append_text(rt->error_message, cap, &pos, " B, used ");
  append_u64(rt->error_message, cap, &pos, used);
  append_text(rt->error_message, cap, &pos, " of ");
  append_u64(rt->error_message, cap, &pos, size);
  append_text(rt->error_message, cap, &pos, " B");
}

void record_bad_alignment(KilnRuntime *rt, uint64_t alignment) {
  if (!claim_error(rt, KILN_DEVICE_BAD_ALIGNMENT)) return;
  rt->error_arg0 = alignment;
  rt->error_arg1 = 0;
  rt->error_arg2 = 0;
  const size_t cap = sizeof(rt->error_message);
  size_t pos = 0;
  append_text(rt->error_message, cap, &pos, "device heap alignment is not a power of two: ");
  append_u64(rt->error_message, cap, &pos, alignment);
}

// Per-dtype arithmetic (Arith, SumTraits) and operand access: dtype_arith.h, shared with the GPU
// kernels of gpu_kernels.h.
using kiln_device::Arith;
using kiln_device::operand;
using kiln_device::SumTraits;

KilnTaskResult *result_slot(const KilnKernelArgs *args, int64_t task_index) {
  return reinterpret_cast<KilnTaskResult *>(static_cast<uintptr_t>(args->result_buffer)) +
         task_index;
}

}  // namespace

// --- device heap ---------------------------------------------------------------------------------

/// Bump-allocates `size` bytes aligned to `alignment` from the runtime's heap chunk.
/// Always sets *result = 0 first; on success writes the device address of the block.
/// Errors (recorded in the runtime's error area, first error wins): KILN_DEVICE_BAD_ALIGNMENT
/// (alignment not a power of two; arg0 = alignment), KILN_DEVICE_HEAP_EXHAUSTED (arg0 = size,
/// arg1 = heap bytes used, arg2 = heap size). Thread-safe (atomic CAS loop on heap_used_bytes).
/// A zero-byte request succeeds with an aligned address and consumes only the padding.
extern "C" void runtime_memory_allocate_aligned(KilnRuntime *rt, uint64_t size, uint64_t alignment,
                                                uint64_t *result) {
  *result = 0;
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    record_bad_alignment(rt, alignment);
    return;
  }
  const uint64_t base = rt->heap_base;
  const uint64_t heap_size = rt->heap_size_bytes;
  uint64_t used = __sync_fetch_and_add(&rt->heap_used_bytes, uint64_t{0});  // atomic read
  for (;;) {
    // Align the absolute address, then check the block fits without any unsigned overflow.
    const uint64_t unaligned = base + used;
    const uint64_t aligned = (unaligned + (alignment - 1)) & ~(alignment - 1);
    const uint64_t offset = aligned - base;
    if (used > heap_size || aligned < unaligned || offset > heap_size ||
        size > heap_size - offset) {
      record_heap_exhausted(rt, size, used, heap_size);
      return;
    }
    const uint64_t seen = __sync_val_compare_and_swap(&rt->heap_used_bytes, used, offset + size);
    if (seen == used) {
      *result = aligned;
      return;
    }
    used = seen;  // another task allocated first; retry from its offset
  }
}

// --- the user-kernel ABI (kernel_abi.h): what a user module's element functions call ----------

extern "C" int64_t kiln_index(const KilnUserContext *context) { return context->index; }

extern "C" int64_t kiln_count(const KilnUserContext *context) { return context->count; }

extern "C" void *kiln_heap_allocate(const KilnUserContext *context, uint64_t size_bytes,
                                    uint64_t alignment_bytes) {
  uint64_t address = 0;
  runtime_memory_allocate_aligned(context->runtime, size_bytes, alignment_bytes, &address);
  return reinterpret_cast<void *>(static_cast<uintptr_t>(address));
}

extern "C" void kiln_assert(const KilnUserContext *context, int32_t condition, const char *message) {
  if (condition != 0) return;
  KilnRuntime *rt = context->runtime;
  if (!claim_error(rt, KILN_DEVICE_ASSERTION)) return;
  rt->error_arg0 = static_cast<uint64_t>(context->index);
  rt->error_arg1 = 0;
  rt->error_arg2 = 0;
  size_t pos = 0;
  append_text(rt->error_message, sizeof(rt->error_message), &pos, "element ");
  append_u64(rt->error_message, sizeof(rt->error_message), &pos, static_cast<uint64_t>(context->index));
  append_text(rt->error_message, sizeof(rt->error_message), &pos, ": ");
  append_text(rt->error_message, sizeof(rt->error_message), &pos, message != nullptr ? message : "");
}

// --- kernels -------------------------------------------------------------------------------------

namespace {

template <class T>
void fill(KilnRuntime *, const KilnKernelArgs *args, int64_t begin, int64_t end, int64_t) {
  T *__restrict out = operand<T>(args, 0);
  const T value = Arith<T>::scalar(args);
  for (int64_t i = begin; i < end; ++i) out[i] = value;
}

template <class T>
void copy(KilnRuntime *, const KilnKernelArgs *args, int64_t begin, int64_t end, int64_t) {
  T *__restrict dst = operand<T>(args, 0);
  const T *__restrict src = operand<T>(args, 1);
  for (int64_t i = begin; i < end; ++i) dst[i] = src[i];
}

template <class T>
void axpy(KilnRuntime *, const KilnKernelArgs *args, int64_t begin, int64_t end, int64_t) {
  T *__restrict y = operand<T>(args, 0);
  const T *__restrict x = operand<T>(args, 1);
  const T alpha = Arith<T>::scalar(args);
  for (int64_t i = begin; i < end; ++i) y[i] = Arith<T>::add(Arith<T>::mul(alpha, x[i]), y[i]);
}

template <class T>
void reduce_sum(KilnRuntime *, const KilnKernelArgs *args, int64_t begin, int64_t end,
                int64_t task_index) {
  // 32 independent partial sums break the loop-carried dependency so the lanes vectorize
  // (strict left-to-right order would leave the loop bound by add latency): four vectors of
  // eight doubles in flight even at AVX-512 width, enough to reach the read bandwidth (kiln-bench
  // baseline_read_sum); they are combined in a fixed order, so a result is reproducible for a
  // given task split.
  constexpr int kLanes = 32;
  using Acc = typename SumTraits<T>::Acc;
  const T *__restrict x = operand<T>(args, 0);
  Acc lanes[kLanes] = {};
  int64_t i = begin;
  for (; i + kLanes <= end; i += kLanes)
    for (int lane = 0; lane < kLanes; ++lane) lanes[lane] = SumTraits<T>::add(lanes[lane], x[i + lane]);
  Acc acc = 0;
  for (; i < end; ++i) acc = SumTraits<T>::add(acc, x[i]);
  for (int lane = 0; lane < kLanes; ++lane) acc = SumTraits<T>::combine(acc, lanes[lane]);
  result_slot(args, task_index)->value_bits = SumTraits<T>::bits(acc);
}

/// C[i, :] = A[i, :] * B for the rows i in [begin, end). On the CPU f32 and f64 run the blocked
/// kernel of cpu_matmul.h (its header says the tolerance against this loop); the integer dtypes
/// and the GPU builds run the i-k-j loop (the inner loop vectorizes; integers wrap).
template <class T>
void matmul(KilnRuntime *, const KilnKernelArgs *args, int64_t begin, int64_t end, int64_t) {
  const int64_t n = static_cast<int64_t>(args->dims[1]);
  const int64_t k = static_cast<int64_t>(args->dims[2]);
  T *__restrict c = operand<T>(args, 0);
  const T *__restrict a = operand<T>(args, 1);
  const T *__restrict b = operand<T>(args, 2);
#if !defined(__NVPTX__) && !defined(__AMDGCN__)
  if constexpr (__is_same(T, float) || __is_same(T, double)) {
    if (k > 0) {  // k == 0 (C = 0) takes the loop below
      kiln_cpu_matmul::gemm_rows<T>(c, a, b, n, k, begin, end);
      return;
    }
  }
#endif
  for (int64_t i = begin; i < end; ++i) {
    T *__restrict c_row = c + i * n;
    for (int64_t j = 0; j < n; ++j) c_row[j] = T(0);
    for (int64_t p = 0; p < k; ++p) {
      const T a_ip = a[i * k + p];
      const T *__restrict b_row = b + p * n;
      for (int64_t j = 0; j < n; ++j) {
        c_row[j] = Arith<T>::add(c_row[j], Arith<T>::mul(a_ip, b_row[j]));
      }
    }
  }
}

/// Copies the elements > 0 of x[begin, end) in order into a fresh heap block and writes
/// {address, count} into the task's result slot. Nothing is allocated when count == 0.
template <class T>
void compact_positive(KilnRuntime *rt, const KilnKernelArgs *args, int64_t begin, int64_t end,
                      int64_t task_index) {
  const T *__restrict x = operand<T>(args, 0);
  uint64_t count = 0;
  for (int64_t i = begin; i < end; ++i) count += x[i] > T(0) ? 1 : 0;
  KilnTaskResult *slot = result_slot(args, task_index);
  if (count == 0) {
    slot->address = 0;
    slot->count = 0;
    return;
  }
  uint64_t address = 0;
  runtime_memory_allocate_aligned(rt, count * sizeof(T), /*alignment=*/64, &address);
  if (address == 0) return;  // the error is already recorded in rt
  T *__restrict out = reinterpret_cast<T *>(static_cast<uintptr_t>(address));
  uint64_t written = 0;
  for (int64_t i = begin; i < end; ++i) {
    if (x[i] > T(0)) out[written++] = x[i];
  }
  slot->address = address;
  slot->count = count;
}

}  // namespace

namespace {

// The C++ type of each dtype name used by KILN_FOR_EACH_KERNEL.
using dtype_f32 = float;
using dtype_f64 = double;
using dtype_i32 = int32_t;
using dtype_i64 = int64_t;

}  // namespace

// One extern "C" range kernel per (op, dtype); the signature is KilnKernelFn.
#define KILN_RANGE_KERNEL(op, dtype)                                                         \
  extern "C" void kiln_##op##_##dtype(KilnRuntime *rt, const KilnKernelArgs *args,          \
                                      int64_t begin, int64_t end, int64_t task_index) {     \
    op<dtype_##dtype>(rt, args, begin, end, task_index);                                     \
  }
KILN_FOR_EACH_KERNEL(KILN_RANGE_KERNEL)
#undef KILN_RANGE_KERNEL

// --- GPU entry points ----------------------------------------------------------------------------
//
// One kernel entry point kiln_<op>_<dtype>_gpu(rt, args) per range kernel; its body is the
// template <op>_gpu of gpu_kernels.h (shared with the fake drivers), run with the hardware
// context below. Launch geometry (see kernel_abi.h): element-wise kernels and reduce_sum
// grid-stride over the iteration space, reduce_sum writes one partial per block, matmul
// grid-strides over 16x16 tiles of C, compact_positive keeps one task per thread.
// They are plain extern "C" functions here, so the bitcode stays generic:
// - nvptx64: the PTX emitter (runtime/jit/ptx_codegen.cpp) marks every kiln_*_gpu function as a
//   kernel in nvvm.annotations and chooses the SM version when it emits PTX;
// - amdgcn: clang has no attribute for the amdgpu_kernel calling convention outside OpenCL
//   and HIP, so the build-time code-object generator (runtime/jit/amdgcn_codegen_main.cpp) sets
//   it on every kiln_*_gpu function in LLVM IR and chooses the gfx processor.
// Both read the block size from the hardware, not from a constant.
#if defined(__NVPTX__) || defined(__AMDGCN__)

#include "gpu_kernels.h"

namespace {

/// Block-shared memory (addrspace(3): PTX .shared, AMDGPU LDS), one array per element type a
/// kernel stages; loader_uninitialized because shared memory has no initializer on either target.
template <class T>
[[clang::loader_uninitialized]] __attribute__((address_space(3))) T
    gpu_shared_storage[kiln_gpu::kGpuSharedBytes / sizeof(T)];

/// The execution context of gpu_kernels.h on the hardware: indices from the special registers,
/// each_thread runs the phase once for this thread, barrier() is the block barrier.
struct HardwareContext {
  template <class T>
  struct Private {
    T value;
    T &operator()(int32_t) { return value; }
  };

  static int64_t block() {
#if defined(__NVPTX__)
    return static_cast<uint32_t>(__nvvm_read_ptx_sreg_ctaid_x());
#else
    return __builtin_amdgcn_workgroup_id_x();
#endif
  }
  static int64_t blocks() {
#if defined(__NVPTX__)
    return static_cast<uint32_t>(__nvvm_read_ptx_sreg_nctaid_x());
#else
    // grid_size_x counts work-items (the dispatch packet's grid size), not workgroups.
    return __builtin_amdgcn_grid_size_x() / __builtin_amdgcn_workgroup_size_x();
#endif
  }
  static int32_t block_threads() {
#if defined(__NVPTX__)
    return __nvvm_read_ptx_sreg_ntid_x();
#else
    // With code object v5 (-mcode-object-version=5) clang reads the workgroup size from the
    // implicit kernel arguments (hidden_group_size_x), which hipModuleLaunchKernel fills.
    return __builtin_amdgcn_workgroup_size_x();
#endif
  }
  static int32_t thread() {
#if defined(__NVPTX__)
    return __nvvm_read_ptx_sreg_tid_x();
#else
    return __builtin_amdgcn_workitem_id_x();
#endif
  }
  /// block * block_threads + tid in 64 bits (a grid may exceed 2^31 threads).
  static int64_t global_index(int32_t tid) { return block() * block_threads() + tid; }
  static int64_t grid_threads() { return blocks() * block_threads(); }

  template <class F>
  static void each_thread(F &&phase) {
    phase(thread());
  }
  /// Every thread of the block waits here; shared-memory writes before it are visible after it.
  static void barrier() {
#if defined(__NVPTX__)
    __nvvm_bar_sync(0);  // bar.sync 0 (__syncthreads): a CTA-wide barrier that orders memory
#else
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");
    __builtin_amdgcn_s_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");
#endif
  }
  /// The end of a kernel body: nothing to do on the hardware (the emulation runs its phases).
  static void end() {}
  template <class T>
  static T *shared() {
    return (T *)gpu_shared_storage<T>;  // addrspace(3) -> generic; LLVM infers it back
  }
};

}  // namespace

#define KILN_GPU_ENTRY(op, dtype)                                                            \
  extern "C" void kiln_##op##_##dtype##_gpu(KilnRuntime *rt, const KilnKernelArgs *args) {  \
    HardwareContext ctx;                                                                     \
    kiln_gpu::op##_gpu<dtype_##dtype>(ctx, rt, args, &kiln_##op##_##dtype);                 \
  }
KILN_FOR_EACH_KERNEL(KILN_GPU_ENTRY)
#undef KILN_GPU_ENTRY

// The geometry of a user kernel's grid-stride entry point (kiln_user_entry_gpu, which
// runtime/jit/user_module.cpp builds in LLVM IR for both GPU targets): this thread's first index
// and the grid's thread count, read from the hardware as the built-in kernels read them.
extern "C" int64_t kiln_grid_first_index() { return HardwareContext::global_index(HardwareContext::thread()); }
extern "C" int64_t kiln_grid_threads() { return HardwareContext::grid_threads(); }

#endif  // __NVPTX__ || __AMDGCN__
