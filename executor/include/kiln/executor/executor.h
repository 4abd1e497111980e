// LlvmRuntimeExecutor: owns a device, its budgeted memory, the device runtime state and the
// launcher; offers ndarrays and the built-in operations.
#ifndef KILN_EXECUTOR_EXECUTOR_H_
#define KILN_EXECUTOR_EXECUTOR_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/executor/dtype.h"
#include "kiln/executor/ndarray.h"
#include "kiln/executor/program.h"
#include "kiln/rhi/backend_registry.h"
#include "kiln/rhi/device.h"
#include "kiln/rhi/fork_hooks.h"
#include "kiln/runtime/memory/device_memory.h"
#include "kiln/runtime/memory/fault_spec.h"

namespace kiln {

/// Everything an executor is made from. Sizes in bytes.
struct ExecutorConfig {
  Backend backend = Backend::cpu;
  /// Which device of the backend: cuda:N, amdgpu:N (the driver's ordinal). cpu and mock have
  /// only device 0 (invalid_usage otherwise); a GPU ordinal the driver does not have is
  /// not_supported naming its device count.
  int device_ordinal = 0;
  runtime::BudgetConfig budget;
  /// The device heap chunk kernels allocate from while they run (e.g. compact_positive).
  uint64_t device_heap_bytes = 16ull << 20;
  /// Used when backend == mock.
  MockDeviceOptions mock;
  /// CPU worker threads for launches; 0 = all cores.
  unsigned num_threads = 0;
};

/// The device and its memory, shared by the executor and every ndarray it made, so arrays may
/// outlive the executor safely. Members are destroyed memory-first.
struct DeviceContext {
  std::unique_ptr<LlvmDevice> device;
  std::unique_ptr<runtime::DeviceMemory> memory;
  ~DeviceContext();
};

/// The code-generation arch a device's backend runs: host for cpu and mock, nvptx64 for cuda,
/// amdgcn for amdgpu.
[[nodiscard]] CodegenArch codegen_arch(const LlvmDevice &device);

class KernelLauncher;
class UserKernel;
struct KernelArg;

/// The executor. Every operation returns RhiExpected / RhiStatus (no exceptions); wrap with
/// value_or_throw() for the named exceptions. Launches on one executor are serialized; the
/// executor may be shared between threads.
class LlvmRuntimeExecutor {
 public:
  /// Opens the device, sets its budget, compiles (or reuses) the Program, and allocates the
  /// device runtime state, heap chunk and the launcher's argument and result buffers (held for
  /// the executor's life: launches allocate only staging for host operands). Errors: those of
  /// create_device (backend_registry.h) and Program::create; out_of_memory when the heap chunk,
  /// the launch buffers (named by category) or code object do not fit, or the
  /// host has no memory left for the executor itself (oom_source host; a thread the host
  /// refuses is error); invalid_usage naming KILN_FAULT when that variable is set but is no
  /// fault spec (runtime/memory/fault_spec.h) or its kernel= names no kernel
  /// (check_fault_kernel), checked before the device is opened. A valid
  /// KILN_FAULT is armed on memory().fault_plan() once the executor is made, so its counts start
  /// at the first request after create().
  [[nodiscard]] static RhiExpected<std::unique_ptr<LlvmRuntimeExecutor>> create(
      ExecutorConfig config, std::shared_ptr<Program> program = nullptr);
  ~LlvmRuntimeExecutor();

  /// A new array of `shape` (row-major). Contents are unspecified until written.
  /// Errors: invalid_usage (negative dimension, size overflow), out_of_memory.
  [[nodiscard]] RhiExpected<Ndarray> ndarray(DataType dtype, std::span<const int64_t> shape);
  /// An array over memory another library owns (DLPack import): `shape` (row-major, contiguous)
  /// of `dtype` at device address `address` of this executor's device (a host address on cpu
  /// and mock), aligned to the dtype's size. Nothing is allocated or charged to the budget.
  /// `release` (which must not throw) is called exactly once, when the array is freed or its
  /// last handle goes; on failure it is not called and the caller still owns the memory.
  /// Errors: invalid_usage (shape as for ndarray(), address 0 or misaligned for a non-empty
  /// array), device_lost.
  [[nodiscard]] RhiExpected<Ndarray> wrap_external(DataType dtype, std::span<const int64_t> shape,
                                                   uint64_t address, std::function<void()> release);
  /// Frees the array's memory now (for wrap_external's arrays: gives it back to its owner, as
  /// the last thing it does: the release may destroy this executor, as a DLPack producer's
  /// deleter that runs Python can). Errors: invalid_usage if already freed.
  [[nodiscard]] RhiStatus free(Ndarray &array);
  /// Copies host bytes in / out; `bytes.size()` must equal array.nbytes(). Errors: invalid_usage.
  [[nodiscard]] RhiStatus write(const Ndarray &array, std::span<const std::byte> bytes);
  [[nodiscard]] RhiStatus read(const Ndarray &array, std::span<std::byte> bytes);

  /// out[i] = value.
  [[nodiscard]] RhiStatus fill(const Ndarray &out, Scalar value);
  /// dst[i] = src[i]; same dtype and shape.
  [[nodiscard]] RhiStatus copy(const Ndarray &dst, const Ndarray &src);
  /// y[i] = alpha * x[i] + y[i]; same dtype and shape (integers wrap).
  [[nodiscard]] RhiStatus axpy(Scalar alpha, const Ndarray &x, const Ndarray &y);
  /// The same with x given in host memory: x is staged on the device for the launch.
  [[nodiscard]] RhiStatus axpy_from_host(Scalar alpha, std::span<const std::byte> x_host,
                                         const Ndarray &y);
  /// Sum of all elements (floating: accumulated in f64; integers: wrapping i64).
  [[nodiscard]] RhiExpected<Scalar> reduce_sum(const Ndarray &x);
  /// The shape (m, n) of a @ b for a (m, k) and b (k, n) of one dtype, both usable arrays of
  /// this executor. Allocates nothing: callers check a matmul with it before they allocate its
  /// output, so a usage mistake is never reported as out-of-memory. Errors: invalid_usage.
  [[nodiscard]] RhiExpected<std::array<int64_t, 2>> matmul_output_shape(const Ndarray &a,
                                                                        const Ndarray &b) const;
  /// c = a @ b for 2-D arrays: a (m, k), b (k, n), c (m, n), one dtype; c is neither a nor b.
  [[nodiscard]] RhiStatus matmul(const Ndarray &c, const Ndarray &a, const Ndarray &b);
  /// The elements of x that are > 0, in order, as a new 1-D array. The kernel allocates its
  /// output from the device heap while it runs. Errors: out_of_memory with oom_source
  /// device_heap (DeviceHeapExhaustedError) when the heap is too small; nothing is held after.
  [[nodiscard]] RhiExpected<Ndarray> compact_positive(const Ndarray &x);

  /// Runs user kernel `kernel` (user_kernel.h) once per element index in [0, count) with
  /// `args`, one per declared parameter. `count` defaults to the element count of the array
  /// arguments, which must all have exactly `count` elements. Checked whole before anything is
  /// allocated: the kernel is this executor's, one argument per parameter, an array (usable,
  /// this executor's, of the declared dtype) for each in/out/inout parameter and a scalar for
  /// each scalar one, no array the kernel writes (out, inout) overlapping another argument.
  /// Errors: invalid_usage (site "launch") naming the kernel and the parameter; then those of
  /// KernelLauncher::launch: out_of_memory (oom_source device_heap) when kiln_heap_allocate ran
  /// the heap dry, error for a failed kiln_assert (its message and element index), device_lost.
  /// Zero elements: nothing runs. Thread-safe (launches are serialized).
  [[nodiscard]] RhiStatus launch(const UserKernel &kernel, std::span<const KernelArg> args,
                                 std::optional<uint64_t> count = std::nullopt);

  [[nodiscard]] LlvmDevice &device() const { return *context_->device; }
  /// The device and its memory; they outlive the executor while this (or an array) is held.
  [[nodiscard]] std::shared_ptr<DeviceContext> context() const { return context_; }
  [[nodiscard]] runtime::DeviceMemory &memory() const { return *context_->memory; }
  [[nodiscard]] const ExecutorConfig &config() const { return config_; }
  [[nodiscard]] Program &program() const { return *program_; }
  /// CPU threads a launch runs on (ExecutorConfig::num_threads, or all cores when 0).
  [[nodiscard]] unsigned worker_threads() const;
  /// Arms `spec` on memory().fault_plan() (replacing its setting, as RequestFaultPlan::arm), after
  /// check_fault_kernel, which also accepts the entry of every user kernel made on this executor
  /// so far. Errors: invalid_usage from check_fault_kernel; nothing is armed then.
  [[nodiscard]] RhiStatus arm_fault(const runtime::FaultSpec &spec);
  /// check_fault_kernel(spec) with the entries of the user kernels made on this executor so far.
  /// Errors: invalid_usage. Thread-safe.
  [[nodiscard]] RhiStatus check_fault(const runtime::FaultSpec &spec) const;
  /// Records the entry of a user kernel made on this executor (UserKernel::create), so that a
  /// fault spec may name it (kernel=NAME). Thread-safe.
  void remember_user_kernel(const std::string &entry);
  /// Whether `a` can be used by `op` here: not freed, not default-constructed, made by this
  /// executor. Touches no memory; callers check with it before they allocate for a call.
  /// Errors: invalid_usage.
  [[nodiscard]] RhiStatus check_usable(const char *op, const Ndarray &a) const;

 private:
  LlvmRuntimeExecutor(ExecutorConfig config, std::shared_ptr<DeviceContext> context,
                      std::shared_ptr<Program> program);
  [[nodiscard]] static RhiExpected<std::unique_ptr<LlvmRuntimeExecutor>> create_unguarded(
      ExecutorConfig config, std::shared_ptr<Program> program);
  [[nodiscard]] RhiStatus init_runtime();
  /// A new array's state on this executor, its shape checked (no memory yet). Errors:
  /// invalid_usage for a bad shape.
  [[nodiscard]] RhiExpected<std::shared_ptr<Ndarray::State>> new_array_state(
      DataType dtype, std::span<const int64_t> shape);
  [[nodiscard]] RhiStatus check_same(const char *op, const Ndarray &a, const Ndarray &b) const;

  ExecutorConfig config_;
  std::shared_ptr<DeviceContext> context_;
  std::shared_ptr<Program> program_;
  bool code_charged_ = false;
  // What init_runtime allocated in one group, freed by the destructor after the launcher: the
  // KilnRuntime, the launcher's argument and result buffers, and the heap chunk if any.
  std::vector<DeviceAllocation> runtime_allocs_;
  std::optional<DeviceAllocation> heap_alloc_;  // the device heap chunk, if any (in runtime_allocs_)
  std::optional<uint64_t> module_;  // GPU devices: the loaded code object
  std::unique_ptr<KernelLauncher> launcher_;
  // A compaction's launch and its copy-out from the heap (made anew in a forked child).
  ForkSafeMutex compact_mutex_{ForkSafeMutex::Policy::reset_in_child};
  // The entries of the user kernels made here (remember_user_kernel), for arm_fault.
  mutable ForkSafeMutex user_kernels_mutex_{ForkSafeMutex::Policy::reset_in_child};
  std::vector<std::string> user_kernel_names_;
};

/// Success when `spec.kernel` is empty or names a kernel of the device runtime module (an op,
/// "axpy", or a kernel, "kiln_axpy_f32"; see FaultSpec::kernel_named) or one of `user_kernels`
/// (entries of user kernels). Errors: invalid_usage (site check_fault_kernel) naming the spec's
/// kernel and the ops there are. Thread-safe (pure).
[[nodiscard]] RhiStatus check_fault_kernel(const runtime::FaultSpec &spec,
                                           std::span<const std::string> user_kernels = {});

/// Replaces `executor` (may be null) with a new one for `config`. When the old executor's device
/// is lost, the old executor is released BEFORE the new one is made: a lost device recovers only
/// once every user of its driver context has let go (CUDA destroys the primary context on its
/// last release; HIP's device is reset then). Arrays of the old executor that are still live
/// (not freed) keep that context: the new executor then fails with device_lost and a context
/// line saying so; free or drop them and call again. Otherwise the new executor is made first and
/// the old one kept if that fails. On failure `executor` is null or the old executor, as said.
/// Errors: those of LlvmRuntimeExecutor::create.
[[nodiscard]] RhiStatus recreate_executor(std::unique_ptr<LlvmRuntimeExecutor> &executor,
                                          ExecutorConfig config);

/// The context line recreate_executor adds when arrays of a lost executor still hold its device.
inline constexpr const char *kLostContextStillHeld =
    "arrays of the executor whose device was lost still hold its driver context: free or drop "
    "them, then make the executor again";

}  // namespace kiln

#endif  // KILN_EXECUTOR_EXECUTOR_H_
