// The CPU kernel launcher: computes and reserves everything a launch needs in one step, then
// either launches or returns the error with nothing launched and nothing held.
#ifndef KILN_EXECUTOR_LAUNCHER_H_
#define KILN_EXECUTOR_LAUNCHER_H_

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/executor/program.h"
#include "kiln/rhi/device.h"
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
/// the result buffer and num_tasks are filled by the launcher.
struct LaunchSpec {
  std::string kernel;                ///< "kiln_axpy_f32"
  KilnKernelArgs args{};
  int64_t iteration_size = 0;        ///< elements (or rows, for matmul) of the iteration space
  int64_t min_elements_per_task = 1 << 16;  ///< below this a launch runs as one task
  std::vector<HostOperand> host_operands;
  bool wants_task_results = false;   ///< allocate, clear and read back the result buffer
};

/// The device's answers for one launch.
struct LaunchResult {
  std::vector<KilnTaskResult> task_results;  ///< one per task when wants_task_results
};

/// Launches kernels of a Program on a host-addressable device (cpu, mock). One launch at a time
/// (a mutex); launches from several threads are serialized.
class CpuKernelLauncher {
 public:
  /// `runtime_state` holds the KilnRuntime; `heap` (absent when heap_bytes is 0) is the device
  /// heap chunk of `heap_bytes` that kernels allocate from. Both stay owned by the caller.
  CpuKernelLauncher(runtime::DeviceMemory &memory, Program &program, DeviceAllocation runtime_state,
                    std::optional<DeviceAllocation> heap, uint64_t heap_bytes, unsigned num_threads);
  ~CpuKernelLauncher();

  /// Runs `spec`. Before anything is allocated: the kernel must exist (invalid_usage). Then the
  /// argument buffer, result buffer and staging are reserved together (out_of_memory, nothing
  /// held, nothing launched). After the launch the device error area is checked: heap
  /// exhaustion -> out_of_memory (oom_source device_heap); other device errors -> error.
  /// Every launch-scoped allocation is freed before returning, on every path.
  [[nodiscard]] RhiExpected<LaunchResult> launch(const LaunchSpec &spec);
  /// Worker threads a launch uses (the calling thread included).
  [[nodiscard]] unsigned num_threads() const;

 private:
  [[nodiscard]] int64_t task_count(const LaunchSpec &spec) const;
  [[nodiscard]] RhiStatus reset_runtime();
  [[nodiscard]] RhiStatus check_device_error(const std::string &kernel);

  runtime::DeviceMemory &memory_;
  Program &program_;
  DeviceAllocation runtime_state_;
  std::optional<DeviceAllocation> heap_;
  uint64_t heap_bytes_;
  std::unique_ptr<runtime::ThreadPool> pool_;
  std::mutex mutex_;
};

}  // namespace kiln

#endif  // KILN_EXECUTOR_LAUNCHER_H_
