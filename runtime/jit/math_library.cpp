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
#include <llvm/TargetParser/TargetParser.h>

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
  if (!type->isFloatTy() && !type->isDoubleTy()) return {};  // vectors: check_device_math refuses them
  if (lowered_natively(intrinsic.getIntrinsicID(), *type, target)) return {};  // the back end's own
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

/// The files to try: $variable alone when set and not empty ("none": none), else those of
/// `candidates` that exist, in order.
std::vector<std::string> existing_files(const char *variable, const std::vector<std::string> &candidates) {
  if (const char *chosen = std::getenv(variable); chosen != nullptr && *chosen != '\0') {
    if (std::string_view(chosen) == "none") return {};
    return {chosen};
  }
  std::vector<std::string> found;
  for (const std::string &path : candidates)
    if (llvm::sys::fs::exists(path)) found.push_back(path);
  return found;
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

/// __oclc_ISA_version for a gfx processor LLVM knows: major * 1000 + minor * 100 + stepping
/// (LLVM's AMDGPU::getIsaVersion, as clang writes the oclc_isa_version_*.bc it links).
uint32_t isa_version(std::string_view gfx) {
  const llvm::AMDGPU::IsaVersion isa = llvm::AMDGPU::getIsaVersion(gfx);
  return isa.Major * 1000 + isa.Minor * 100 + isa.Stepping;
}

/// Gives ocml's oclc control constants their values (they are declarations in ocml.bc, defined
/// by the oclc_*.bc files a ROCm compiler links), internal to the module. Errors: not_supported
/// for a control this code does not know (a newer ocml): its value is never guessed.
RhiStatus define_oclc_controls(llvm::Module &ocml, std::string_view gfx, const std::string &path, const char *device) {
  const llvm::AMDGPU::GPUKind kind = llvm::AMDGPU::parseArchAMDGCN(gfx);
  const bool wave32 = (llvm::AMDGPU::getArchAttrAMDGCN(kind) & llvm::AMDGPU::FEATURE_WAVE32) != 0;  // gfx10+
  for (llvm::GlobalVariable &g : ocml.globals()) {
    if (!g.isDeclaration() || !g.getName().starts_with("__oclc_")) continue;
    const std::string_view name(g.getName().data(), g.getName().size());
    uint64_t value = 0;  // daz_opt, finite_only_opt, unsafe_math_opt: off
    if (name == "__oclc_correctly_rounded_sqrt32") value = 1;
    else if (name == "__oclc_ISA_version") value = isa_version(gfx);
    else if (name == "__oclc_wavefrontsize64") value = wave32 ? 0 : 1;  // kiln compiles for the default
    else if (name == "__oclc_ABI_version") value = 500;  // code object v5
    else if (name != "__oclc_daz_opt" && name != "__oclc_finite_only_opt" && name != "__oclc_unsafe_math_opt")
      return std::unexpected(make_failure(RhiResult::not_supported, device, kSite,
                                          fmt::format("ROCm's ocml at {} reads {}, whose value kiln does not know",
                                                      path, name)));
    g.setInitializer(llvm::ConstantInt::get(g.getValueType(), value));
    g.setConstant(true);
    g.setLinkage(llvm::GlobalValue::InternalLinkage);
  }
  return {};
}

std::vector<std::string> libdevice_files() {
  return existing_files("KILN_LIBDEVICE", under_roots({"CUDA_HOME", "CUDA_PATH"}, "/nvvm/libdevice/libdevice.10.bc",
                                                      {"/usr/local/cuda/nvvm/libdevice/libdevice.10.bc",
                                                       "/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc"}));
}

std::vector<std::string> ocml_files() {
  return existing_files("KILN_OCML", under_roots({"ROCM_PATH"}, "/amdgcn/bitcode/ocml.bc",
                                                 {"/opt/rocm/amdgcn/bitcode/ocml.bc",
                                                  "/usr/lib/x86_64-linux-gnu/amdgcn/bitcode/ocml.bc"}));
}

/// The first of `files` that reads and parses, or not_supported naming each file and why.
RhiExpected<std::pair<std::unique_ptr<llvm::Module>, std::string>> parse_first(const std::vector<std::string> &files,
                                                                              DeviceMath target,
                                                                              llvm::LLVMContext &context,
                                                                              const char *device) {
  std::string why;
  for (const std::string &path : files) {
    auto bytes = file_bytes(path, target, device);
    if (!bytes) {
      why += (why.empty() ? "" : "; ") + bytes.error().detail;
      continue;
    }
    llvm::SMDiagnostic diagnostic;
    std::unique_ptr<llvm::Module> library = llvm::parseIR(llvm::MemoryBufferRef(**bytes, path), diagnostic, context);
    if (library) return std::pair{std::move(library), path};
    why += fmt::format("{}{} at {} does not parse: {}", why.empty() ? "" : "; ", library_title(target), path,
                       diagnostic.getMessage().str());
  }
  return std::unexpected(make_failure(RhiResult::not_supported, device, kSite, why));
}

}  // namespace

std::optional<std::string> find_libdevice() {
  std::vector<std::string> files = libdevice_files();
  return files.empty() ? std::nullopt : std::optional(std::move(files.front()));
}

std::optional<std::string> find_ocml() {
  std::vector<std::string> files = ocml_files();
  return files.empty() ? std::nullopt : std::optional(std::move(files.front()));
}

RhiStatus link_math_library(llvm::Module &module, DeviceMath target, std::string_view gfx, const char *device) {
  std::vector<std::pair<llvm::Function *, std::string>> replaced;  // intrinsic, library function
  for (llvm::Function &f : module)
    if (f.isIntrinsic() && !f.use_empty())
      if (std::string name = library_name(f, target); !name.empty()) replaced.emplace_back(&f, std::move(name));
  if (replaced.empty()) return {};
  const std::vector<std::string> files = target == DeviceMath::nvptx ? libdevice_files() : ocml_files();
  if (files.empty()) return {};  // check_device_math refuses the module, saying how to name a library
  KILN_ASSIGN_OR_RETURN(auto parsed, parse_first(files, target, module.getContext(), device));
  std::unique_ptr<llvm::Module> library = std::move(parsed.first);
  const std::string *path = &parsed.second;
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
  if (target == DeviceMath::amdgcn) KILN_RETURN_IF_ERROR(define_oclc_controls(*library, gfx, *path, device));
  library->setTargetTriple(module.getTargetTriple());
  library->setDataLayout(module.getDataLayout());
  if (llvm::Linker::linkModules(module, std::move(library), llvm::Linker::Flags::LinkOnlyNeeded))
    return std::unexpected(make_failure(RhiResult::error, device, kSite,
                                        fmt::format("could not link {} at {}", library_title(target), *path)));
  return {};
}

}  // namespace kiln::runtime
