// The ABI shared by the device runtime module (freestanding C++, compiled to LLVM bitcode by
// clang-14) and the host-side launchers. Plain C layout, fixed-width types only, so the same
// header is valid in the freestanding device build and in the host build.
//
// Every kernel has the signature
//   extern "C" void kiln_<op>_<dtype>(KilnRuntime *runtime, const KilnKernelArgs *args,
//                                     int64_t begin, int64_t end, int64_t task_index);
// and processes the half-open index range [begin, end) of its iteration space. A launcher splits
// the space into tasks (CPU: one task per worker chunk; GPU: one per block) and gives each task a
// distinct task_index < args->num_tasks.
//
// GPU entry points (nvptx64, amdgcn) are
//   extern "C" kernel void kiln_<op>_<dtype>_gpu(KilnRuntime *runtime, const KilnKernelArgs *args);
// one GPU thread per task: task = blockIdx.x * blockDim.x + threadIdx.x (tasks >= num_tasks
// return at once); the thread runs the range kernel on
//   [iteration_size * task / num_tasks, iteration_size * (task + 1) / num_tasks).
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
  int64_t num_tasks;       ///< number of tasks of this launch
  int64_t iteration_size;  ///< size of the iteration space the tasks split (GPU entry points)
} KilnKernelArgs;

/// One slot of the result buffer, written by task `task_index`. The host clears the buffer before
/// the launch, so a slot that a task never wrote reads as zero.
typedef struct KilnTaskResult {
  uint64_t value_bits;  ///< reduce_sum: partial sum (bit pattern of the dtype, widened to 64 bits)
  uint64_t address;     ///< compact: device address of the heap block holding the task's output
  uint64_t count;       ///< compact: number of elements in that block
  uint64_t reserved0;
} KilnTaskResult;

typedef void (*KilnKernelFn)(KilnRuntime *runtime, const KilnKernelArgs *args, int64_t begin,
                             int64_t end, int64_t task_index);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // KILN_RUNTIME_KERNEL_ABI_H_
