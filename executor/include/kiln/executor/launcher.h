// Kernel launchers: compute and reserve everything a launch needs in one step, then either launch
// or return the error with nothing launched and nothing held. KernelLauncher holds the shared
// logic; CpuKernelLauncher runs host code on a worker pool, GpuKernelLauncher launches a loaded
// module on a GpuDevice (CUDA and HIP alike).
#ifndef KILN_EXECUTOR_LAUNCHER_H_
#define KILN_EXECUTOR_LAUNCHER_H_

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

/// What to launch. `args.ptr` slots for device arrays are filled by the caller; host operands,
/// the result buffer, num_tasks and iteration_size are filled by the launcher.
struct LaunchSpec {
  std::string kernel;                ///< "kiln_axpy_f32"
  KilnKernelArgs args{};
  int64_t iteration_size = 0;        ///< elements (or rows, for matmul) of the iteration space
  int64_t min_elements_per_task = 1 << 16;  ///< CPU: below this a launch runs as one task
  std::vector<HostOperand> host_operands;
  bool wants_task_results = false;   ///< allocate, clear and read back the result buffer
};

/// The device's answers for one launch.
struct LaunchResult {
  std::vector<KilnTaskResult> task_results;  ///< one per task when wants_task_results
};

/// The launch contract, shared by every backend. One launch at a time per launcher.
class KernelLauncher {
 public:
  /// `runtime_state` holds the KilnRuntime; `heap` (absent when heap_bytes is 0) is the device
  /// heap chunk of `heap_bytes` kernels allocate from. Both stay owned by the caller.
  KernelLauncher(runtime::DeviceMemory &memory, DeviceAllocation runtime_state,
                 std::optional<DeviceAllocation> heap, uint64_t heap_bytes);
  virtual ~KernelLauncher();

  /// Runs `spec`. Before anything is allocated: the kernel must exist (invalid_usage). Then the
  /// argument buffer, result buffer and staging are reserved together (out_of_memory, nothing
  /// held, nothing launched). After the launch the device error area is checked: heap
  /// exhaustion -> out_of_memory (oom_source device_heap); other device errors -> error; a
  /// sticky device fault -> device_lost. A fault spec of kind launch or heap armed on the
  /// memory's fault plan that selects this launch fails it after its buffers were allocated and
  /// before the kernel runs: error (injected launch fault) or out_of_memory (oom_source
  /// device_heap, injected). The launch's allocation requests name spec.kernel (for kernel=).
  /// Every launch-scoped allocation is freed on every path.
  [[nodiscard]] RhiExpected<LaunchResult> launch(const LaunchSpec &spec);
  /// Host worker threads a launch uses (0 for GPU launchers).
  [[nodiscard]] virtual unsigned num_threads() const = 0;

 protected:
  [[nodiscard]] virtual RhiStatus check_kernel(const std::string &kernel) = 0;
  [[nodiscard]] virtual int64_t task_count(const LaunchSpec &spec) const = 0;
  /// Runs the kernel over num_tasks tasks; the argument block is already on the device.
  [[nodiscard]] virtual RhiStatus execute(const std::string &kernel, uint64_t runtime_address,
                                          uint64_t args_address, int64_t num_tasks,
                                          int64_t iteration_size) = 0;
  runtime::DeviceMemory &memory_;

 private:
  [[nodiscard]] RhiExpected<LaunchResult> launch_unguarded(const LaunchSpec &spec);
  [[nodiscard]] RhiStatus reset_runtime();
  [[nodiscard]] RhiStatus check_device_error(const std::string &kernel);
  /// The failure an armed fault spec of kind launch or heap gives this launch of `kernel`, if any.
  [[nodiscard]] RhiStatus check_injected_launch_fault(const std::string &kernel);

  DeviceAllocation runtime_state_;
  std::optional<DeviceAllocation> heap_;
  uint64_t heap_bytes_;
  uint64_t heap_base_address_ = 0;  ///< device address of *heap_, once asked (0: not yet)
  // One launch at a time. Made anew in a forked child: a launch may hold it while an OOM
  // observer waits for the GIL, which the forking thread holds.
  ForkSafeMutex mutex_{ForkSafeMutex::Policy::reset_in_child};
};

/// Runs JIT-compiled host kernels of a Program on a host-addressable device (cpu, mock).
class CpuKernelLauncher final : public KernelLauncher {
 public:
  CpuKernelLauncher(runtime::DeviceMemory &memory, Program &program, DeviceAllocation runtime_state,
                    std::optional<DeviceAllocation> heap, uint64_t heap_bytes, unsigned num_threads);
  ~CpuKernelLauncher() override;
  [[nodiscard]] unsigned num_threads() const override;

 private:
  RhiStatus check_kernel(const std::string &kernel) override;
  int64_t task_count(const LaunchSpec &spec) const override;
  RhiStatus execute(const std::string &kernel, uint64_t runtime_address, uint64_t args_address,
                    int64_t num_tasks, int64_t iteration_size) override;

  Program &program_;
  std::unique_ptr<runtime::ThreadPool> pool_;
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
  static constexpr int64_t kMaxTasks = 16384;  ///< compact_positive: caps its result buffer at 512 KiB
  /// The most blocks of a grid-stride launch: 4 * 132 * 8 = 4,224, four times what an H100/H200
  /// (132 SMs, 8 resident blocks of 256 threads each) holds at once (an MI300X, 304 CUs, holds
  /// 2,432), so every SM stays busy on the largest current GPUs, while the per-thread loop does
  /// several elements on big arrays and reduce_sum's result buffer stays <= 132 KiB.
  static constexpr int64_t kMaxGridBlocks = 4 * 132 * 8;
  GpuKernelLauncher(runtime::DeviceMemory &memory, GpuDevice &device, Program &program,
                    uint64_t module, DeviceAllocation runtime_state,
                    std::optional<DeviceAllocation> heap, uint64_t heap_bytes);
  [[nodiscard]] unsigned num_threads() const override { return 0; }

 private:
  RhiStatus check_kernel(const std::string &kernel) override;
  int64_t task_count(const LaunchSpec &spec) const override;
  RhiStatus execute(const std::string &kernel, uint64_t runtime_address, uint64_t args_address,
                    int64_t num_tasks, int64_t iteration_size) override;

  GpuDevice &device_;
  Program &program_;
  uint64_t module_;
};

}  // namespace kiln

#endif  // KILN_EXECUTOR_LAUNCHER_H_
