#include "kiln/executor/launcher.h"

#include "kiln/runtime/user_kernel_abi.h"

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

KernelLauncher::KernelLauncher(runtime::DeviceMemory &memory, const LauncherBuffers &buffers)
    : memory_(memory), buffers_(buffers) {
  if (!buffers_.heap) buffers_.heap_bytes = 0;
}

KernelLauncher::~KernelLauncher() = default;

RhiStatus KernelLauncher::bind() {
  LlvmDevice &device = memory_.device();
  KILN_ASSIGN_OR_RETURN(runtime_address_, device.device_address(buffers_.runtime_state));
  KILN_ASSIGN_OR_RETURN(args_address_, device.device_address(buffers_.argument_buffer));
  KILN_ASSIGN_OR_RETURN(result_address_, device.device_address(buffers_.result_buffer));
  if (buffers_.heap) {
    KILN_ASSIGN_OR_RETURN(heap_base_address_, device.device_address(*buffers_.heap));
  }
  if (device.host_addressable()) {  // a device address is a host address there
    runtime_host_ = reinterpret_cast<KilnRuntime *>(runtime_address_);
    args_host_ = reinterpret_cast<KilnKernelArgs *>(args_address_);
    result_host_ = reinterpret_cast<KilnTaskResult *>(result_address_);
  }
  bound_ = true;
  return {};
}

RhiStatus KernelLauncher::write_launch_state(const KilnKernelArgs &args) {
  KilnRuntime state{};
  state.heap_base = heap_base_address_;
  state.heap_size_bytes = buffers_.heap_bytes;
  if (args_host_ != nullptr) {
    *args_host_ = args;
    *runtime_host_ = state;
    return {};
  }
  LlvmDevice &device = memory_.device();
  KILN_RETURN_IF_ERROR(device.memcpy_host_to_device(buffers_.argument_buffer, 0, &args, sizeof args));
  return device.memcpy_host_to_device(buffers_.runtime_state, 0, &state, sizeof state);
}

RhiStatus KernelLauncher::clear_results(int64_t num_tasks) {
  const auto size_bytes = static_cast<uint64_t>(num_tasks) * sizeof(KilnTaskResult);
  if (result_host_ != nullptr) {
    std::memset(result_host_, 0, size_bytes);
    return {};
  }
  return memory_.device().fill_zero(buffers_.result_buffer, 0, size_bytes);
}

RhiStatus KernelLauncher::read_results(int64_t num_tasks, std::vector<KilnTaskResult> &out) {
  out.resize(static_cast<std::size_t>(num_tasks));
  if (result_host_ != nullptr) {
    std::copy_n(result_host_, out.size(), out.data());
    return {};
  }
  return memory_.device().memcpy_device_to_host(out.data(), buffers_.result_buffer, 0,
                                                out.size() * sizeof(KilnTaskResult));
}

namespace {

/// A device-side message as text any caller can show: printable ASCII kept, every other byte
/// (a user kernel's kiln_assert may pass any bytes) written \xNN.
std::string printable(const char *message) {
  std::string text;
  for (const char *c = message; *c != '\0'; ++c) {
    const auto byte = static_cast<unsigned char>(*c);
    if (byte >= 0x20 && byte < 0x7f) text += *c;
    else text += fmt::format("\\x{:02x}", byte);
  }
  return text;
}

}  // namespace

RhiStatus KernelLauncher::check_device_error(const std::string &kernel) {
  KilnRuntime state{};
  if (runtime_host_ != nullptr) {
    if (runtime_host_->error_code == KILN_DEVICE_OK) [[likely]]
      return {};
    state = *runtime_host_;
  } else {
    KILN_RETURN_IF_ERROR(
        memory_.device().memcpy_device_to_host(&state, buffers_.runtime_state, 0, sizeof state));
  }
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
  if (state.error_code == KILN_DEVICE_ASSERTION)
    return std::unexpected(make_failure(RhiResult::error, memory_.device().name(), kSite,
                                        fmt::format("kernel {}: a device-side assertion failed: {}", kernel,
                                                    printable(state.error_message))));
  return std::unexpected(make_failure(RhiResult::error, memory_.device().name(), kSite,
                                      fmt::format("kernel {} recorded device error {}: {}", kernel,
                                                  state.error_code, printable(state.error_message))));
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
  constexpr const char *kSite = "KernelLauncher::launch";
  std::lock_guard lock(mutex_);  // held until the results are read back: the buffers are shared
  KilnKernelFn fn = spec.host_fn;
  if (fn == nullptr && !spec.gpu_module) {
    KILN_ASSIGN_OR_RETURN(fn, check_kernel(spec.kernel));
  }
  LlvmDevice &device = memory_.device();
  if (!bound_)
    return std::unexpected(make_failure(RhiResult::error, device.name(), kSite,
                                        "internal: launch before KernelLauncher::bind"));
  // What a lost device says, with or without staging to allocate.
  KILN_RETURN_IF_ERROR_CONTEXT(device.check_alive(kSite), "preparing launch of {}", spec.kernel);
  const int64_t num_tasks = task_count(spec);
  if (num_tasks > max_tasks()) [[unlikely]]
    return std::unexpected(make_failure(
        RhiResult::error, device.name(), kSite,
        fmt::format("internal: {} tasks for {} exceed the result buffer's {} slots", num_tasks,
                    spec.kernel, max_tasks())));

  KilnKernelArgs args = spec.args;
  args.num_tasks = num_tasks;
  args.iteration_size = spec.iteration_size;
  args.result_buffer = result_address_;

  // Pre-flight: the staging for host operands, reserved and allocated in one step.
  std::optional<ScopedGroup> staging;
  if (std::ranges::any_of(spec.host_operands, [](const HostOperand &op) { return !op.bytes.empty(); })) {
    std::vector<runtime::AllocRequest> requests;
    requests.reserve(spec.host_operands.size());
    for (const HostOperand &op : spec.host_operands)
      if (!op.bytes.empty())
        requests.push_back({MemoryCategory::staging, op.bytes.size(), false, spec.kernel});
    KILN_ASSIGN_OR_RETURN_CONTEXT(std::vector<DeviceAllocation> allocs,
                                  memory_.allocate_group(requests), "preparing launch of {}",
                                  spec.kernel);
    staging.emplace(memory_, std::move(allocs));
  }
  std::size_t next = 0;
  for (const HostOperand &op : spec.host_operands) {
    if (op.bytes.empty()) {
      args.ptr[op.slot] = 0;
      continue;
    }
    const DeviceAllocation buffer = (*staging)[next++];
    KILN_RETURN_IF_ERROR(device.memcpy_host_to_device(buffer, 0, op.bytes.data(), op.bytes.size()));
    KILN_ASSIGN_OR_RETURN(args.ptr[op.slot], device.device_address(buffer));
  }
  KILN_RETURN_IF_ERROR(write_launch_state(args));
  if (spec.wants_task_results) KILN_RETURN_IF_ERROR(clear_results(num_tasks));

  KILN_RETURN_IF_ERROR(check_injected_launch_fault(spec.kernel));
  KILN_RETURN_IF_ERROR(execute(spec, fn, runtime_address_, args_address_, num_tasks,
                               spec.iteration_size));
  KILN_RETURN_IF_ERROR(check_device_error(spec.kernel));

  LaunchResult result;
  if (spec.wants_task_results) KILN_RETURN_IF_ERROR(read_results(num_tasks, result.task_results));
  return result;
}

// --- CPU --------------------------------------------------------------------------------------

CpuKernelLauncher::CpuKernelLauncher(runtime::DeviceMemory &memory, Program &program,
                                     const LauncherBuffers &buffers, unsigned num_threads)
    : KernelLauncher(memory, buffers),
      program_(program),
      pool_threads_(pool_threads(num_threads)),
      pool_(std::make_unique<runtime::ThreadPool>(pool_threads_)) {}

CpuKernelLauncher::~CpuKernelLauncher() = default;

unsigned CpuKernelLauncher::pool_threads(unsigned num_threads) {
  return num_threads != 0 ? num_threads : std::max(1u, std::thread::hardware_concurrency());
}

int64_t CpuKernelLauncher::max_tasks_for(unsigned num_threads) {
  return static_cast<int64_t>(pool_threads(num_threads)) * kTasksPerThread;
}

unsigned CpuKernelLauncher::num_threads() const { return pool_->num_threads(); }

// The pool may start fewer threads than asked (the OS refused some), never more.
int64_t CpuKernelLauncher::max_tasks() const {
  return static_cast<int64_t>(pool_threads_) * kTasksPerThread;
}

RhiExpected<KilnKernelFn> CpuKernelLauncher::check_kernel(const std::string &kernel) {
  if (last_fn_ != nullptr && kernel == last_kernel_) [[likely]]
    return last_fn_;
  KILN_ASSIGN_OR_RETURN(const KilnKernelFn fn, program_.kernel(kernel));
  last_kernel_ = kernel;
  last_fn_ = fn;
  return fn;
}

int64_t CpuKernelLauncher::task_count(const LaunchSpec &spec) const {
  if (spec.iteration_size <= spec.min_elements_per_task) return 1;
  const int64_t max_tasks = static_cast<int64_t>(pool_->num_threads()) * kTasksPerThread;
  const int64_t by_grain = (spec.iteration_size + spec.min_elements_per_task - 1) /
                           spec.min_elements_per_task;
  return std::max<int64_t>(1, std::min(max_tasks, by_grain));
}

RhiStatus CpuKernelLauncher::execute(const LaunchSpec &, KilnKernelFn fn, uint64_t runtime_address,
                                     uint64_t args_address, int64_t num_tasks, int64_t n) {
  auto *runtime_ptr = reinterpret_cast<KilnRuntime *>(runtime_address);
  const auto *args_ptr = reinterpret_cast<const KilnKernelArgs *>(args_address);
  if (num_tasks == 1) {  // on the caller's thread, without the pool's std::function
    fn(runtime_ptr, args_ptr, 0, n, 0);
    return {};
  }
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
                                     const LauncherBuffers &buffers)
    : KernelLauncher(memory, buffers),
      device_(device),
      program_(program),
      module_(module) {}

RhiExpected<KilnKernelFn> GpuKernelLauncher::check_kernel(const std::string &kernel) {
  if (program_.has_kernel(kernel)) return nullptr;  // the device runs it by name
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
  switch (spec.gpu_module ? GpuGridShape::grid_stride : gpu_grid_shape(spec.kernel)) {
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

RhiStatus GpuKernelLauncher::execute(const LaunchSpec &spec, KilnKernelFn, uint64_t runtime_address,
                                     uint64_t args_address, int64_t num_tasks, int64_t) {
  const std::string &kernel = spec.kernel;
  void *params[2] = {&runtime_address, &args_address};
  unsigned block = kBlockThreads;
  auto grid = static_cast<unsigned>(num_tasks);  // grid-stride kernels: one slot per block
  if (spec.gpu_module) {  // a user kernel: its own module's grid-stride entry point
    KILN_RETURN_IF_ERROR_CONTEXT(
        device_.launch_kernel(*spec.gpu_module, runtime::kUserGpuEntryName, grid, block, params),
        "running {}", kernel);
    return {};
  }
  if (gpu_grid_shape(kernel) == GpuGridShape::thread_per_task) {
    block = static_cast<unsigned>(std::min<int64_t>(num_tasks, kBlockThreads));
    grid = static_cast<unsigned>((num_tasks + block - 1) / block);
  }
  KILN_RETURN_IF_ERROR_CONTEXT(device_.launch_kernel(module_, kernel + "_gpu", grid, block, params),
                               "running {}", kernel);
  return {};
}

}  // namespace kiln
