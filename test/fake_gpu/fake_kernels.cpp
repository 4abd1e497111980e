// Kernel launches of the fake GPU drivers: each GPU entry point name maps to the range kernel of
// runtime/device/kiln_runtime.cpp compiled for the host into this library (hidden symbols, so
// they never clash with kiln's JIT-compiled copies). A launch of grid_x * block_x threads runs
// tasks 0 .. min(threads, num_tasks) - 1 on the ranges kiln_task_split_point() gives, exactly as
// the nvptx and amdgcn entry points do, on a few host threads.
//
// Before running, the launch checks what a GPU would fault on: the runtime and argument blocks
// and every array the kernel will touch must lie in live allocations. A host pointer or a freed
// block ends the launch with the dialect's illegal address (CUDA_ERROR_ILLEGAL_ADDRESS,
// hipErrorIllegalAddress), which is sticky, and one line on stderr saying which operand was bad.
#include <algorithm>
#include <cstdio>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "fake_gpu.h"

// The range kernels, compiled from runtime/device/kiln_runtime.cpp into this library.
#define KILN_DECLARE_RANGE_KERNEL(op, dtype)                                                  \
  extern "C" void kiln_##op##_##dtype(KilnRuntime *rt, const KilnKernelArgs *args,           \
                                      int64_t begin, int64_t end, int64_t task_index);
KILN_FOR_EACH_KERNEL(KILN_DECLARE_RANGE_KERNEL)
#undef KILN_DECLARE_RANGE_KERNEL

namespace kiln::fake_gpu {
namespace {

constexpr std::size_t kBytes_f32 = 4;
constexpr std::size_t kBytes_f64 = 8;
constexpr std::size_t kBytes_i32 = 4;
constexpr std::size_t kBytes_i64 = 8;
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

int illegal_address(const HostKernel &kernel, const char *what) {
  const Dialect &d = dialect();
  std::fprintf(stderr,
               "%s: %s would fault on the GPU: %s is not inside a live %s allocation; returning "
               "%s (sticky)\n",
               d.title, kernel.gpu_name, what, d.alloc_entry, error_name(d.illegal_address));
  return d.illegal_address;
}

}  // namespace

const HostKernel *find_host_kernel(std::string_view gpu_name) {
  for (const HostKernel &kernel : kHostKernels) {
    if (gpu_name == kernel.gpu_name) return &kernel;
  }
  return nullptr;
}

namespace {

int run_launch(State &state, const Function &function, unsigned grid_x, unsigned block_x,
               void **params) {
  const HostKernel &kernel = *function.kernel;
  // params[i] points at the value of kernel parameter i: here two device pointers.
  const uint64_t runtime_address = *static_cast<const uint64_t *>(params[0]);
  const uint64_t args_address = *static_cast<const uint64_t *>(params[1]);
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
  ++state.current().launch_count;

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
    return dialect().success;
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
  return dialect().success;
}

}  // namespace

int launch(State &state, const Function *f, unsigned grid_x, unsigned grid_y, unsigned grid_z,
           unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared_bytes,
           const void *stream, void **params, void **extra) {
  const Dialect &d = dialect();
  const Function *function = nullptr;
  for (const auto &[handle, loaded] : state.current().modules) {
    for (const auto &[name, candidate] : loaded->functions) {
      if (candidate.get() == f) function = candidate.get();
    }
  }
  if (function == nullptr) return d.invalid_handle;
  if (stream != nullptr) return d.invalid_handle;  // the fake has only the default stream
  if (grid_x == 0 || grid_y == 0 || grid_z == 0 || block_x == 0 || block_y == 0 ||
      block_z == 0 || uint64_t{block_x} * block_y * block_z > 1024 || block_z > 64 ||
      shared_bytes > 48 * 1024 || params == nullptr || params[0] == nullptr ||
      params[1] == nullptr) {
    return d.invalid_value;
  }
  // kiln's entry points index tasks by x only; the fake runs exactly what kiln launches.
  if (grid_y != 1 || grid_z != 1 || block_y != 1 || block_z != 1 || extra != nullptr) {
    return d.not_supported;
  }
  return run_launch(state, *function, grid_x, block_x, params);
}

}  // namespace kiln::fake_gpu
