// link_libdevice (libdevice.h): library-math intrinsics of a user module become calls of CUDA's
// libdevice, linked in.
#include "libdevice.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
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

namespace kiln::runtime {
namespace {

constexpr const char *kSite = "link_libdevice";

/// libdevice's name for a math intrinsic's base name ("exp" -> "__nv_exp"), float32 with "f".
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

/// "__nv_expf" for llvm.exp.f32, "__nv_exp" for llvm.exp.f64; empty for anything else.
std::string libdevice_name(const llvm::Function &intrinsic) {
  const llvm::Type *type = intrinsic.getReturnType();
  if (!type->isFloatTy() && !type->isDoubleTy()) return {};
  for (const Mapping &m : kMappings)
    if (m.id == intrinsic.getIntrinsicID()) return fmt::format("__nv_{}{}", m.name, type->isFloatTy() ? "f" : "");
  return {};
}

/// The file's bytes, read once per path and process (a libdevice is ~0.5 MB and never changes).
RhiExpected<std::shared_ptr<const std::string>> libdevice_bytes(const std::string &path, const char *device) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const std::string>> read;
  const std::lock_guard lock(mutex);
  if (const auto it = read.find(path); it != read.end()) return it->second;
  auto buffer = llvm::MemoryBuffer::getFile(path, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!buffer)
    return std::unexpected(make_failure(RhiResult::not_supported, device, kSite,
                                        fmt::format("cannot read CUDA's libdevice at {}: {} (KILN_LIBDEVICE names "
                                                    "the file to link, or none)",
                                                    path, buffer.getError().message())));
  auto bytes = std::make_shared<const std::string>((*buffer)->getBuffer().str());
  read.emplace(path, bytes);
  return bytes;
}

}  // namespace

std::optional<std::string> find_libdevice() {
  if (const char *chosen = std::getenv("KILN_LIBDEVICE")) {
    if (std::string_view(chosen) == "none") return std::nullopt;
    return std::string(chosen);
  }
  std::vector<std::string> candidates;
  for (const char *variable : {"CUDA_HOME", "CUDA_PATH"})
    if (const char *root = std::getenv(variable); root != nullptr && *root != '\0')
      candidates.push_back(std::string(root) + "/nvvm/libdevice/libdevice.10.bc");
  candidates.emplace_back("/usr/local/cuda/nvvm/libdevice/libdevice.10.bc");
  candidates.emplace_back("/usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc");
  for (const std::string &path : candidates)
    if (llvm::sys::fs::exists(path)) return path;
  return std::nullopt;
}

RhiStatus link_libdevice(llvm::Module &module, const char *device) {
  std::vector<std::pair<llvm::Function *, std::string>> replaced;  // intrinsic, libdevice name
  for (llvm::Function &f : module)
    if (f.isIntrinsic() && !f.use_empty())
      if (std::string name = libdevice_name(f); !name.empty()) replaced.emplace_back(&f, std::move(name));
  if (replaced.empty()) return {};
  const std::optional<std::string> path = find_libdevice();
  if (!path) return {};  // check_device_math refuses the module, saying where kiln looked
  KILN_ASSIGN_OR_RETURN(const std::shared_ptr<const std::string> bytes, libdevice_bytes(*path, device));
  llvm::SMDiagnostic diagnostic;
  std::unique_ptr<llvm::Module> libdevice =
      llvm::parseIR(llvm::MemoryBufferRef(*bytes, *path), diagnostic, module.getContext());
  if (!libdevice)
    return std::unexpected(make_failure(RhiResult::not_supported, device, kSite,
                                        fmt::format("CUDA's libdevice at {} does not parse: {}", *path,
                                                    diagnostic.getMessage().str())));
  for (const auto &[intrinsic, name] : replaced) {
    const llvm::Function *definition = libdevice->getFunction(name);
    if (definition == nullptr || definition->isDeclaration())
      return std::unexpected(make_failure(RhiResult::not_supported, device, kSite,
                                          fmt::format("CUDA's libdevice at {} has no {}", *path, name)));
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
  libdevice->setTargetTriple(module.getTargetTriple());
  libdevice->setDataLayout(module.getDataLayout());
  if (llvm::Linker::linkModules(module, std::move(libdevice), llvm::Linker::Flags::LinkOnlyNeeded))
    return std::unexpected(make_failure(RhiResult::error, device, kSite,
                                        "could not link CUDA's libdevice at " + *path));
  for (const auto &[intrinsic, name] : replaced)
    if (llvm::Function *f = module.getFunction(name); f != nullptr && !f->isDeclaration())
      f->setLinkage(llvm::GlobalValue::InternalLinkage);
  return {};
}

}  // namespace kiln::runtime
