// Kernel launches of the fake GPU drivers: each GPU entry point name maps to the same body the
// GPU runs, kiln_gpu::<op>_gpu<dtype> of runtime/device/gpu_kernels.h, compiled for the host into
// this library (hidden symbols, so they never clash with kiln's JIT-compiled copies) with an
// emulating execution context: a launch of grid_x blocks of block_x threads runs every block
// (several blocks at once on a few host threads); inside a block each phase between two
// barriers runs for thread 0, 1, ..., block_x - 1 in turn, with a block-local shared array. So
// the fake honours gridDim and blockDim exactly as a GPU does (a grid-stride kernel launched with
// a small grid still covers every element) and checks the results of exactly the GPU's code.
//
// Before running, the launch checks what a GPU would fault on: the runtime and argument blocks
// and every array the kernel will touch must lie in live allocations. A host pointer or a freed
// block ends the launch with the dialect's illegal address (CUDA_ERROR_ILLEGAL_ADDRESS,
// hipErrorIllegalAddress), which is sticky, and one line on stderr saying which operand was bad.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <system_error>
#include <thread>
#include <vector>

#include "fake_gpu.h"
#include "gpu_kernels.h"
#include "kiln/runtime/cpu_jit.h"

// The range kernels, compiled from runtime/device/kiln_runtime.cpp into this library
// (compact_positive's GPU body calls its range kernel per thread).
#define KILN_DECLARE_RANGE_KERNEL(op, dtype)                                                  \
  extern "C" void kiln_##op##_##dtype(KilnRuntime *rt, const KilnKernelArgs *args,           \
                                      int64_t begin, int64_t end, int64_t task_index);
KILN_FOR_EACH_KERNEL(KILN_DECLARE_RANGE_KERNEL)
#undef KILN_DECLARE_RANGE_KERNEL

namespace kiln::fake_gpu {

/// The execution context of gpu_kernels.h on the host, for one block: each_thread runs a phase
/// for every thread of the block in turn, so barrier() has nothing left to wait for; per-thread
/// state and the shared memory are arrays of this block. Not thread-safe: one host thread runs
/// one block.
struct EmulatedBlock {
  int64_t block_index = 0;
  int64_t grid_blocks = 1;
  int32_t threads = 1;
  alignas(16) unsigned char shared_storage[kiln_gpu::kGpuSharedBytes];

  template <class T>
  struct Private {
    T values[kiln_gpu::kMaxBlockThreads];
    T &operator()(int32_t tid) { return values[tid]; }
  };

  [[nodiscard]] int64_t block() const { return block_index; }
  [[nodiscard]] int64_t blocks() const { return grid_blocks; }
  [[nodiscard]] int32_t block_threads() const { return threads; }
  [[nodiscard]] int64_t global_index(int32_t tid) const { return block_index * threads + tid; }
  [[nodiscard]] int64_t grid_threads() const { return grid_blocks * threads; }
  // The phases since the last barrier() or end(), run there thread by thread (thread 0 all of
  // them in order, then thread 1, ...): a valid order of a GPU's threads between two barriers,
  // and one in which a thread reading another's shared write without a barrier between them
  // sees the old value, so a missing barrier gives wrong results here as on a GPU.
  std::vector<std::function<void(int32_t)>> pending;

  template <class F>
  void each_thread(F &&phase) {
    pending.emplace_back(std::forward<F>(phase));  // a copy: its [&] captures stay in the kernel
  }
  void barrier() { run_pending(); }
  void end() { run_pending(); }
  void run_pending() {
    for (int32_t tid = 0; tid < threads; ++tid)
      for (const auto &phase : pending) phase(tid);
    pending.clear();
  }
  /// Before each block: shared memory holds 0xff bytes (NaN, -1), as stale as a GPU's, so a
  /// read of a slot no thread of this block wrote shows; no phase is pending.
  void start(int64_t index) {
    block_index = index;
    pending.clear();
    std::memset(shared_storage, 0xff, sizeof shared_storage);
  }
  template <class T>
  T *shared() {
    return reinterpret_cast<T *>(shared_storage);
  }
};

namespace {

// The C++ type of each dtype name used by KILN_FOR_EACH_KERNEL.
using dtype_f32 = float;
using dtype_f64 = double;
using dtype_i32 = int32_t;
using dtype_i64 = int64_t;

#define KILN_BLOCK_KERNEL(op, dtype)                                                         \
  void block_##op##_##dtype(EmulatedBlock &block, KilnRuntime *rt, const KilnKernelArgs *args) { \
    kiln_gpu::op##_gpu<dtype_##dtype>(block, rt, args, &kiln_##op##_##dtype);               \
  }
KILN_FOR_EACH_KERNEL(KILN_BLOCK_KERNEL)
#undef KILN_BLOCK_KERNEL

constexpr std::size_t kBytes_f32 = 4;
constexpr std::size_t kBytes_f64 = 8;
constexpr std::size_t kBytes_i32 = 4;
constexpr std::size_t kBytes_i64 = 8;
constexpr unsigned kMaxHostThreads = 4;

constexpr HostKernel kHostKernels[] = {
#define KILN_HOST_KERNEL(op, dtype) \
  {"kiln_" #op "_" #dtype "_gpu", &block_##op##_##dtype, Op::op, kBytes_##dtype},
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

/// Runs `blocks` blocks as chunks on a few host threads (run_blocks(first, last) runs one chunk);
/// a chunk whose thread cannot start runs on this one instead.
template <class RunBlocks>
void run_block_chunks(int64_t blocks, RunBlocks &&run_blocks) {
  const auto workers = static_cast<int64_t>(
      std::min<unsigned>(kMaxHostThreads, std::max(1u, std::thread::hardware_concurrency())));
  if (blocks < 2 || workers < 2) {
    run_blocks(0, blocks);
    return;
  }
  const int64_t used = std::min(workers, blocks);
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < used; ++w) {
    const int64_t first = blocks * w / used;
    const int64_t last = blocks * (w + 1) / used;
    try {
      pool.emplace_back(run_blocks, first, last);
    } catch (const std::system_error &) {
      run_blocks(first, last);
    }
  }
  run_blocks(0, blocks / used);
  for (std::thread &thread : pool) thread.join();
}

int illegal_address(const HostKernel &kernel, const char *what) {
  const Dialect &d = dialect();
  std::fprintf(stderr,
               "%s: %s would fault on the GPU: %s is not inside a live %s allocation; returning "
               "%s (sticky)\n",
               d.title, kernel.gpu_name, what, d.alloc_entry, error_name(d.illegal_address));
  return d.illegal_address;
}

/// A kernel body that returned with phases pending (it lacks ctx.end()): a bug in
/// gpu_kernels.h, reported as a GPU reports a kernel that cannot run.
int unended_kernel(const HostKernel &kernel) {
  const Dialect &d = dialect();
  std::fprintf(stderr,
               "%s: %s returned with phases not run (its body lacks ctx.end(), gpu_kernels.h); "
               "returning %s\n",
               d.title, kernel.gpu_name, error_name(d.not_supported));
  return d.not_supported;
}

/// The host range kernel of a user kernel's IR, compiled at the first launch as kiln compiles it
/// for the CPU; null (and a line on stderr) when it does not compile, which kiln's own checks of
/// the same IR rule out.
KilnKernelFn user_range_kernel(UserCode &code) {
  std::lock_guard lock(code.mutex);
  if (code.range_kernel != nullptr) return code.range_kernel;
  auto jit = kiln::runtime::CpuJit::create_user(std::as_bytes(std::span(code.ir.data(), code.ir.size())), code.entry,
                                                code.params, "fake");
  if (!jit) {
    std::fprintf(stderr, "%s: the user kernel %s does not compile for the host: %s\n", dialect().title,
                 code.entry.c_str(), jit.error().message().c_str());
    return nullptr;
  }
  auto fn = (*jit)->lookup_kernel(kiln::runtime::kUserEntryName);
  if (!fn) return nullptr;
  code.jit = std::shared_ptr<void>((*jit).release(), [](void *p) { delete static_cast<kiln::runtime::CpuJit *>(p); });
  code.range_kernel = *fn;
  return code.range_kernel;
}

/// A user kernel's launch: the grid-stride loop of kUserGpuEntryName, thread g of the grid
/// calling the range kernel for indices g, g + G, ... of [0, args->num_elements). Before it
/// runs, the runtime and argument blocks and every non-null pointer argument must lie in live
/// allocations (a GPU would fault otherwise).
int run_user_launch(State &state, const Function &function, unsigned grid_x, unsigned block_x, void **params) {
  const Dialect &d = dialect();
  UserCode &code = *function.user;
  const uint64_t runtime_address = *static_cast<const uint64_t *>(params[0]);
  const uint64_t args_address = *static_cast<const uint64_t *>(params[1]);
  const auto fault = [&](const char *what) {
    std::fprintf(stderr, "%s: user kernel %s would fault on the GPU: %s is not inside a live %s allocation; "
                         "returning %s (sticky)\n",
                 d.title, code.entry.c_str(), what, d.alloc_entry, error_name(d.illegal_address));
    return d.illegal_address;
  };
  if (!state.device_range_ok(runtime_address, sizeof(KilnRuntime))) return fault("the KilnRuntime pointer");
  if (!state.device_range_ok(args_address, sizeof(KilnKernelArgs))) return fault("the KilnKernelArgs pointer");
  auto *runtime = reinterpret_cast<KilnRuntime *>(static_cast<uintptr_t>(runtime_address));
  const auto *args = reinterpret_cast<const KilnKernelArgs *>(static_cast<uintptr_t>(args_address));
  for (std::size_t k = 0; k < code.params.size() && k < KILN_MAX_USER_PARAMS; ++k)
    if (code.params[k] == kiln::runtime::UserValueType::ptr && args->user_args[k] != 0 &&
        !state.device_range_ok(args->user_args[k], 1))
      return fault("an array argument");
  const KilnKernelFn fn = user_range_kernel(code);
  if (fn == nullptr) return d.not_supported;
  ++state.current().launch_count;
  const auto n = static_cast<int64_t>(args->num_elements);
  const auto grid_threads = static_cast<int64_t>(grid_x) * block_x;
  run_block_chunks(grid_x, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b)
      for (int64_t t = 0; t < block_x; ++t)
        for (int64_t i = b * block_x + t; i < n; i += grid_threads) fn(runtime, args, i, i + 1, 0);
  });
  return d.success;
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

  // Blocks are independent (they meet only through atomics and distinct outputs), so chunks of
  // blocks run on a few host threads; each block runs on one.
  const int64_t blocks = grid_x;
  std::atomic<bool> unended{false};  // a body that left phases pending (no ctx.end()): a bug
  const auto run_blocks = [&](int64_t first, int64_t last) {
    auto block = std::make_unique<EmulatedBlock>();
    block->grid_blocks = blocks;
    block->threads = static_cast<int32_t>(block_x);
    for (int64_t b = first; b < last; ++b) {
      block->start(b);
      kernel.block_kernel(*block, runtime, args);
      if (!block->pending.empty()) {  // their captures died with the body: never run them
        block->pending.clear();
        unended = true;
      }
    }
  };
  run_block_chunks(blocks, run_blocks);
  return unended ? unended_kernel(kernel) : dialect().success;
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
  // The kernels are built for at most 256 threads a block (.maxntid 256 in the PTX,
  // amdgpu-flat-work-group-size 1,256), so a GPU refuses a bigger block.
  if (block_x > static_cast<unsigned>(kiln_gpu::kMaxBlockThreads)) return d.invalid_value;
  // kiln's entry points index by x only; the fake runs exactly what kiln launches.
  if (grid_y != 1 || grid_z != 1 || block_y != 1 || block_z != 1 || extra != nullptr) {
    return d.not_supported;
  }
  if (function->user != nullptr) return run_user_launch(state, *function, grid_x, block_x, params);
  return run_launch(state, *function, grid_x, block_x, params);
}

}  // namespace kiln::fake_gpu
