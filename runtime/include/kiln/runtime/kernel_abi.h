// The ABI shared by the device runtime module (freestanding C++, compiled to LLVM bitcode by
// clang-19) and the host-side launchers. Plain C layout, fixed-width types only, so the same
// header is valid in the freestanding device build and in the host build.
//
// Every kernel has the signature
//   extern "C" void kiln_<op>_<dtype>(KilnRuntime *runtime, const KilnKernelArgs *args,
//                                     int64_t begin, int64_t end, int64_t task_index);
// and processes the half-open index range [begin, end) of its iteration space. A launcher splits
// the space into tasks (CPU: one task per worker chunk) and gives each task a distinct
// task_index < args->num_tasks.
//
// GPU entry points (nvptx64, amdgcn) are
//   extern "C" kernel void kiln_<op>_<dtype>_gpu(KilnRuntime *runtime, const KilnKernelArgs *args);
// with bodies in runtime/device/gpu_kernels.h (the fake drivers run the same templates):
// - fill, copy, axpy: grid-stride loops over [0, iteration_size): thread g = blockIdx.x *
//   blockDim.x + threadIdx.x does g, g + G, ... (G = gridDim.x * blockDim.x), so any grid covers
//   all elements; num_tasks is unused;
// - reduce_sum: the same grid-stride loop, a tree reduction in shared memory, and ONE partial per
//   BLOCK, in result slot blockIdx.x: num_tasks (the result slots) must be >= gridDim.x;
// - matmul: blocks of 256 threads grid-stride over the 16x16 tiles of C (dims), one C element
//   per thread; iteration_size and num_tasks are unused;
// - compact_positive: one GPU thread per task, task = blockIdx.x * blockDim.x + threadIdx.x
//   (tasks >= num_tasks return at once); the thread runs the range kernel on
//   [iteration_size * task / num_tasks, iteration_size * (task + 1) / num_tasks).
// Splits are computed exactly, without overflow, by kiln_task_split_point() below. Every
// launcher (CPU, GPU entry points, the fake CUDA driver) splits with that one function, so all
// agree.
#ifndef KILN_RUNTIME_KERNEL_ABI_H_
#define KILN_RUNTIME_KERNEL_ABI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Error codes the device runtime records; the host reads them after every launch.
enum KilnDeviceError {
  KILN_DEVICE_OK = 0,
  /// runtime_memory_allocate_aligned could not fit a request in the device heap.
  /// arg0 = requested bytes, arg1 = heap bytes already used, arg2 = heap size in bytes.
  KILN_DEVICE_HEAP_EXHAUSTED = 1,
  /// runtime_memory_allocate_aligned got an alignment that is not a power of two. arg0 = alignment.
  KILN_DEVICE_BAD_ALIGNMENT = 2,
  /// A kernel found its arguments inconsistent (a device-side assertion). arg0 = kernel-specific.
  KILN_DEVICE_ASSERTION = 3,
};

/// Device-resident runtime state: the device heap and the error area. Lives in device memory,
/// one per executor; the host clears the error area and resets the heap before each launch.
typedef struct KilnRuntime {
  uint64_t heap_base;        ///< device address of the heap chunk
  uint64_t heap_size_bytes;  ///< size of the heap chunk in bytes
  uint64_t heap_used_bytes;  ///< bump offset, updated atomically by kernels
  int32_t error_code;        ///< a KilnDeviceError; the first error recorded wins
  int32_t reserved0;
  uint64_t error_arg0;
  uint64_t error_arg1;
  uint64_t error_arg2;
  char error_message[96];  ///< NUL-terminated, written by the task that recorded the error
} KilnRuntime;

/// Arguments of one launch; written by the host into an argument buffer in device memory.
typedef struct KilnKernelArgs {
  uint64_t ptr[4];         ///< device addresses of the array operands (meaning per kernel)
  uint64_t num_elements;   ///< size of the 1-D iteration space (elementwise kernels)
  uint64_t dims[3];        ///< matmul: m, n, k (row-major: A is m x k, B is k x n, C is m x n)
  double scalar_f64;       ///< floating scalar operand (fill value, axpy alpha) for f32/f64
  int64_t scalar_i64;      ///< integer scalar operand for i32/i64
  uint64_t result_buffer;  ///< device address of the result buffer (num_tasks KilnTaskResult)
  int64_t num_tasks;       ///< tasks of this launch = result slots (GPU reduce_sum: >= blocks)
  int64_t iteration_size;  ///< size of the iteration space the tasks split (GPU entry points)
  /// A user kernel's arguments, in the order of its parameters (user_module.h): an array's
  /// device address, or a scalar's bits (f32 and i32 in the low 32 bits).
  uint64_t user_args[16];
} KilnKernelArgs;

/// The most parameters a user kernel has (the slots of KilnKernelArgs::user_args).
#define KILN_MAX_USER_PARAMS 16

/// What a user kernel's element function is run with (see the user-kernel ABI below): the
/// runtime state, the element it runs for and how many there are.
typedef struct KilnUserContext {
  KilnRuntime *runtime;
  int64_t index;  ///< the element: 0 <= index < count
  int64_t count;  ///< the elements of the launch
} KilnUserContext;

/// One slot of the result buffer, written by task `task_index` (GPU reduce_sum: by block
/// blockIdx.x). The host clears the buffer before
/// the launch, so a slot that a task never wrote reads as zero.
typedef struct KilnTaskResult {
  uint64_t value_bits;  ///< reduce_sum: partial sum (bit pattern of the dtype, widened to 64 bits)
  uint64_t address;     ///< compact: device address of the heap block holding the task's output
  uint64_t count;       ///< compact: number of elements in that block
  uint64_t reserved0;
} KilnTaskResult;

typedef void (*KilnKernelFn)(KilnRuntime *runtime, const KilnKernelArgs *args, int64_t begin,
                             int64_t end, int64_t task_index);

/// floor(iteration_size * task / num_tasks), exactly, for 0 <= task <= num_tasks,
/// num_tasks > 0 and iteration_size >= 0: the first index of task `task` (and the end of task
/// `task - 1`). The product may exceed 64 bits, so it is split as n = q * T + r:
/// n * t / T = q * t + r * t / T, where r * t < T * T; the rare r * t that does not fit in 64 bits
/// (num_tasks > 2^32) is divided as a 128-bit value, bit by bit, so no 128-bit division routine
/// (a libcall that nvptx64 and amdgcn cannot resolve) is ever needed. Freestanding C: the device
/// runtime, the host launchers and the fake CUDA driver all split with it.
static inline int64_t kiln_task_split_point(int64_t iteration_size, int64_t task,
                                            int64_t num_tasks) {
  const uint64_t n = (uint64_t)iteration_size;
  const uint64_t t = (uint64_t)task;
  const uint64_t d = (uint64_t)num_tasks;
  const uint64_t q = n / d;
  const uint64_t r = n % d;
  /* r * t as a 128-bit value hi:lo, from 32-bit halves. */
  const uint64_t r_lo = r & 0xffffffffu, r_hi = r >> 32;
  const uint64_t t_lo = t & 0xffffffffu, t_hi = t >> 32;
  const uint64_t ll = r_lo * t_lo, lh = r_lo * t_hi, hl = r_hi * t_lo, hh = r_hi * t_hi;
  const uint64_t mid = (ll >> 32) + (lh & 0xffffffffu) + (hl & 0xffffffffu);
  const uint64_t lo = (mid << 32) | (ll & 0xffffffffu);
  const uint64_t hi = hh + (lh >> 32) + (hl >> 32) + (mid >> 32);
  uint64_t frac;
  if (hi == 0) {
    frac = lo / d;
  } else {
    /* Restoring division of hi:lo by d; hi < d because r * t < d * d, so the quotient fits. */
    uint64_t rem = hi;
    frac = 0;
    for (int bit = 63; bit >= 0; --bit) {
      const uint64_t carry = rem >> 63;
      rem = (rem << 1) | ((lo >> bit) & 1u);
      frac <<= 1;
      if (carry != 0 || rem >= d) {
        rem -= d;
        frac |= 1u;
      }
    }
  }
  return (int64_t)(q * t + frac);
}

// --- the user-kernel ABI ----------------------------------------------------------------------
//
// A user module is LLVM IR (text or bitcode) defining element functions
//   define void @name(ptr %context, <one LLVM parameter per declared parameter>)
// an array parameter is a `ptr` to its first element, a scalar one `float`, `double`, `i32` or
// `i64` (f32, f64, i32, i64). kiln runs the function once per element index of the launch (a CPU
// range split, a GPU grid: the same IR), through a range kernel it generates around it
// (kiln_user_entry), and the function may call these device-runtime functions, all with the
// context it was given:

/// The element this call runs for, in [0, kiln_count(context)).
int64_t kiln_index(const KilnUserContext *context);
/// The number of elements of the launch.
int64_t kiln_count(const KilnUserContext *context);
/// `size_bytes` from the device heap, aligned to `alignment_bytes` (a power of two), or null
/// when the heap is exhausted (the launch then fails with the heap-exhausted error and its
/// figures: requested, used, heap size) or the alignment is bad. Valid until the launch ends.
void *kiln_heap_allocate(const KilnUserContext *context, uint64_t size_bytes,
                         uint64_t alignment_bytes);
/// A device-side assertion: when `condition` is 0, the launch fails with KILN_DEVICE_ASSERTION,
/// `message` (at most 95 bytes are kept) and the element's index as arg0. The first failure of
/// a launch wins; the call returns, so the function should return too.
void kiln_assert(const KilnUserContext *context, int32_t condition, const char *message);

/// The kernels of the device runtime module, as X(op, dtype) for every op and dtype. The range
/// kernel is kiln_<op>_<dtype> (a KilnKernelFn); the GPU entry point is kiln_<op>_<dtype>_gpu.
/// dtypes: f32 (float), f64 (double), i32 (int32_t), i64 (int64_t).
#define KILN_FOR_EACH_KERNEL_OF_DTYPE(X, dtype) \
  X(fill, dtype)                                \
  X(copy, dtype)                                \
  X(axpy, dtype)                                \
  X(reduce_sum, dtype)                          \
  X(matmul, dtype)                              \
  X(compact_positive, dtype)
#define KILN_FOR_EACH_KERNEL(X)            \
  KILN_FOR_EACH_KERNEL_OF_DTYPE(X, f32)    \
  KILN_FOR_EACH_KERNEL_OF_DTYPE(X, f64)    \
  KILN_FOR_EACH_KERNEL_OF_DTYPE(X, i32)    \
  KILN_FOR_EACH_KERNEL_OF_DTYPE(X, i64)
/// The number of entries KILN_FOR_EACH_KERNEL expands to.
#define KILN_NUM_KERNELS 24

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // KILN_RUNTIME_KERNEL_ABI_H_
