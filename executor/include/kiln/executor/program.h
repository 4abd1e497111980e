// Program: the kernels of the device runtime module, compiled for one code-generation arch.
#ifndef KILN_EXECUTOR_PROGRAM_H_
#define KILN_EXECUTOR_PROGRAM_H_

#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>

#include "kiln/rhi/result.h"
#include "kiln/runtime/kernel_abi.h"

namespace kiln {

namespace runtime {
class CpuJit;
}

/// Where a Program's code runs.
enum class CodegenArch : uint8_t { host, nvptx64, amdgcn };

/// JIT-compiled kernels for one arch. Device-independent: executors share it and each charges
/// code_size_bytes() to its own ledger as code_object. Thread-safe.
class Program {
 public:
  /// Compiles the runtime module for `arch`. Errors: not_supported (arch without a code path on
  /// this build), error (LLVM failed; the detail says how).
  [[nodiscard]] static RhiExpected<std::shared_ptr<Program>> create(CodegenArch arch);
  /// The process-wide host Program, compiled on first use. Errors: as create.
  [[nodiscard]] static RhiExpected<std::shared_ptr<Program>> shared_host();
  ~Program();

  [[nodiscard]] CodegenArch arch() const { return arch_; }
  /// The kernel "kiln_<op>_<dtype>". Errors: invalid_usage naming an unknown kernel.
  [[nodiscard]] RhiExpected<KilnKernelFn> kernel(std::string_view name);
  /// Bytes of compiled code (charged to each executor's ledger as code_object).
  [[nodiscard]] uint64_t code_size_bytes() const;

 private:
  Program(CodegenArch arch, std::unique_ptr<runtime::CpuJit> jit);
  CodegenArch arch_;
  std::unique_ptr<runtime::CpuJit> jit_;
  std::mutex mutex_;
  std::unordered_map<std::string, KilnKernelFn> kernels_;
};

}  // namespace kiln

#endif  // KILN_EXECUTOR_PROGRAM_H_
