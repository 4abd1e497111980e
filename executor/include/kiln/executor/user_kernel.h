// UserKernel: a kernel of the user's own, from LLVM IR (kernel_abi.h's user-kernel ABI),
// compiled for one executor's device and launched by LlvmRuntimeExecutor::launch through the
// same launcher as the built-in ops, with the same promises: everything checked before anything
// is allocated, the code charged to the ledger as code_object while the kernel lives, a heap
// exhaustion, an assertion or a lost device reported as a named failure naming the kernel.
//
// This build compiles user kernels for the host (cpu, mock) and for CUDA (PTX, loaded as the
// kernel's own module; on amdgpu an HSACO linked at run time).
#ifndef KILN_EXECUTOR_USER_KERNEL_H_
#define KILN_EXECUTOR_USER_KERNEL_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/executor/dtype.h"
#include "kiln/executor/ndarray.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/kernel_abi.h"
#include "kiln/runtime/user_kernel_abi.h"

namespace kiln {

class LlvmRuntimeExecutor;
struct DeviceContext;

namespace runtime {
class CpuJit;
}

/// How a kernel uses a parameter: an array it reads (in), writes (out) or both (inout), or a
/// scalar value.
enum class ParamKind : uint8_t { in, out, inout, scalar };

/// "in", "out", "inout", "scalar".
[[nodiscard]] const char *to_string(ParamKind kind);

/// One declared parameter of a user kernel. An array parameter is a `ptr` to its first element
/// in the IR, a scalar one the dtype's LLVM type (f32 float, f64 double, i32, i64).
struct KernelParam {
  std::string name;  ///< for messages: "x"
  ParamKind kind = ParamKind::in;
  DataType dtype = DataType::f32;
  /// An array the kernel gets whole and indexes itself (CuPy's `raw`): any shape, any element
  /// count. Otherwise an array has one element per index of the launch.
  bool raw = false;
};

/// One argument of a launch: an array (for in, out and inout parameters) or a scalar. A scalar
/// for an integer dtype is Scalar::i64 (truncated to 32 bits for i32), for a floating one
/// Scalar::f64 (rounded to float for f32).
struct KernelArg {
  const Ndarray *array = nullptr;  ///< not owned: lives through the launch
  Scalar scalar{};
  [[nodiscard]] static KernelArg of(const Ndarray &a) { return KernelArg{&a, {}}; }
  [[nodiscard]] static KernelArg of(Scalar s) { return KernelArg{nullptr, s}; }
};

/// A user kernel compiled for one executor's device. Immutable after create; thread-safe to
/// launch from several threads (launches are serialized by the executor's launcher). It keeps
/// its executor's device and memory alive (the code stays charged to that memory until the
/// kernel is destroyed).
class UserKernel {
 public:
  /// Compiles element function `entry` of `ir` (LLVM IR text or bitcode) whose parameters after
  /// the context are `params`, for `executor`'s device, and charges its code to the executor's
  /// memory as code_object. Everything is checked before anything is charged.
  /// Errors: invalid_usage (site "user kernel") for an IR that does not parse (line and
  /// column), does not verify, lacks `entry`, has a signature other than void(ptr, params...),
  /// calls what kiln does not provide; for an empty or non-identifier entry, an empty or
  /// repeated parameter name, more than KILN_MAX_USER_PARAMS parameters, or an invalid dtype;
  /// not_supported on amdgpu when this kiln cannot make HSACO at run time (no AMDGPU target or
  /// no lld: runtime::can_generate_hsaco) or has no code object for the device's processor, and
  /// on a GPU for library math (exp, tanh, ...) when its vendor library is not found (CUDA's
  /// libdevice: runtime::find_libdevice; ROCm's ocml: runtime::find_ocml); those of
  /// GpuDevice::load_module on a GPU (the driver refused the PTX or HSACO);
  /// out_of_memory when the code does not fit the budget (budget, category code_object) or the
  /// host has no room to compile (oom_source host); error when LLVM or lld fails otherwise, or a
  /// temporary file for lld cannot be written.
  [[nodiscard]] static RhiExpected<std::shared_ptr<UserKernel>> create(
      LlvmRuntimeExecutor &executor, std::span<const std::byte> ir, std::string entry,
      std::vector<KernelParam> params);
  ~UserKernel();
  UserKernel(const UserKernel &) = delete;
  UserKernel &operator=(const UserKernel &) = delete;

  [[nodiscard]] const std::string &entry() const { return entry_; }
  [[nodiscard]] std::span<const KernelParam> params() const { return params_; }
  /// Bytes of compiled code, charged as code_object while the kernel lives.
  [[nodiscard]] uint64_t code_size_bytes() const { return code_size_bytes_; }
  /// "square_diff(in f32 x, in f32 y, out f32 z)": the kernel as messages name it.
  [[nodiscard]] std::string describe() const;
  /// The range kernel (KilnKernelFn) that runs the element function over [begin, end); null on
  /// a GPU.
  [[nodiscard]] KilnKernelFn range_kernel() const { return range_kernel_; }
  /// A GPU's module holding runtime::kUserGpuEntryName (GpuDevice::load_module); nullopt on the
  /// host.
  [[nodiscard]] std::optional<uint64_t> gpu_module() const { return gpu_module_; }
  /// CPU launches: the fewest indices one task runs (the range split). Kernels whose index does
  /// much work (a reduction's partial) set it low so a launch of few indices still spreads over
  /// the worker threads. Default kDefaultMinElementsPerTask.
  [[nodiscard]] int64_t min_indices_per_task() const { return min_indices_per_task_; }
  /// Sets it (at least 1); only before the kernel is shared with other threads.
  void set_min_indices_per_task(int64_t indices) { min_indices_per_task_ = indices < 1 ? 1 : indices; }
  /// The device context the kernel was compiled for: it launches only on that executor's.
  [[nodiscard]] const std::shared_ptr<DeviceContext> &context() const { return context_; }

 private:
  UserKernel(std::shared_ptr<DeviceContext> context, std::string entry, std::vector<KernelParam> params,
             std::unique_ptr<runtime::CpuJit> jit, KilnKernelFn range_kernel);
  /// create() on a GPU: the code image (PTX from runtime::generate_user_ptx on CUDA, an HSACO
  /// from runtime::generate_user_hsaco on AMDGPU), charged, then loaded.
  [[nodiscard]] static RhiExpected<std::shared_ptr<UserKernel>> create_for_gpu(
      LlvmRuntimeExecutor &executor, std::span<const std::byte> ir, std::string entry,
      std::vector<KernelParam> params, std::span<const runtime::UserValueType> types);

  std::shared_ptr<DeviceContext> context_;
  std::string entry_;
  std::vector<KernelParam> params_;
  std::unique_ptr<runtime::CpuJit> jit_;
  KilnKernelFn range_kernel_ = nullptr;
  uint64_t code_size_bytes_ = 0;
  bool charged_ = false;
  std::optional<uint64_t> gpu_module_;  // unloaded by the destructor
  int64_t min_indices_per_task_ = 1 << 16;  // kDefaultMinElementsPerTask (launcher.h)
};

}  // namespace kiln

#endif  // KILN_EXECUTOR_USER_KERNEL_H_
