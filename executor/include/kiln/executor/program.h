// Program: the kernels of the device runtime module, compiled for one code-generation arch.
#ifndef KILN_EXECUTOR_PROGRAM_H_
#define KILN_EXECUTOR_PROGRAM_H_

#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "kiln/rhi/fork_hooks.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/kernel_abi.h"

namespace kiln {

namespace runtime {
class CpuJit;
}

/// Where a Program's code runs.
enum class CodegenArch : uint8_t { host, nvptx64, amdgcn };

/// The kernels for one arch: JIT-compiled host code, or a code image (PTX text, HSACO ELF) that a
/// GPU device loads. Device-independent: executors share it, and each charges code_size_bytes() to its own
/// ledger as code_object. Thread-safe.
class Program {
 public:
  /// Compiles the runtime module for `arch` and `target`, the processor it will run on:
  ///   host: LLJIT for this CPU; `target` must be empty.
  ///   nvptx64: PTX for an SM version, "sm_<digits>" (empty: sm_80). The PTX targets the newest
  ///     SM version this LLVM knows that is not newer than `target` (sm_90 for sm_100), which
  ///     the driver JIT-compiles for the device; see runtime::generate_ptx.
  ///   amdgcn: the prebuilt HSACO for a gfx processor such as "gfx942" (a feature suffix,
  ///     ":sramecc+:xnack-", is ignored; empty: the first of KILN_AMDGPU_TARGETS built, gfx90a).
  /// The executor passes its device's GpuDevice::code_target(). Errors: not_supported (arch or
  /// target without a code path in this build; the detail lists the gfx targets built),
  /// invalid_usage (a target for host, or one that is not an SM version for nvptx64), error
  /// (LLVM failed; the detail says how), out_of_memory with oom_source host (the host has no
  /// room to compile: checked before LLVM runs, and a std::bad_alloc or LLVM out-of-memory
  /// report while it runs).
  [[nodiscard]] static RhiExpected<std::shared_ptr<Program>> create(CodegenArch arch,
                                                                    std::string_view target = {});
  /// The process-wide Program for `arch` and `target`, made on first use. Errors: as create.
  [[nodiscard]] static RhiExpected<std::shared_ptr<Program>> shared(CodegenArch arch,
                                                                    std::string_view target = {});
  [[nodiscard]] static RhiExpected<std::shared_ptr<Program>> shared_host() { return shared(CodegenArch::host); }
  ~Program();

  [[nodiscard]] CodegenArch arch() const { return arch_; }
  /// The processor the code is for: the PTX's `.target` ("sm_90"; for sm_100 requested, sm_90,
  /// the newest LLVM 19 writes), the code object's gfx processor ("gfx942"); empty for host.
  [[nodiscard]] const std::string &target() const { return target_; }
  /// Whether this code runs on a GPU whose GpuDevice::code_target() is `device_target`: PTX of an
  /// SM version up to the device's (the driver compiles older PTX for newer GPUs), a code object
  /// of exactly that gfx processor. Always true for host programs.
  [[nodiscard]] bool runs_on(std::string_view device_target) const;
  /// Host programs: the kernel "kiln_<op>_<dtype>". Errors: invalid_usage naming an unknown
  /// kernel, or not_supported for a GPU program (its kernels run on the device).
  [[nodiscard]] RhiExpected<KilnKernelFn> kernel(std::string_view name);
  /// Whether "kiln_<op>_<dtype>" exists in this program.
  [[nodiscard]] bool has_kernel(std::string_view name);
  /// GPU programs: the code image a device loads (PTX text, NUL-terminated; or an HSACO ELF
  /// image). Empty for host.
  [[nodiscard]] std::span<const std::byte> code_image() const;
  /// Bytes of compiled code (charged to each executor's ledger as code_object).
  [[nodiscard]] uint64_t code_size_bytes() const;

 private:
  [[nodiscard]] static RhiExpected<std::shared_ptr<Program>> create_unguarded(CodegenArch arch,
                                                                              std::string_view target);
  Program(CodegenArch arch, std::string target, std::unique_ptr<runtime::CpuJit> jit,
          std::string image, std::set<std::string, std::less<>> gpu_kernels);
  CodegenArch arch_;
  std::string target_;
  std::unique_ptr<runtime::CpuJit> jit_;
  std::string image_;                  // GPU code image (PTX: NUL included)
  std::set<std::string, std::less<>> gpu_kernels_;  // "kiln_axpy_f32" for each "_gpu" entry
  // Guards kernels_ and the JIT's lookups; held across fork() so no lookup is cut in half.
  ForkSafeMutex mutex_{ForkSafeMutex::Policy::hold_across_fork};
  std::unordered_map<std::string, KilnKernelFn> kernels_;
};

}  // namespace kiln

#endif  // KILN_EXECUTOR_PROGRAM_H_
