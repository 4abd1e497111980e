// Kernel launchers: compute and reserve everything a launch needs in one step, then either launch
// or return the error with nothing launched and nothing held. A launcher owns no memory of its
// own: its argument buffer, result buffer and runtime state are allocated once by the executor
// (LauncherBuffers), so a launch allocates only staging for host operands, and a launch without
// host operands allocates nothing. KernelLauncher holds the shared logic; CpuKernelLauncher runs host code on a worker pool, GpuKernelLauncher launches a loaded
// module on a GpuDevice (CUDA and HIP alike).
#ifndef KILN_EXECUTOR_LAUNCHER_H_
#define KILN_EXECUTOR_LAUNCHER_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/executor/program.h"
#include "kiln/rhi/device.h"
#include "kiln/rhi/fork_hooks.h"
#include "kiln/rhi/gpu_device.h"
#include "kiln/runtime/kernel_abi.h"
#include "kiln/runtime/memory/device_memory.h"

namespace kiln {

namespace runtime {
class ThreadPool;
}

/// A host array handed to a launch: staged into device memory for the launch's duration and
/// its address put in args.ptr[slot].
struct HostOperand {
  int slot = 0;
  std::span<const std::byte> bytes;
};

/// LaunchSpec::min_elements_per_task's default: a CPU launch of at most this many elements runs
/// as one task, on the calling thread.
inline constexpr int64_t kDefaultMinElementsPerTask = int64_t{1} << 16;

/// What to launch. `args.ptr` slots for device arrays are filled by the caller; host operands,
/// the result buffer's address, num_tasks and iteration_size are filled by the launcher.
struct LaunchSpec {
  std::string kernel;                ///< "kiln_axpy_f32"; a user kernel's entry
  /// A user kernel's range kernel (host devices): run instead of looking `kernel` up.
  KilnKernelFn host_fn = nullptr;
  /// A user kernel's module (GPU devices): its runtime::kUserGpuEntryName runs, grid-stride, instead
  /// of `kernel` + "_gpu" of the executor's module.
  std::optional<uint64_t> gpu_module;
  KilnKernelArgs args{};
  int64_t iteration_size = 0;        ///< elements (or rows, for matmul) of the iteration space
  int64_t min_elements_per_task = kDefaultMinElementsPerTask;  ///< CPU: up to this, one task
  std::vector<HostOperand> host_operands;
  /// Clear the first num_tasks result slots before the kernel runs and read them back after.
  /// Every kernel that writes result slots (reduce_sum, compact_positive) must set it.
  bool wants_task_results = false;
};

/// The device's answers for one launch.
struct LaunchResult {
  std::vector<KilnTaskResult> task_results;  ///< one per task when wants_task_results
};

/// The device memory a launcher uses for its whole life, allocated once by its owner (the
/// executor, in one allocate_group) and freed by the owner after the launcher is gone.
struct LauncherBuffers {
  DeviceAllocation runtime_state;    ///< one KilnRuntime
  DeviceAllocation argument_buffer;  ///< one KilnKernelArgs
  DeviceAllocation result_buffer;    ///< max_tasks() KilnTaskResult slots
  std::optional<DeviceAllocation> heap;  ///< the device heap chunk kernels allocate from, if any
  uint64_t heap_bytes = 0;               ///< its size in bytes (0 when absent)
};

/// The launch contract, shared by every backend. One launch at a time per launcher.
class KernelLauncher {
 public:
  /// `buffers` stay owned by the caller and must outlive the launcher; call bind() once before
  /// the first launch.
  KernelLauncher(runtime::DeviceMemory &memory, const LauncherBuffers &buffers);
  virtual ~KernelLauncher();

  /// Looks up the device addresses of the buffers once (and, on a host-addressable device, keeps
  /// them as host pointers, so a launch reaches them without a copy or a table lookup).
  /// Errors: those of LlvmDevice::device_address (invalid_usage when a buffer is not live,
  /// device_lost). Not thread-safe: call it before the launcher is shared.
  [[nodiscard]] RhiStatus bind();

  /// Runs `spec`. Before anything is allocated: the kernel must exist (invalid_usage), the device
  /// must not be lost (device_lost). Then the staging for host operands, if any, is reserved in
  /// one step (out_of_memory, nothing held, nothing launched): a launch without host operands
  /// allocates nothing (its argument and result buffers are the launcher's). The arguments are
  /// written, the runtime state reset and, with spec.wants_task_results, the first num_tasks
  /// result slots cleared. After the launch the device error area is checked: heap exhaustion ->
  /// out_of_memory (oom_source device_heap); other device errors -> error; a sticky device fault
  /// -> device_lost. A fault spec of kind launch or heap armed on the memory's fault plan that
  /// selects this launch fails it after its staging was allocated and before the kernel runs:
  /// error (injected launch fault) or out_of_memory (oom_source device_heap, injected). The
  /// launch's staging requests name spec.kernel (for kernel=). Staging is freed on every path.
  /// Thread-safe: launches are serialized, the shared buffers used under one lock.
  [[nodiscard]] RhiExpected<LaunchResult> launch(const LaunchSpec &spec);
  /// Host worker threads a launch uses (0 for GPU launchers).
  [[nodiscard]] virtual unsigned num_threads() const = 0;
  /// The most tasks (result slots) one launch of this launcher uses: the result buffer holds
  /// this many KilnTaskResult. task_count never exceeds it.
  [[nodiscard]] virtual int64_t max_tasks() const = 0;

 protected:
  /// The kernel's host entry point (CPU launchers), or null where the device runs it by name
  /// (GPU launchers). Errors: invalid_usage (no such kernel).
  [[nodiscard]] virtual RhiExpected<KilnKernelFn> check_kernel(const std::string &kernel) = 0;
  [[nodiscard]] virtual int64_t task_count(const LaunchSpec &spec) const = 0;
  /// Runs spec's kernel over num_tasks tasks; the argument block is already in the argument
  /// buffer, whose device address (and the runtime state's) bind() looked up.
  [[nodiscard]] virtual RhiStatus execute(const LaunchSpec &spec, KilnKernelFn fn,
                                          uint64_t runtime_address, uint64_t args_address,
                                          int64_t num_tasks, int64_t iteration_size) = 0;
  runtime::DeviceMemory &memory_;

 private:
  [[nodiscard]] RhiExpected<LaunchResult> launch_unguarded(const LaunchSpec &spec);
  /// Writes `args` into the argument buffer and resets the runtime state (heap and error area).
  [[nodiscard]] RhiStatus write_launch_state(const KilnKernelArgs &args);
  /// Zeroes the first `num_tasks` result slots.
  [[nodiscard]] RhiStatus clear_results(int64_t num_tasks);
  /// Copies the first `num_tasks` result slots into `out`.
  [[nodiscard]] RhiStatus read_results(int64_t num_tasks, std::vector<KilnTaskResult> &out);
  [[nodiscard]] RhiStatus check_device_error(const std::string &kernel);
  /// The failure an armed fault spec of kind launch or heap gives this launch of `kernel`, if any.
  [[nodiscard]] RhiStatus check_injected_launch_fault(const std::string &kernel);

  LauncherBuffers buffers_;
  // Set by bind(): the buffers' device addresses, and on host-addressable devices the same
  // addresses as host pointers (null on GPUs, which go through the driver's copies).
  bool bound_ = false;
  uint64_t runtime_address_ = 0;
  uint64_t args_address_ = 0;
  uint64_t result_address_ = 0;
  uint64_t heap_base_address_ = 0;
  KilnRuntime *runtime_host_ = nullptr;
  KilnKernelArgs *args_host_ = nullptr;
  KilnTaskResult *result_host_ = nullptr;
  // One launch at a time; held over the whole use of the shared buffers (arguments written to
  // results read back). Made anew in a forked child: a launch may hold it while an OOM observer
  // waits for the GIL, which the forking thread holds.
  ForkSafeMutex mutex_{ForkSafeMutex::Policy::reset_in_child};
};

/// Runs JIT-compiled host kernels of a Program on a host-addressable device (cpu, mock).
class CpuKernelLauncher final : public KernelLauncher {
 public:
  /// `num_threads` 0: one per hardware thread.
  CpuKernelLauncher(runtime::DeviceMemory &memory, Program &program, const LauncherBuffers &buffers,
                    unsigned num_threads);
  ~CpuKernelLauncher() override;
  [[nodiscard]] unsigned num_threads() const override;
  [[nodiscard]] int64_t max_tasks() const override;
  /// The result slots a launcher made with `num_threads` needs (kTasksPerThread per pool
  /// thread): what the executor sizes the result buffer by, before the launcher exists.
  [[nodiscard]] static int64_t max_tasks_for(unsigned num_threads);
  static constexpr int64_t kTasksPerThread = 4;
  /// The pool threads `num_threads` asks for (0: one per hardware thread, at least 1).
  [[nodiscard]] static unsigned pool_threads(unsigned num_threads);

 private:
  RhiExpected<KilnKernelFn> check_kernel(const std::string &kernel) override;
  int64_t task_count(const LaunchSpec &spec) const override;
  RhiStatus execute(const LaunchSpec &spec, KilnKernelFn fn, uint64_t runtime_address,
                    uint64_t args_address, int64_t num_tasks, int64_t iteration_size) override;

  Program &program_;
  const unsigned pool_threads_;
  std::unique_ptr<runtime::ThreadPool> pool_;
  // The last kernel check_kernel resolved (launches are serialized by the base's mutex).
  std::string last_kernel_;
  KilnKernelFn last_fn_ = nullptr;
};

/// Launches the `<kernel>_gpu` entry points of a module loaded on a GpuDevice (bodies in
/// runtime/device/gpu_kernels.h), blocks of kBlockThreads:
/// - fill, copy, axpy, reduce_sum: min(ceil(n / kBlockThreads), kMaxGridBlocks) blocks that
///   grid-stride over the n elements; num_tasks (result slots) = blocks, reduce_sum writes one
///   partial per block;
/// - matmul: min(16x16 tiles of C, kMaxGridBlocks) blocks that grid-stride over the tiles;
///   num_tasks = blocks;
/// - compact_positive: one GPU thread per task, num_tasks = clamp(n, 1, kMaxTasks).
class GpuKernelLauncher final : public KernelLauncher {
 public:
  static constexpr unsigned kBlockThreads = 256;
  static constexpr int64_t kMaxTasks = 16384;  ///< compact_positive: at most 512 KiB of result slots
  /// The most blocks of a grid-stride launch: 4 * 132 * 8 = 4,224, four times what an H100/H200
  /// (132 SMs, 8 resident blocks of 256 threads each) holds at once (an MI300X, 304 CUs, holds
  /// 2,432), so every SM stays busy on the largest current GPUs, while the per-thread loop does
  /// several elements on big arrays and reduce_sum reads back <= 132 KiB of result slots.
  static constexpr int64_t kMaxGridBlocks = 4 * 132 * 8;
  /// The result slots any launch uses: 16,384, a 512 KiB result buffer.
  static constexpr int64_t kMaxLaunchTasks = std::max(kMaxTasks, kMaxGridBlocks);
  GpuKernelLauncher(runtime::DeviceMemory &memory, GpuDevice &device, Program &program,
                    uint64_t module, const LauncherBuffers &buffers);
  [[nodiscard]] unsigned num_threads() const override { return 0; }
  [[nodiscard]] int64_t max_tasks() const override { return kMaxLaunchTasks; }

 private:
  RhiExpected<KilnKernelFn> check_kernel(const std::string &kernel) override;
  int64_t task_count(const LaunchSpec &spec) const override;
  RhiStatus execute(const LaunchSpec &spec, KilnKernelFn fn, uint64_t runtime_address,
                    uint64_t args_address, int64_t num_tasks, int64_t iteration_size) override;

  GpuDevice &device_;
  Program &program_;
  uint64_t module_;
};

}  // namespace kiln

#endif  // KILN_EXECUTOR_LAUNCHER_H_
