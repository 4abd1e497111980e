#include "kiln/executor/executor.h"

#include <algorithm>

#include <cstring>
#include <utility>

#include <fmt/format.h>

#include "kiln/executor/launcher.h"
#include "kiln/runtime/memory/fault_spec.h"
#include "kiln/runtime/host_memory_guard.h"
#include "kiln/runtime/thread_pool.h"

namespace kiln {

DeviceContext::~DeviceContext() {
  memory.reset();  // frees what is still live before the device goes
  device.reset();
}

CodegenArch codegen_arch(const LlvmDevice &device) {
  switch (device.backend()) {  // from rhi/backends.inc: each backend names its code arch
#define KILN_BACKEND(name, code_arch) \
  case Backend::name:                  \
    return CodegenArch::code_arch;
#include "kiln/rhi/backends.inc"
#undef KILN_BACKEND
  }
  return CodegenArch::host;
}

LlvmRuntimeExecutor::LlvmRuntimeExecutor(ExecutorConfig config,
                                         std::shared_ptr<DeviceContext> context,
                                         std::shared_ptr<Program> program)
    : config_(std::move(config)), context_(std::move(context)), program_(std::move(program)) {}

LlvmRuntimeExecutor::~LlvmRuntimeExecutor() {
  launcher_.reset();
  // A destructor cannot report: a refused unload leaves the module to the context's teardown,
  // and a free the driver refuses is kept by the device for its next synchronize().
  if (module_)
    ignore_result(static_cast<GpuDevice &>(*context_->device).unload_module(*module_),
                  "destructor; the module goes with the device's context");
  for (DeviceAllocation alloc : runtime_allocs_)
    ignore_result(context_->memory->free(alloc),
                  "destructor; the device defers a refused free to synchronize()");
  context_->memory->release_cached();  // arrays that outlive the executor still work, uncached
  if (code_charged_) context_->memory->uncharge(MemoryCategory::code_object, program_->code_size_bytes());
}

RhiExpected<std::unique_ptr<LlvmRuntimeExecutor>> LlvmRuntimeExecutor::create(
    ExecutorConfig config, std::shared_ptr<Program> program) {
  const std::string device(to_string(config.backend));
  return runtime::guard_host_exceptions(device, "LlvmRuntimeExecutor::create", [&] {
    return create_unguarded(std::move(config), std::move(program));
  });
}

RhiExpected<std::unique_ptr<LlvmRuntimeExecutor>> LlvmRuntimeExecutor::create_unguarded(
    ExecutorConfig config, std::shared_ptr<Program> program) {
  // KILN_FAULT is checked before anything is opened, and armed once the executor is made, so
  // that its counts start at the program's first request.
  KILN_ASSIGN_OR_RETURN(const std::optional<runtime::FaultSpec> env_fault,
                        runtime::fault_spec_from_env());
  if (auto known = env_fault ? check_fault_kernel(*env_fault) : RhiStatus{}; !known) {
    known.error().detail = fmt::format("KILN_FAULT: {}", known.error().detail);
    return std::unexpected(std::move(known).error());
  }
  auto context = std::make_shared<DeviceContext>();
  KILN_ASSIGN_OR_RETURN(context->device,
                        create_device(config.backend, DeviceOptions{.ordinal = config.device_ordinal,
                                                                     .mock = config.mock}));
  KILN_ASSIGN_OR_RETURN(context->memory, runtime::DeviceMemory::create(*context->device, config.budget));
  const CodegenArch arch = codegen_arch(*context->device);
  // A GPU gets the code of its own processor (sm_90 PTX for an H200, gfx942 for an MI300).
  const std::string_view target = context->device->host_addressable()
                                      ? std::string_view()
                                      : static_cast<GpuDevice &>(*context->device).code_target();
  if (!program) {
    KILN_ASSIGN_OR_RETURN(program, Program::shared(arch, target));
  }
  if (program->arch() != arch)
    return std::unexpected(invalid_usage(context->device->name(), "LlvmRuntimeExecutor::create",
                                         "the program was compiled for another arch than the device's"));
  if (!program->runs_on(target))  // refused here, not by a driver that may only say "invalid PTX"
    return std::unexpected(make_failure(
        RhiResult::not_supported, context->device->name(), "LlvmRuntimeExecutor::create",
        fmt::format("the program's code is for {}, which does not run on this {} device",
                    program->target(), target)));
  std::unique_ptr<LlvmRuntimeExecutor> executor(
      new LlvmRuntimeExecutor(std::move(config), std::move(context), std::move(program)));
  KILN_RETURN_IF_ERROR(executor->init_runtime());
  if (env_fault) executor->memory().fault_plan().arm(*env_fault);
  return executor;
}

RhiStatus LlvmRuntimeExecutor::init_runtime() {
  runtime::DeviceMemory &memory = *context_->memory;
  KILN_RETURN_IF_ERROR(memory.charge(MemoryCategory::code_object, program_->code_size_bytes()));
  code_charged_ = true;
  // The launcher's argument and result buffers live as long as the executor, so a launch
  // allocates only staging for its host operands (none for most launches).
  const bool host = context_->device->host_addressable();
  // The pool's thread count, resolved once: the result buffer is sized for it and the pool is
  // made with it (hardware_concurrency() read twice could differ, leaving the buffer short).
  const unsigned threads = CpuKernelLauncher::pool_threads(config_.num_threads);
  const int64_t max_tasks = host ? CpuKernelLauncher::max_tasks_for(threads)
                                 : GpuKernelLauncher::kMaxLaunchTasks;
  std::vector<runtime::AllocRequest> requests = {
      {MemoryCategory::runtime_heap, sizeof(KilnRuntime), /*zero_fill=*/true},
      {MemoryCategory::argument_buffer, sizeof(KilnKernelArgs), /*zero_fill=*/false},
      {MemoryCategory::result_buffer, static_cast<uint64_t>(max_tasks) * sizeof(KilnTaskResult),
       /*zero_fill=*/true}};
  if (config_.device_heap_bytes != 0)
    requests.push_back({MemoryCategory::runtime_heap, config_.device_heap_bytes, false});
  KILN_ASSIGN_OR_RETURN_CONTEXT(runtime_allocs_, memory.allocate_group(requests),
                                "allocating the device runtime heap and launch buffers");
  LauncherBuffers buffers{.runtime_state = runtime_allocs_[0],
                          .argument_buffer = runtime_allocs_[1],
                          .result_buffer = runtime_allocs_[2],
                          .heap = std::nullopt,
                          .heap_bytes = 0};
  if (runtime_allocs_.size() > 3) {
    heap_alloc_ = runtime_allocs_[3];
    buffers.heap = heap_alloc_;
    buffers.heap_bytes = config_.device_heap_bytes;
  }
  if (host) {
    launcher_ = std::make_unique<CpuKernelLauncher>(memory, *program_, buffers, threads);
    return launcher_->bind();
  }
  auto &gpu = static_cast<GpuDevice &>(*context_->device);
  auto module = gpu.load_module(program_->code_image());
  if (!module) {
    memory.annotate(module.error());
    return std::unexpected(std::move(module).error().add_context("loading the kernels' code object"));
  }
  module_ = *module;
  launcher_ = std::make_unique<GpuKernelLauncher>(memory, gpu, *program_, *module_, buffers);
  return launcher_->bind();
}

RhiStatus check_fault_kernel(const runtime::FaultSpec &spec, std::span<const std::string> user_kernels) {
  if (spec.kernel.empty()) return {};
  for (const std::string &entry : user_kernels)
    if (spec.kernel == entry) return {};
  static constexpr std::string_view kKernels[] = {
#define KILN_KERNEL_NAME(op, dtype) "kiln_" #op "_" #dtype,
      KILN_FOR_EACH_KERNEL(KILN_KERNEL_NAME)
#undef KILN_KERNEL_NAME
  };
  for (std::string_view kernel : kKernels)
    if (runtime::FaultSpec::kernel_named(spec.kernel, kernel)) return {};
  std::string ops;
#define KILN_OP_NAME(op, dtype) ops += (ops.empty() ? "" : ", ") + std::string(#op);
  KILN_FOR_EACH_KERNEL_OF_DTYPE(KILN_OP_NAME, f32)
#undef KILN_OP_NAME
  return std::unexpected(invalid_usage(
      "kiln", "check_fault_kernel",
      fmt::format("fault spec '{}': kernel={} names no kernel; the ops are {} (each a kernel "
                  "kiln_<op>_<dtype>, dtype f32, f64, i32 or i64)",
                  spec.to_text(), spec.kernel, ops)));
}

RhiStatus LlvmRuntimeExecutor::arm_fault(const runtime::FaultSpec &spec) {
  KILN_RETURN_IF_ERROR(check_fault(spec));
  memory().fault_plan().arm(spec);
  return {};
}

RhiStatus LlvmRuntimeExecutor::check_fault(const runtime::FaultSpec &spec) const {
  std::lock_guard lock(user_kernels_mutex_);
  return check_fault_kernel(spec, user_kernel_names_);
}

void LlvmRuntimeExecutor::remember_user_kernel(const std::string &entry) {
  std::lock_guard lock(user_kernels_mutex_);
  if (std::find(user_kernel_names_.begin(), user_kernel_names_.end(), entry) == user_kernel_names_.end())
    user_kernel_names_.push_back(entry);
}

RhiStatus recreate_executor(std::unique_ptr<LlvmRuntimeExecutor> &executor, ExecutorConfig config) {
  std::weak_ptr<DeviceContext> lost_context;
  if (executor && executor->device().is_lost()) {
    lost_context = executor->context();
    executor.reset();  // lets go of the lost context before a new one is asked for
  }
  auto created = LlvmRuntimeExecutor::create(std::move(config));
  if (!created) {
    if (created.error().result == RhiResult::device_lost && !lost_context.expired())
      created.error().add_context(kLostContextStillHeld);
    return std::unexpected(std::move(created).error());
  }
  executor = std::move(*created);
  return {};
}

unsigned LlvmRuntimeExecutor::worker_threads() const { return launcher_->num_threads(); }

RhiExpected<std::shared_ptr<Ndarray::State>> LlvmRuntimeExecutor::new_array_state(
    DataType dtype, std::span<const int64_t> shape) {
  auto info = compute_shape_info(dtype, shape);
  if (!info) {
    info.error().device = device().name();
    return std::unexpected(std::move(info).error());
  }
  return std::make_shared<Ndarray::State>(context_, dtype, shape, *info);
}

RhiExpected<Ndarray> LlvmRuntimeExecutor::ndarray(DataType dtype, std::span<const int64_t> shape) {
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<Ndarray::State> state, new_array_state(dtype, shape));
  if (state->info.size_bytes != 0) {
    auto alloc = context_->memory->allocate(MemoryCategory::ndarray, state->info.size_bytes);
    if (!alloc) {
      Failure f = std::move(alloc).error();
      if (f.detail.empty()) f.detail = fmt::format("ndarray {}", describe_array(dtype, shape));
      return std::unexpected(std::move(f));
    }
    state->alloc = *alloc;
  }
  return Ndarray(std::move(state));
}

RhiExpected<Ndarray> LlvmRuntimeExecutor::wrap_external(DataType dtype, std::span<const int64_t> shape,
                                                        uint64_t address, std::function<void()> release) {
  constexpr const char *kSite = "wrap_external";
  KILN_ASSIGN_OR_RETURN(std::shared_ptr<Ndarray::State> state, new_array_state(dtype, shape));
  if (state->info.size_bytes != 0) {
    if (address == 0)
      return std::unexpected(invalid_usage(
          device().name(), kSite,
          fmt::format("external memory for ndarray {} at address 0: a null pointer",
                      describe_array(dtype, shape))));
    if (address % itemsize(dtype) != 0)
      return std::unexpected(invalid_usage(
          device().name(), kSite,
          fmt::format("external memory for ndarray {} at address {:#x} is not aligned to its "
                      "{}-byte elements",
                      describe_array(dtype, shape), address, itemsize(dtype))));
    KILN_ASSIGN_OR_RETURN(state->alloc, device().register_external(address, state->info.size_bytes));
  }
  state->release_external = std::move(release);  // from here on the array owns the memory
  return Ndarray(std::move(state));
}

RhiStatus LlvmRuntimeExecutor::free(Ndarray &array) {
  KILN_RETURN_IF_ERROR(check_usable("free", array));  // a handle, not freed, of this executor
  const std::optional<DeviceAllocation> alloc = array.state_->alloc;
  if (array.state_->release_external) {
    array.state_->freed = true;
    array.state_->freed_device_name = device().name();
    array.state_->context.reset();
    RhiStatus unregistered = alloc ? device().unregister_external(*alloc) : RhiStatus{};
    std::exchange(array.state_->release_external, nullptr)();
    return unregistered;
  }
  array.state_->freed = true;
  // A freed array no longer keeps the device open: once the executor and the live arrays are
  // gone, the device (and a lost device's driver context) is released, so a new executor on it
  // can recover.
  array.state_->freed_device_name = device().name();
  array.state_->context.reset();
  if (alloc) return context_->memory->free(*alloc);
  return {};
}

RhiStatus LlvmRuntimeExecutor::check_usable(const char *op, const Ndarray &a) const {
  KILN_RETURN_IF_ERROR(a.allocation(op));
  if (a.state_->context != context_)
    return std::unexpected(invalid_usage(device().name(), op,
                                         fmt::format("ndarray {} belongs to another executor", a.describe())));
  return {};
}

RhiStatus LlvmRuntimeExecutor::check_same(const char *op, const Ndarray &a, const Ndarray &b) const {
  KILN_RETURN_IF_ERROR(check_usable(op, a));
  KILN_RETURN_IF_ERROR(check_usable(op, b));
  if (a.dtype() != b.dtype() || a.shape() != b.shape())
    return std::unexpected(invalid_usage(
        device().name(), op,
        fmt::format("{} needs operands of one dtype and shape, got {} and {}", op, a.describe(), b.describe())));
  return {};
}

RhiStatus LlvmRuntimeExecutor::write(const Ndarray &array, std::span<const std::byte> bytes) {
  KILN_RETURN_IF_ERROR(check_usable("write", array));
  if (bytes.size() != array.nbytes())
    return std::unexpected(invalid_usage(device().name(), "write",
                                         fmt::format("{} holds {} bytes, got {}", array.describe(),
                                                     array.nbytes(), bytes.size())));
  if (bytes.empty()) return {};
  return device().memcpy_host_to_device(*array.state_->alloc, 0, bytes.data(), bytes.size());
}

RhiStatus LlvmRuntimeExecutor::read(const Ndarray &array, std::span<std::byte> bytes) {
  KILN_RETURN_IF_ERROR(check_usable("read", array));
  if (bytes.size() != array.nbytes())
    return std::unexpected(invalid_usage(device().name(), "read",
                                         fmt::format("{} holds {} bytes, got room for {}",
                                                     array.describe(), array.nbytes(), bytes.size())));
  if (bytes.empty()) return {};
  return device().memcpy_device_to_host(bytes.data(), *array.state_->alloc, 0, bytes.size());
}

}  // namespace kiln
