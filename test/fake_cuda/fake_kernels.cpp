// Kernel launches of the fake CUDA driver: each GPU entry point name maps to the range kernel of
// runtime/device/kiln_runtime.cpp compiled for the host into this library (hidden symbols, so
// they never clash with kiln's JIT-compiled copies). A launch of grid_x * block_x threads runs
// tasks 0 .. min(threads, num_tasks) - 1 on the ranges kiln_task_split_point() gives, exactly as
// the nvptx entry points do, on a few host threads.
//
// Before running, the launch checks what a GPU would fault on: the runtime and argument blocks
// and every array the kernel will touch must lie in live cuMemAlloc_v2 allocations. A host
// pointer or a freed block ends the launch with CUDA_ERROR_ILLEGAL_ADDRESS, which is sticky, and
// one line on stderr saying which operand was bad.
#include <algorithm>
#include <cstdio>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "fake_state.h"

// The range kernels, compiled from runtime/device/kiln_runtime.cpp into this library.
#define KILN_DECLARE_RANGE_KERNEL(op, dtype)                                                  \
  extern "C" void kiln_##op##_##dtype(KilnRuntime *rt, const KilnKernelArgs *args,           \
                                      int64_t begin, int64_t end, int64_t task_index);
KILN_FOR_EACH_KERNEL(KILN_DECLARE_RANGE_KERNEL)
#undef KILN_DECLARE_RANGE_KERNEL

namespace kiln::fake_cuda {
namespace {

constexpr std::size_t kBytes_f32 = 4;
constexpr std::size_t kBytes_f64 = 8;
constexpr std::size_t kBytes_i32 = 4;
constexpr std::size_t kBytes_i64 = 8;
constexpr CUresult kIllegalAddress = 700;
constexpr unsigned kMaxHostThreads = 4;

constexpr HostKernel kHostKernels[] = {
#define KILN_HOST_KERNEL(op, dtype) \
  {"kiln_" #op "_" #dtype "_gpu", &kiln_##op##_##dtype, Op::op, kBytes_##dtype},
    KILN_FOR_EACH_KERNEL(KILN_HOST_KERNEL)
#undef KILN_HOST_KERNEL
};
static_assert(std::size(kHostKernels) == KILN_NUM_KERNELS);

/// Multiplies without overflow; false if the product does not fit in 64 bits.
bool mul(uint64_t a, uint64_t b, uint64_t *product) {
  return !__builtin_mul_overflow(a, b, product);
}

/// The first operand of the launch that a GPU would fault on, or nullptr if all are fine.
const char *bad_operand(const State &state, const HostKernel &kernel, const KilnKernelArgs &args) {
  const auto n = static_cast<uint64_t>(std::max<int64_t>(args.iteration_size, 0));
  const auto check = [&](uint64_t address, uint64_t elements, std::size_t element_bytes) {
    uint64_t bytes = 0;
    return elements == 0 || (mul(elements, element_bytes, &bytes) &&
                             state.device_range_ok(address, bytes));
  };
  const std::size_t t = kernel.element_bytes;
  const auto num_tasks = static_cast<uint64_t>(args.num_tasks);
  switch (kernel.op) {
    case Op::fill:
      return check(args.ptr[0], n, t) ? nullptr : "ptr[0] (output)";
    case Op::copy:
    case Op::axpy:
      if (!check(args.ptr[0], n, t)) return "ptr[0] (output)";
      return check(args.ptr[1], n, t) ? nullptr : "ptr[1] (input)";
    case Op::reduce_sum:
    case Op::compact_positive:
      if (!check(args.ptr[0], n, t)) return "ptr[0] (input)";
      return check(args.result_buffer, num_tasks, sizeof(KilnTaskResult)) ? nullptr
                                                                          : "result_buffer";
    case Op::matmul: {
      const uint64_t m = args.dims[0], cols = args.dims[1], k = args.dims[2];
      uint64_t c_elems = 0, a_elems = 0, b_elems = 0;
      if (!mul(m, cols, &c_elems) || !check(args.ptr[0], c_elems, t)) return "ptr[0] (C)";
      if (!mul(m, k, &a_elems) || !check(args.ptr[1], a_elems, t)) return "ptr[1] (A)";
      if (!mul(k, cols, &b_elems) || !check(args.ptr[2], b_elems, t)) return "ptr[2] (B)";
      return n <= m ? nullptr : "iteration_size (more rows than dims[0])";
    }
  }
  return nullptr;
}

CUresult illegal_address(const HostKernel &kernel, const char *what) {
  std::fprintf(stderr,
               "kiln fake CUDA driver: %s would fault on the GPU: %s is not inside a live "
               "cuMemAlloc_v2 allocation; returning CUDA_ERROR_ILLEGAL_ADDRESS (sticky)\n",
               kernel.gpu_name, what);
  return kIllegalAddress;
}

}  // namespace

const HostKernel *find_host_kernel(std::string_view gpu_name) {
  for (const HostKernel &kernel : kHostKernels) {
    if (gpu_name == kernel.gpu_name) return &kernel;
  }
  return nullptr;
}

CUresult run_launch(State &state, const CUfunc_st &function, unsigned grid_x, unsigned block_x,
                    void **params) {
  const HostKernel &kernel = *function.kernel;
  // params[i] points at the value of kernel parameter i: here two device pointers.
  const CUdeviceptr runtime_address = *static_cast<const CUdeviceptr *>(params[0]);
  const CUdeviceptr args_address = *static_cast<const CUdeviceptr *>(params[1]);
  if (!state.device_range_ok(runtime_address, sizeof(KilnRuntime))) {
    return illegal_address(kernel, "the KilnRuntime pointer (parameter 0)");
  }
  if (!state.device_range_ok(args_address, sizeof(KilnKernelArgs))) {
    return illegal_address(kernel, "the KilnKernelArgs pointer (parameter 1)");
  }
  auto *runtime = reinterpret_cast<KilnRuntime *>(static_cast<uintptr_t>(runtime_address));
  const auto *args = reinterpret_cast<const KilnKernelArgs *>(static_cast<uintptr_t>(args_address));
  if (const char *what = bad_operand(state, kernel, *args)) return illegal_address(kernel, what);
  if (kernel.op == Op::compact_positive && runtime->heap_size_bytes != 0 &&
      !state.device_range_ok(runtime->heap_base, runtime->heap_size_bytes)) {
    return illegal_address(kernel, "the device heap (KilnRuntime::heap_base)");
  }
  ++state.launch_count;

  const int64_t threads = int64_t{grid_x} * int64_t{block_x};
  const int64_t tasks = std::max<int64_t>(0, std::min<int64_t>(threads, args->num_tasks));
  const auto run_tasks = [&](int64_t first, int64_t last) {
    for (int64_t task = first; task < last; ++task) {
      kernel.range_kernel(runtime, args,
                          kiln_task_split_point(args->iteration_size, task, args->num_tasks),
                          kiln_task_split_point(args->iteration_size, task + 1, args->num_tasks),
                          task);
    }
  };
  const auto workers = static_cast<int64_t>(
      std::min<unsigned>(kMaxHostThreads, std::max(1u, std::thread::hardware_concurrency())));
  if (tasks < 2 || workers < 2) {
    run_tasks(0, tasks);
    return 0;
  }
  // Task chunks on `used` threads; a chunk whose thread cannot start runs here instead.
  const int64_t used = std::min(workers, tasks);
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < used; ++w) {
    const int64_t first = tasks * w / used;
    const int64_t last = tasks * (w + 1) / used;
    try {
      pool.emplace_back(run_tasks, first, last);
    } catch (const std::system_error &) {
      run_tasks(first, last);
    }
  }
  run_tasks(0, tasks / used);
  for (std::thread &thread : pool) thread.join();
  return 0;
}

}  // namespace kiln::fake_cuda
