// link_math_library (math_library.h), find_libdevice (ptx_codegen.h), find_ocml
// (amdgcn_codegen.h): library-math intrinsics of a user module become calls of a vendor math
// library, linked in.
#include "math_library.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <llvm/IR/Constants.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/IntrinsicInst.h>
#include <llvm/IRReader/IRReader.h>
#include <llvm/Linker/Linker.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/SourceMgr.h>

#include "kiln/runtime/amdgcn_codegen.h"
#include "kiln/runtime/ptx_codegen.h"

namespace kiln::runtime {
namespace {

constexpr const char *kSite = "link_math_library";

/// The base names of the math intrinsics the libraries supply.
struct Mapping {
  llvm::Intrinsic::ID id;
  std::string_view name;
};
constexpr Mapping kMappings[] = {
    {llvm::Intrinsic::exp, "exp"},     {llvm::Intrinsic::exp2, "exp2"},   {llvm::Intrinsic::exp10, "exp10"},
    {llvm::Intrinsic::log, "log"},     {llvm::Intrinsic::log2, "log2"},   {llvm::Intrinsic::log10, "log10"},
    {llvm::Intrinsic::sin, "sin"},     {llvm::Intrinsic::cos, "cos"},     {llvm::Intrinsic::tan, "tan"},
    {llvm::Intrinsic::asin, "asin"},   {llvm::Intrinsic::acos, "acos"},   {llvm::Intrinsic::atan, "atan"},
    {llvm::Intrinsic::sinh, "sinh"},   {llvm::Intrinsic::cosh, "cosh"},   {llvm::Intrinsic::tanh, "tanh"},
    {llvm::Intrinsic::pow, "pow"}};

/// The library's name for an intrinsic: "__nv_expf" / "__nv_exp" (libdevice), "__ocml_exp_f32" /
/// "__ocml_exp_f64" (ocml); empty for anything else.
std::string library_name(const llvm::Function &intrinsic, DeviceMath target) {
  const llvm::Type *type = intrinsic.getReturnType();
  if (!type->isFloatTy() && !type->isDoubleTy()) return {};
  const bool f32 = type->isFloatTy();
  for (const Mapping &m : kMappings) {
    if (m.id != intrinsic.getIntrinsicID()) continue;
    return target == DeviceMath::nvptx ? fmt::format("__nv_{}{}", m.name, f32 ? "f" : "")
                                       : fmt::format("__ocml_{}_{}", m.name, f32 ? "f32" : "f64");
  }
  return {};
}

const char *library_title(DeviceMath target) {
  return target == DeviceMath::nvptx ? "CUDA's libdevice" : "ROCm's ocml";
}

/// The file's bytes, read once per path and process (the libraries are under 1 MB and never
/// change).
RhiExpected<std::shared_ptr<const std::string>> file_bytes(const std::string &path, DeviceMath target,
                                                           const char *device) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const std::string>> read;
  const std::lock_guard lock(mutex);
  if (const auto it = read.find(path); it != read.end()) return it->second;
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buffer)
    return std::unexpected(make_failure(
        RhiResult::not_supported, device, kSite,
        fmt::format("cannot read {} at {}: {} ({} names the file to link, or none)", library_title(target), path,
                    buffer.getError().message(), target == DeviceMath::nvptx ? "KILN_LIBDEVICE" : "KILN_OCML")));
  auto bytes = std::make_shared<const std::string>((*buffer)->getBuffer().str());
  read.emplace(path, bytes);
  return bytes;
}

/// $variable when set ("none": nullopt), else the first of `candidates` that exists.
std::optional<std::string> find_file(const char *variable, std::vector<std::string> candidates) {
  if (const char *chosen = std::getenv(variable)) {
    if (std::string_view(chosen) == "none") return std::nullopt;
    return std::string(chosen);
  }
  for (const std::string &path : candidates)
    if (llvm::sys::fs::exists(path)) return path;
  return std::nullopt;
}

/// The candidates under the roots named by `variables`, then the fixed paths.
std::vector<std::string> under_roots(std::initializer_list<const char *> variables, std::string_view tail,
                                     std::initializer_list<const char *> fixed) {
  std::vector<std::string> candidates;
  for (const char *variable : variables)
    if (const char *root = std::getenv(variable); root != nullptr && *root != '\0')
      candidates.push_back(std::string(root) + std::string(tail));
  candidates.insert(candidates.end(), fixed.begin(), fixed.end());
  return candidates;
}

/// __oclc_ISA_version for a gfx processor: major * 1000 + minor * 100 + stepping, the last two
/// characters being minor and stepping in hex ("gfx90a" -> 9010, "gfx1100" -> 11000); 0 if not
/// of that form.
uint32_t isa_version(std::string_view gfx) {
  if (!gfx.starts_with("gfx") || gfx.size() < 6) return 0;
  const std::string_view digits = gfx.substr(3);
  const auto hex = [](char c) { return c >= 'a' ? c - 'a' + 10 : c - '0'; };
  const uint32_t major = static_cast<uint32_t>(std::stoul(std::string(digits.substr(0, digits.size() - 2))));
  return major * 1000 + hex(digits[digits.size() - 2]) * 100 + hex(digits.back());
}

/// Gives ocml's oclc control constants their values (they are declarations in ocml.bc, defined
/// by the oclc_*.bc files a ROCm compiler links), internal to the module.
void define_oclc_controls(llvm::Module &ocml, std::string_view gfx) {
  for (llvm::GlobalVariable &g : ocml.globals()) {
    if (!g.isDeclaration() || !g.getName().starts_with("__oclc_")) continue;
    const std::string_view name(g.getName().data(), g.getName().size());
    uint64_t value = 0;  // daz_opt, finite_only_opt, unsafe_math_opt: off
    if (name == "__oclc_correctly_rounded_sqrt32") value = 1;
    if (name == "__oclc_ISA_version") value = isa_version(gfx);
    if (name == "__oclc_wavefrontsize64") value = gfx.starts_with("gfx9") ? 1 : 0;
    if (name == "__oclc_ABI_version") value = 500;
    g.setInitializer(llvm::ConstantInt::get(g.getValueType(), value));
    g.setConstant(true);
    g.setLinkage(llvm::GlobalValue::InternalLinkage);
  }
}

}  // namespace

std::optional<std::string> find_libdevice() {
  return find_file("KILN_LIBDEVICE",
                   under_roots({"CUDA_HOME", "CUDA_PATH"}, "/nvvm/libdevice/libdevice.10.bc",
                               {"/usr/local/cuda/nvvm/libdevice/libdevice.10.bc",
                                "/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc"}));
}

std::optional<std::string> find_ocml() {
  return find_file("KILN_OCML", under_roots({"ROCM_PATH"}, "/amdgcn/bitcode/ocml.bc",
                                            {"/opt/rocm/amdgcn/bitcode/ocml.bc",
                                             "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode/ocml.bc"}));
}

RhiStatus link_math_library(llvm::Module &module, DeviceMath target, std::string_view gfx, const char *device) {
  std::vector<std::pair<llvm::Function *, std::string>> replaced;  // intrinsic, library function
  for (llvm::Function &f : module)
    if (f.isIntrinsic() && !f.use_empty())
      if (std::string name = library_name(f, target); !name.empty()) replaced.emplace_back(&f, std::move(name));
  if (replaced.empty()) return {};
  const std::optional<std::string> path = target == DeviceMath::nvptx ? find_libdevice() : find_ocml();
  if (!path) return {};  // check_device_math refuses the module, saying how to name a library
  KILN_ASSIGN_OR_RETURN(const std::shared_ptr<const std::string> bytes, file_bytes(*path, target, device));
  llvm::SMDiagnostic diagnostic;
  std::unique_ptr<llvm::Module> library = llvm::parseIR(llvm::MemoryBufferRef(*bytes, *path), diagnostic,
                                                        module.getContext());
  if (!library)
    return std::unexpected(make_failure(RhiResult::not_supported, device, kSite,
                                        fmt::format("{} at {} does not parse: {}", library_title(target), *path,
                                                    diagnostic.getMessage().str())));
  for (const auto &[intrinsic, name] : replaced) {
    const llvm::Function *definition = library->getFunction(name);
    if (definition == nullptr || definition->isDeclaration())
      return std::unexpected(make_failure(RhiResult::not_supported, device, kSite,
                                          fmt::format("{} at {} has no {}", library_title(target), *path, name)));
    llvm::FunctionCallee callee = module.getOrInsertFunction(name, intrinsic->getFunctionType());
    for (llvm::User *user : llvm::make_early_inc_range(intrinsic->users())) {
      auto *call = llvm::cast<llvm::CallInst>(user);
      std::vector<llvm::Value *> args(call->arg_begin(), call->arg_end());
      auto *replacement = llvm::CallInst::Create(callee, args, "", call->getIterator());
      replacement->copyMetadata(*call);
      call->replaceAllUsesWith(replacement);
      call->eraseFromParent();
    }
  }
  if (target == DeviceMath::amdgcn) define_oclc_controls(*library, gfx);
  library->setTargetTriple(module.getTargetTriple());
  library->setDataLayout(module.getDataLayout());
  if (llvm::Linker::linkModules(module, std::move(library), llvm::Linker::Flags::LinkOnlyNeeded))
    return std::unexpected(make_failure(RhiResult::error, device, kSite,
                                        fmt::format("could not link {} at {}", library_title(target), *path)));
  return {};
}

}  // namespace kiln::runtime
