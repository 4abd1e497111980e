#include "kiln/executor/program.h"

#include <fmt/format.h>

#include "kiln/runtime/cpu_jit.h"

namespace kiln {

Program::Program(CodegenArch arch, std::unique_ptr<runtime::CpuJit> jit)
    : arch_(arch), jit_(std::move(jit)) {}

Program::~Program() = default;

RhiExpected<std::shared_ptr<Program>> Program::create(CodegenArch arch) {
  if (arch != CodegenArch::host)
    return std::unexpected(make_failure(RhiResult::not_supported, "kiln", "Program::create",
                                        "only host code generation is built so far"));
  KILN_ASSIGN_OR_RETURN(auto jit, runtime::CpuJit::create());
  return std::shared_ptr<Program>(new Program(arch, std::move(jit)));
}

RhiExpected<std::shared_ptr<Program>> Program::shared_host() {
  static std::mutex mutex;
  static std::shared_ptr<Program> program;
  std::lock_guard lock(mutex);
  if (!program) {
    KILN_ASSIGN_OR_RETURN(program, create(CodegenArch::host));
  }
  return program;
}

RhiExpected<KilnKernelFn> Program::kernel(std::string_view name) {
  std::lock_guard lock(mutex_);
  if (auto it = kernels_.find(std::string(name)); it != kernels_.end()) return it->second;
  KILN_ASSIGN_OR_RETURN(const KilnKernelFn fn, jit_->lookup_kernel(name));
  kernels_.emplace(std::string(name), fn);
  return fn;
}

uint64_t Program::code_size_bytes() const { return jit_->code_size_bytes(); }

}  // namespace kiln
