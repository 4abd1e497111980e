#include "kiln/executor/program.h"

#include <map>

#include <fmt/format.h>

#include "kiln/runtime/cpu_jit.h"
#include "kiln/runtime/elf_image.h"
#include "kiln/runtime/embedded_code.h"
#include "kiln/runtime/host_memory_guard.h"
#include "kiln/runtime/ptx_codegen.h"

namespace kiln {
namespace {

// The kernels a PTX image defines: every ".entry <name>_gpu", named without the suffix.
std::set<std::string, std::less<>> gpu_entry_points(std::string_view ptx) {
  std::set<std::string, std::less<>> names;
  constexpr std::string_view kEntry = ".entry ";
  constexpr std::string_view kSuffix = "_gpu";
  for (std::size_t pos = ptx.find(kEntry); pos != std::string_view::npos; pos = ptx.find(kEntry, pos + 1)) {
    const std::size_t begin = pos + kEntry.size();
    const std::size_t end = ptx.find_first_of("( \n", begin);
    std::string_view name = ptx.substr(begin, end - begin);
    if (name.ends_with(kSuffix)) names.emplace(name.substr(0, name.size() - kSuffix.size()));
  }
  return names;
}

/// The kernels an HSACO exports: every function symbol "<name>_gpu", named without the suffix.
RhiExpected<std::set<std::string, std::less<>>> hsaco_entry_points(std::span<const uint8_t> image,
                                                                   std::string_view target) {
  runtime::ElfImageInfo info;
  std::string error;
  if (!runtime::read_elf_image(std::as_bytes(image), &info, &error))
    return std::unexpected(make_failure(RhiResult::error, "amdgpu", "Program::create",
                                        fmt::format("the {} code object is unreadable: {}", target, error)));
  std::set<std::string, std::less<>> names;
  constexpr std::string_view kSuffix = "_gpu";
  for (std::string_view name : info.functions)
    if (name.ends_with(kSuffix)) names.emplace(name.substr(0, name.size() - kSuffix.size()));
  return names;
}

/// The `.target` of PTX text ("sm_90"), or "" if it has none.
std::string ptx_target(std::string_view ptx) {
  constexpr std::string_view kTarget = ".target ";
  const std::size_t at = ptx.find(kTarget);
  if (at == std::string_view::npos) return {};
  const std::size_t begin = at + kTarget.size();
  return std::string(ptx.substr(begin, ptx.find_first_of(", \t\r\n", begin) - begin));
}

}  // namespace

bool Program::runs_on(std::string_view device_target) const {
  switch (arch_) {
    case CodegenArch::host: return true;
    case CodegenArch::nvptx64: {
      const std::optional<int> device_sm = runtime::parse_sm_version(device_target);
      const std::optional<int> code_sm = runtime::parse_sm_version(target_);
      return device_sm && code_sm && *code_sm <= *device_sm;
    }
    case CodegenArch::amdgcn: return target_ == device_target.substr(0, device_target.find(':'));
  }
  return false;
}

Program::Program(CodegenArch arch, std::string target, std::unique_ptr<runtime::CpuJit> jit,
                 std::string image, std::set<std::string, std::less<>> gpu_kernels)
    : arch_(arch),
      target_(std::move(target)),
      jit_(std::move(jit)),
      image_(std::move(image)),
      gpu_kernels_(std::move(gpu_kernels)) {}

Program::~Program() = default;

RhiExpected<std::shared_ptr<Program>> Program::create(CodegenArch arch, std::string_view target) {
  // LLVM cannot fail cleanly when the host runs out of memory: make sure there is room first,
  // and turn what still escapes (std::bad_alloc, LLVM's reports) into named failures.
  runtime::install_llvm_error_handlers();
  if (arch != CodegenArch::amdgcn) {
    KILN_RETURN_IF_ERROR(
        runtime::check_host_headroom("kiln", "Program::create", runtime::kJitHeadroomBytes));
  }
  return runtime::guard_host_exceptions("kiln", "Program::create",
                                        [&] { return create_unguarded(arch, target); });
}

RhiExpected<std::shared_ptr<Program>> Program::create_unguarded(CodegenArch arch,
                                                                std::string_view target) {
  if (arch == CodegenArch::host && !target.empty())
    return std::unexpected(invalid_usage("kiln", "Program::create",
                                         fmt::format("a code target ('{}') is chosen only for a GPU", target)));
  switch (arch) {
    case CodegenArch::host: {
      KILN_ASSIGN_OR_RETURN(auto jit, runtime::CpuJit::create());
      return std::shared_ptr<Program>(new Program(arch, "", std::move(jit), "", {}));
    }
    case CodegenArch::nvptx64: {
      KILN_ASSIGN_OR_RETURN(std::string ptx, runtime::generate_ptx(target.empty() ? "sm_80" : target));
      auto kernels = gpu_entry_points(ptx);
      std::string written = ptx_target(ptx);  // sm_90 when sm_100 was asked for
      ptx.push_back('\0');
      return std::shared_ptr<Program>(
          new Program(arch, std::move(written), nullptr, std::move(ptx), std::move(kernels)));
    }
    case CodegenArch::amdgcn: {
      KILN_ASSIGN_OR_RETURN(const runtime::AmdgcnCodeObject object, runtime::amdgcn_code_object(target));
      KILN_ASSIGN_OR_RETURN(auto kernels, hsaco_entry_points(object.image, object.target));
      std::string image(reinterpret_cast<const char *>(object.image.data()), object.image.size());
      return std::shared_ptr<Program>(
          new Program(arch, std::string(object.target), nullptr, std::move(image), std::move(kernels)));
    }
  }
  return std::unexpected(make_failure(RhiResult::not_supported, "kiln", "Program::create",
                                      "unknown code-generation arch"));
}

RhiExpected<std::shared_ptr<Program>> Program::shared(CodegenArch arch, std::string_view target) {
  // Never destroyed: threads may still run kernels while the process exits. Made anew in a
  // forked child (a compile in flight makes a Program, whose mutex registers fork hooks, so it
  // cannot be held across the fork); the child compiles again what the parent had not finished.
  static auto *mutex = new ForkSafeMutex(ForkSafeMutex::Policy::reset_in_child);
  static auto *programs = new std::map<std::pair<CodegenArch, std::string>, std::shared_ptr<Program>>;
  std::lock_guard lock(*mutex);
  auto &program = (*programs)[{arch, std::string(target)}];
  if (!program) {
    KILN_ASSIGN_OR_RETURN(program, create(arch, target));
  }
  return program;
}

RhiExpected<KilnKernelFn> Program::kernel(std::string_view name) {
  if (!jit_)
    return std::unexpected(make_failure(RhiResult::not_supported, "kiln", "Program::kernel",
                                        "a GPU program's kernels run on its device, not the host"));
  std::lock_guard lock(mutex_);
  if (auto it = kernels_.find(std::string(name)); it != kernels_.end()) return it->second;
  // CpuJit::create compiled the module; a lookup still allocates (std::bad_alloc is named).
  return runtime::guard_host_exceptions("cpu", "Program::kernel", [&]() -> RhiExpected<KilnKernelFn> {
    KILN_ASSIGN_OR_RETURN(const KilnKernelFn fn, jit_->lookup_kernel(name));
    kernels_.emplace(std::string(name), fn);
    return fn;
  });
}

bool Program::has_kernel(std::string_view name) {
  if (!jit_) return gpu_kernels_.contains(name);
  return kernel(name).has_value();
}

std::span<const std::byte> Program::code_image() const {
  return std::as_bytes(std::span<const char>(image_.data(), image_.size()));
}

uint64_t Program::code_size_bytes() const { return jit_ ? jit_->code_size_bytes() : image_.size(); }

}  // namespace kiln
