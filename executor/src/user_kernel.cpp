// UserKernel (user_kernel.h) and LlvmRuntimeExecutor::launch: a user's kernel compiled for the
// host, and its launches checked whole before anything is allocated.
#include "kiln/executor/user_kernel.h"

#include <bit>
#include <cctype>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "kiln/executor/executor.h"
#include "kiln/executor/launcher.h"
#include "kiln/runtime/cpu_jit.h"
#include "kiln/runtime/amdgcn_codegen.h"
#include "kiln/runtime/ptx_codegen.h"
#include "kiln/rhi/gpu_device.h"
#include "kiln/runtime/host_memory_guard.h"
#include "kiln/rhi/user_text.h"

namespace kiln {
namespace {

constexpr const char *kCreateSite = "UserKernel::create";

runtime::UserValueType value_type(const KernelParam &p) {
  if (p.kind != ParamKind::scalar) return runtime::UserValueType::ptr;
  switch (p.dtype) {
    case DataType::f32: return runtime::UserValueType::f32;
    case DataType::f64: return runtime::UserValueType::f64;
    case DataType::i32: return runtime::UserValueType::i32;
    case DataType::i64: return runtime::UserValueType::i64;
  }
  return runtime::UserValueType::i64;
}

bool is_identifier(std::string_view name) {
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name.front()))) return false;
  for (const char c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '.' && c != '$') return false;
  return true;
}

/// The declaration itself: an entry and parameter names that name something, once each.
RhiStatus check_declaration(const std::string &device, const std::string &entry,
                            std::span<const KernelParam> params) {
  if (!is_identifier(entry))
    return std::unexpected(invalid_usage(device, kCreateSite,
                                         fmt::format("the entry {} is not a function name (letters, digits, "
                                                     "'_', '.', '$'; not starting with a digit)",
                                                     quote_user_text(entry))));
  if (params.size() > KILN_MAX_USER_PARAMS)
    return std::unexpected(invalid_usage(device, kCreateSite,
                                         fmt::format("{} declares {} parameters; a user kernel has at most {}",
                                                     entry, params.size(), KILN_MAX_USER_PARAMS)));
  std::set<std::string_view> seen;
  for (const KernelParam &p : params) {
    if (p.raw && p.kind == ParamKind::scalar)
      return std::unexpected(invalid_usage(device, kCreateSite,
                                           fmt::format("parameter {} of {} is a scalar: only an array is raw",
                                                       quote_user_text(p.name), entry)));
    if (p.name.empty() || !seen.insert(p.name).second)
      return std::unexpected(invalid_usage(device, kCreateSite,
                                           fmt::format("parameter names of {} must be given and distinct, got "
                                                       "{} twice or empty",
                                                       entry, quote_user_text(p.name))));
    if (!is_valid(p.dtype) || static_cast<uint8_t>(p.kind) > static_cast<uint8_t>(ParamKind::scalar))
      return std::unexpected(invalid_usage(device, kCreateSite,
                                           fmt::format("parameter {} of {} has no valid kind or dtype",
                                                       p.name, entry)));
  }
  return {};
}

std::string describe_param(const KernelParam &p) {
  return fmt::format("{}{} {} {}", p.raw ? "raw " : "", to_string(p.kind), to_string(p.dtype), p.name);
}

/// args->user_args[k]'s bits for a scalar of `dtype` (f32 and i32 in the low 32 bits).
uint64_t scalar_bits(DataType dtype, Scalar s) {
  switch (dtype) {
    case DataType::f32: return std::bit_cast<uint32_t>(static_cast<float>(s.f64));
    case DataType::f64: return std::bit_cast<uint64_t>(s.f64);
    case DataType::i32: return static_cast<uint32_t>(static_cast<int32_t>(s.i64));
    case DataType::i64: return static_cast<uint64_t>(s.i64);
  }
  return 0;
}

}  // namespace

const char *to_string(ParamKind kind) {
  switch (kind) {
    case ParamKind::in: return "in";
    case ParamKind::out: return "out";
    case ParamKind::inout: return "inout";
    case ParamKind::scalar: return "scalar";
  }
  return "?";
}

UserKernel::UserKernel(std::shared_ptr<DeviceContext> context, std::string entry,
                       std::vector<KernelParam> params, std::unique_ptr<runtime::CpuJit> jit,
                       KilnKernelFn range_kernel)
    : context_(std::move(context)),
      entry_(std::move(entry)),
      params_(std::move(params)),
      jit_(std::move(jit)),
      range_kernel_(range_kernel),
      code_size_bytes_(jit_ ? jit_->code_size_bytes() : 0) {}

UserKernel::~UserKernel() {
  // A destructor cannot report: a refused unload leaves the module to the context's teardown.
  if (gpu_module_)
    ignore_result(static_cast<GpuDevice &>(*context_->device).unload_module(*gpu_module_),
                  "destructor; the module goes with the device's context");
  if (charged_) context_->memory->uncharge(MemoryCategory::code_object, code_size_bytes_);
}

std::string UserKernel::describe() const {
  std::string text = entry_ + "(";
  for (std::size_t i = 0; i < params_.size(); ++i) text += (i ? ", " : "") + describe_param(params_[i]);
  return text + ")";
}

RhiExpected<std::shared_ptr<UserKernel>> UserKernel::create(LlvmRuntimeExecutor &executor,
                                                            std::span<const std::byte> ir,
                                                            std::string entry,
                                                            std::vector<KernelParam> params) {
  const std::string device = executor.device().name();
  KILN_RETURN_IF_ERROR(check_declaration(device, entry, params));
  const CodegenArch arch = codegen_arch(executor.device());
  std::vector<runtime::UserValueType> types;
  for (const KernelParam &p : params) types.push_back(value_type(p));
  runtime::install_llvm_error_handlers();
  KILN_RETURN_IF_ERROR(runtime::check_host_headroom(device, kCreateSite, runtime::kJitHeadroomBytes));
  if (arch != CodegenArch::host) return create_for_gpu(executor, ir, std::move(entry), std::move(params), types);
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<runtime::CpuJit> jit,
                        runtime::guard_host_exceptions(device, kCreateSite, [&] {
                          return runtime::CpuJit::create_user(ir, entry, types, device.c_str());
                        }));
  KILN_ASSIGN_OR_RETURN(const KilnKernelFn fn, jit->lookup_kernel(runtime::kUserEntryName));
  std::shared_ptr<UserKernel> kernel(
      new UserKernel(executor.context(), std::move(entry), std::move(params), std::move(jit), fn));
  KILN_RETURN_IF_ERROR_CONTEXT(executor.memory().charge(MemoryCategory::code_object, kernel->code_size_bytes_),
                               "loading user kernel {}", kernel->entry_);
  kernel->charged_ = true;
  executor.remember_user_kernel(kernel->entry_);
  return kernel;
}

namespace {

/// The code image of a user kernel for `gpu`: PTX text with its NUL on CUDA, an HSACO on AMDGPU.
RhiExpected<std::vector<std::byte>> gpu_code_image(GpuDevice &gpu, CodegenArch arch, std::span<const std::byte> ir,
                                                   std::string_view entry,
                                                   std::span<const runtime::UserValueType> types) {
  const std::string device = gpu.name();
  if (arch == CodegenArch::amdgcn)
    return runtime::generate_user_hsaco(ir, entry, types, gpu.code_target(), device.c_str());
  KILN_ASSIGN_OR_RETURN(const std::string ptx,
                        runtime::generate_user_ptx(ir, entry, types, gpu.code_target(), device.c_str()));
  const auto *text = reinterpret_cast<const std::byte *>(ptx.c_str());
  return std::vector<std::byte>(text, text + ptx.size() + 1);  // the image the driver gets, NUL included
}

}  // namespace

RhiExpected<std::shared_ptr<UserKernel>> UserKernel::create_for_gpu(LlvmRuntimeExecutor &executor,
                                                                    std::span<const std::byte> ir, std::string entry,
                                                                    std::vector<KernelParam> params,
                                                                    std::span<const runtime::UserValueType> types) {
  const std::string device = executor.device().name();
  auto &gpu = static_cast<GpuDevice &>(executor.device());
  KILN_ASSIGN_OR_RETURN(const std::vector<std::byte> image, runtime::guard_host_exceptions(device, kCreateSite, [&] {
                          return gpu_code_image(gpu, codegen_arch(executor.device()), ir, entry, types);
                        }));
  std::shared_ptr<UserKernel> kernel(
      new UserKernel(executor.context(), std::move(entry), std::move(params), nullptr, nullptr));
  kernel->code_size_bytes_ = image.size();
  KILN_RETURN_IF_ERROR_CONTEXT(executor.memory().charge(MemoryCategory::code_object, kernel->code_size_bytes_),
                               "loading user kernel {}", kernel->entry_);
  kernel->charged_ = true;  // from here the destructor gives the charge back
  auto module = gpu.load_module(image);
  if (!module) {
    executor.memory().annotate(module.error());
    return std::unexpected(std::move(module).error().add_context("loading user kernel " + kernel->entry_));
  }
  kernel->gpu_module_ = *module;
  executor.remember_user_kernel(kernel->entry_);
  return kernel;
}

// --- launches ---------------------------------------------------------------------------------

RhiStatus LlvmRuntimeExecutor::launch(const UserKernel &kernel, std::span<const KernelArg> args,
                                      std::optional<uint64_t> count) {
  const char *site = "launch";
  const auto usage = [&](std::string detail) {
    return std::unexpected(invalid_usage(device().name(), site, fmt::format("{}: {}", kernel.describe(), detail)));
  };
  if (kernel.context() != context_)
    return usage("the kernel was compiled for another executor; make it for this one");
  const std::span<const KernelParam> params = kernel.params();
  if (args.size() != params.size())
    return usage(fmt::format("takes {} arguments, got {}", params.size(), args.size()));
  LaunchSpec spec;  // its arguments filled as they are checked; launched only once all pass
  std::optional<uint64_t> elements = count;
  struct Span { uint64_t begin, end; std::size_t arg; };
  std::vector<Span> arrays;
  for (std::size_t k = 0; k < params.size(); ++k) {
    const KernelParam &p = params[k];
    const KernelArg &a = args[k];
    if (p.kind == ParamKind::scalar) {
      if (a.array != nullptr) return usage(fmt::format("{} is a scalar parameter, got an array", p.name));
      spec.args.user_args[k] = scalar_bits(p.dtype, a.scalar);
      continue;
    }
    if (a.array == nullptr) return usage(fmt::format("{} is an array parameter, got a scalar", p.name));
    KILN_RETURN_IF_ERROR(check_usable(site, *a.array));
    if (a.array->dtype() != p.dtype)
      return usage(fmt::format("{} is declared {}, got the array {}", p.name, to_string(p.dtype),
                               a.array->describe()));
    KILN_ASSIGN_OR_RETURN(spec.args.user_args[k], a.array->device_address(site));
    arrays.push_back({spec.args.user_args[k], spec.args.user_args[k] + a.array->nbytes(), k});
    if (p.raw) continue;  // the kernel indexes it itself
    if (!elements) elements = a.array->num_elements();
    if (a.array->num_elements() != *elements)
      return usage(fmt::format("{} is the array {} of {} elements; the launch has {} (every array "
                               "argument has one element per index)",
                               p.name, a.array->describe(), a.array->num_elements(), *elements));
  }
  if (!elements) return usage("has no array argument: give the launch's element count");
  if (*elements > static_cast<uint64_t>(INT64_MAX))
    return usage(fmt::format("{} elements is beyond int64", *elements));
  for (const Span &w : arrays) {  // what a kernel writes overlaps no other argument
    if (params[w.arg].kind == ParamKind::in) continue;
    for (const Span &o : arrays)
      if (o.arg != w.arg && w.begin < o.end && o.begin < w.end && w.begin != w.end)
        return usage(fmt::format("{} ({}) overlaps {}: an array the kernel writes may not be another "
                                 "of its arguments",
                                 params[w.arg].name, to_string(params[w.arg].kind), params[o.arg].name));
  }
  if (*elements == 0) return {};
  spec.kernel = kernel.entry();
  spec.host_fn = kernel.range_kernel();
  spec.gpu_module = kernel.gpu_module();
  spec.args.num_elements = *elements;
  spec.iteration_size = static_cast<int64_t>(*elements);
  spec.min_elements_per_task = kernel.min_indices_per_task();
  KILN_ASSIGN_OR_RETURN(auto result, launcher_->launch(spec));
  return {};
}

}  // namespace kiln
