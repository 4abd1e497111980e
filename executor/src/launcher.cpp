#include "kiln/executor/launcher.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <thread>

#include <fmt/format.h>

#include "kiln/runtime/host_memory_guard.h"
#include "kiln/runtime/thread_pool.h"

namespace kiln {
namespace {

// Frees a launch's allocations on every path out of launch().
class ScopedGroup {
 public:
  ScopedGroup(runtime::DeviceMemory &memory, std::vector<DeviceAllocation> allocs)
      : memory_(memory), allocs_(std::move(allocs)) {}
  ~ScopedGroup() {
    for (DeviceAllocation a : allocs_)
      ignore_result(memory_.free(a),
                    "destructor; the device defers a refused free to synchronize()");
  }
  ScopedGroup(const ScopedGroup &) = delete;
  ScopedGroup &operator=(const ScopedGroup &) = delete;
  [[nodiscard]] DeviceAllocation operator[](std::size_t i) const { return allocs_[i]; }

 private:
  runtime::DeviceMemory &memory_;
  std::vector<DeviceAllocation> allocs_;
};

}  // namespace

// --- shared launch contract -------------------------------------------------------------------

KernelLauncher::KernelLauncher(runtime::DeviceMemory &memory, DeviceAllocation runtime_state,
                               std::optional<DeviceAllocation> heap, uint64_t heap_bytes)
    : memory_(memory), runtime_state_(runtime_state), heap_(heap), heap_bytes_(heap ? heap_bytes : 0) {}

KernelLauncher::~KernelLauncher() = default;

RhiStatus KernelLauncher::reset_runtime() {
  LlvmDevice &device = memory_.device();
  KilnRuntime state{};
  if (heap_ && heap_base_address_ == 0) {  // the heap lives as long as the launcher: asked once
    KILN_ASSIGN_OR_RETURN(heap_base_address_, device.device_address(*heap_));
  }
  state.heap_base = heap_base_address_;
  state.heap_size_bytes = heap_bytes_;
  return device.memcpy_host_to_device(runtime_state_, 0, &state, sizeof state);
}

RhiStatus KernelLauncher::check_device_error(const std::string &kernel) {
  KilnRuntime state{};
  KILN_RETURN_IF_ERROR(memory_.device().memcpy_device_to_host(&state, runtime_state_, 0, sizeof state));
  if (state.error_code == KILN_DEVICE_OK) return {};
  state.error_message[sizeof state.error_message - 1] = '\0';
  constexpr const char *kSite = "KernelLauncher::launch";
  if (state.error_code == KILN_DEVICE_HEAP_EXHAUSTED) {
    Failure f = device_heap_exhausted(
        memory_.device().name(), kSite, state.error_arg0,
        fmt::format("kernel {}; heap of {} had {} used", kernel, format_bytes(state.error_arg2),
                    format_bytes(state.error_arg1)));
    memory_.annotate(f);
    return std::unexpected(std::move(f));
  }
  return std::unexpected(make_failure(RhiResult::error, memory_.device().name(), kSite,
                                      fmt::format("kernel {} recorded device error {}: {}", kernel,
                                                  state.error_code, state.error_message)));
}

RhiStatus KernelLauncher::check_injected_launch_fault(const std::string &kernel) {
  const std::optional<runtime::FaultKind> kind = memory_.fault_plan().launch_fault(kernel);
  if (!kind) [[likely]]
    return {};
  constexpr const char *kSite = "KernelLauncher::launch";
  if (*kind == runtime::FaultKind::heap) {  // reported as check_device_error reports a real one
    Failure f = injected_heap_exhaustion(memory_.device().name(), kSite, kernel);
    memory_.annotate(f);
    return std::unexpected(std::move(f));
  }
  return std::unexpected(injected_launch_fault(memory_.device().name(), kSite, kernel));
}

RhiExpected<LaunchResult> KernelLauncher::launch(const LaunchSpec &spec) {
  // A host allocation of the launch itself (its request list, the task results) may fail.
  return runtime::guard_host_exceptions(memory_.device().name(), "KernelLauncher::launch",
                                        [&] { return launch_unguarded(spec); });
}

RhiExpected<LaunchResult> KernelLauncher::launch_unguarded(const LaunchSpec &spec) {
  KILN_RETURN_IF_ERROR(check_kernel(spec.kernel));
  std::lock_guard lock(mutex_);
  const int64_t num_tasks = task_count(spec);

  // Pre-flight: everything the launch needs, reserved and allocated in one step.
  std::vector<runtime::AllocRequest> requests;
  requests.reserve(2 + spec.host_operands.size());
  requests.push_back({MemoryCategory::argument_buffer, sizeof(KilnKernelArgs), false});
  requests.push_back({MemoryCategory::result_buffer,
                      static_cast<uint64_t>(num_tasks) * sizeof(KilnTaskResult), true});
  for (const HostOperand &op : spec.host_operands)
    if (!op.bytes.empty()) requests.push_back({MemoryCategory::staging, op.bytes.size(), false});
  for (runtime::AllocRequest &r : requests) r.kernel = spec.kernel;  // for a fault spec's kernel=
  KILN_ASSIGN_OR_RETURN_CONTEXT(std::vector<DeviceAllocation> allocs,
                                memory_.allocate_group(requests), "preparing launch of {}",
                                spec.kernel);
  ScopedGroup group(memory_, std::move(allocs));

  LlvmDevice &device = memory_.device();
  KilnKernelArgs args = spec.args;
  args.num_tasks = num_tasks;
  args.iteration_size = spec.iteration_size;
  KILN_ASSIGN_OR_RETURN(args.result_buffer, device.device_address(group[1]));
  std::size_t next = 2;
  for (const HostOperand &op : spec.host_operands) {
    if (op.bytes.empty()) {
      args.ptr[op.slot] = 0;
      continue;
    }
    const DeviceAllocation staging = group[next++];
    KILN_RETURN_IF_ERROR(device.memcpy_host_to_device(staging, 0, op.bytes.data(), op.bytes.size()));
    KILN_ASSIGN_OR_RETURN(args.ptr[op.slot], device.device_address(staging));
  }
  KILN_RETURN_IF_ERROR(device.memcpy_host_to_device(group[0], 0, &args, sizeof args));
  KILN_RETURN_IF_ERROR(reset_runtime());

  KILN_ASSIGN_OR_RETURN(const uint64_t runtime_address, device.device_address(runtime_state_));
  KILN_ASSIGN_OR_RETURN(const uint64_t args_address, device.device_address(group[0]));
  KILN_RETURN_IF_ERROR(check_injected_launch_fault(spec.kernel));
  KILN_RETURN_IF_ERROR(execute(spec.kernel, runtime_address, args_address, num_tasks, spec.iteration_size));
  KILN_RETURN_IF_ERROR(check_device_error(spec.kernel));

  LaunchResult result;
  if (spec.wants_task_results) {
    result.task_results.resize(static_cast<std::size_t>(num_tasks));
    KILN_RETURN_IF_ERROR(device.memcpy_device_to_host(
        result.task_results.data(), group[1], 0, result.task_results.size() * sizeof(KilnTaskResult)));
  }
  return result;
}

// --- CPU --------------------------------------------------------------------------------------

CpuKernelLauncher::CpuKernelLauncher(runtime::DeviceMemory &memory, Program &program,
                                     DeviceAllocation runtime_state,
                                     std::optional<DeviceAllocation> heap, uint64_t heap_bytes,
                                     unsigned num_threads)
    : KernelLauncher(memory, runtime_state, heap, heap_bytes),
      program_(program),
      pool_(std::make_unique<runtime::ThreadPool>(
          num_threads != 0 ? num_threads : std::max(1u, std::thread::hardware_concurrency()))) {}

CpuKernelLauncher::~CpuKernelLauncher() = default;

unsigned CpuKernelLauncher::num_threads() const { return pool_->num_threads(); }

RhiStatus CpuKernelLauncher::check_kernel(const std::string &kernel) {
  KILN_RETURN_IF_ERROR(program_.kernel(kernel));
  return {};
}

int64_t CpuKernelLauncher::task_count(const LaunchSpec &spec) const {
  if (spec.iteration_size <= spec.min_elements_per_task) return 1;
  const int64_t max_tasks = static_cast<int64_t>(pool_->num_threads()) * 4;
  const int64_t by_grain = (spec.iteration_size + spec.min_elements_per_task - 1) /
                           spec.min_elements_per_task;
  return std::max<int64_t>(1, std::min(max_tasks, by_grain));
}

RhiStatus CpuKernelLauncher::execute(const std::string &kernel, uint64_t runtime_address,
                                     uint64_t args_address, int64_t num_tasks, int64_t n) {
  KILN_ASSIGN_OR_RETURN(const KilnKernelFn fn, program_.kernel(kernel));
  auto *runtime_ptr = reinterpret_cast<KilnRuntime *>(runtime_address);
  const auto *args_ptr = reinterpret_cast<const KilnKernelArgs *>(args_address);
  pool_->parallel_for(num_tasks, [&](int64_t task) {
    const int64_t begin = kiln_task_split_point(n, task, num_tasks);
    const int64_t end = kiln_task_split_point(n, task + 1, num_tasks);
    fn(runtime_ptr, args_ptr, begin, end, task);
  });
  return {};
}

// --- GPU --------------------------------------------------------------------------------------

GpuKernelLauncher::GpuKernelLauncher(runtime::DeviceMemory &memory, GpuDevice &device,
                                     Program &program, uint64_t module,
                                     DeviceAllocation runtime_state,
                                     std::optional<DeviceAllocation> heap, uint64_t heap_bytes)
    : KernelLauncher(memory, runtime_state, heap, heap_bytes),
      device_(device),
      program_(program),
      module_(module) {}

RhiStatus GpuKernelLauncher::check_kernel(const std::string &kernel) {
  if (program_.has_kernel(kernel)) return {};
  return std::unexpected(invalid_usage(device_.name(), "GpuKernelLauncher::launch",
                                       fmt::format("unknown kernel '{}'", kernel)));
}

namespace {

/// How a GPU kernel maps onto the grid (see GpuKernelLauncher).
enum class GpuGridShape { grid_stride, matmul_tiles, thread_per_task };

GpuGridShape gpu_grid_shape(std::string_view kernel) {
  if (kernel.find("compact_positive") != std::string_view::npos) return GpuGridShape::thread_per_task;
  if (kernel.find("matmul") != std::string_view::npos) return GpuGridShape::matmul_tiles;
  return GpuGridShape::grid_stride;
}

int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

}  // namespace

int64_t GpuKernelLauncher::task_count(const LaunchSpec &spec) const {
  switch (gpu_grid_shape(spec.kernel)) {
    case GpuGridShape::thread_per_task:
      return std::clamp<int64_t>(spec.iteration_size, 1, kMaxTasks);
    case GpuGridShape::matmul_tiles: {
      constexpr int64_t kTile = 16;  // kiln_gpu::kTile
      const auto m = static_cast<int64_t>(std::min<uint64_t>(spec.args.dims[0], INT32_MAX));
      const auto n = static_cast<int64_t>(std::min<uint64_t>(spec.args.dims[1], INT32_MAX));
      const int64_t tiles = ceil_div(m, kTile) * ceil_div(n, kTile);
      return std::clamp<int64_t>(tiles, 1, kMaxGridBlocks);
    }
    case GpuGridShape::grid_stride:
      break;
  }
  return std::clamp<int64_t>(ceil_div(std::max<int64_t>(spec.iteration_size, 0), kBlockThreads), 1,
                             kMaxGridBlocks);
}

RhiStatus GpuKernelLauncher::execute(const std::string &kernel, uint64_t runtime_address,
                                     uint64_t args_address, int64_t num_tasks, int64_t) {
  void *params[2] = {&runtime_address, &args_address};
  unsigned block = kBlockThreads;
  auto grid = static_cast<unsigned>(num_tasks);  // grid-stride kernels: one slot per block
  if (gpu_grid_shape(kernel) == GpuGridShape::thread_per_task) {
    block = static_cast<unsigned>(std::min<int64_t>(num_tasks, kBlockThreads));
    grid = static_cast<unsigned>((num_tasks + block - 1) / block);
  }
  KILN_RETURN_IF_ERROR_CONTEXT(device_.launch_kernel(module_, kernel + "_gpu", grid, block, params),
                               "running {}", kernel);
  return {};
}

}  // namespace kiln
