// check_device_math and lowered_natively (user_module.h): the math intrinsics each GPU back end
// lowers itself, and the named error of a user module that calls one it cannot lower.
#include "user_module.h"

#include <algorithm>
#include <cstdlib>
#include <span>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

namespace kiln::runtime {
namespace {

constexpr const char *kSite = "user kernel";

/// The math intrinsics a GPU back end may not lower without a vendor library.
constexpr llvm::Intrinsic::ID kLibraryMath[] = {
    llvm::Intrinsic::exp,  llvm::Intrinsic::exp2, llvm::Intrinsic::exp10, llvm::Intrinsic::log,
    llvm::Intrinsic::log2, llvm::Intrinsic::log10, llvm::Intrinsic::sin,  llvm::Intrinsic::cos,
    llvm::Intrinsic::tan,  llvm::Intrinsic::asin, llvm::Intrinsic::acos,  llvm::Intrinsic::atan,
    llvm::Intrinsic::sinh, llvm::Intrinsic::cosh, llvm::Intrinsic::tanh,  llvm::Intrinsic::pow};

/// Those AMDGPU lowers itself for float (LLVM 19: exact-enough expansions, no library).
constexpr llvm::Intrinsic::ID kAmdgpuFloatMath[] = {
    llvm::Intrinsic::exp,  llvm::Intrinsic::exp2, llvm::Intrinsic::exp10, llvm::Intrinsic::log,
    llvm::Intrinsic::log2, llvm::Intrinsic::log10, llvm::Intrinsic::sin,  llvm::Intrinsic::cos,
    llvm::Intrinsic::pow};

}  // namespace

bool lowered_natively(llvm::Intrinsic::ID id, const llvm::Type &type, DeviceMath target) {
  const auto listed = [id](std::span<const llvm::Intrinsic::ID> ids) {
    return std::ranges::find(ids, id) != ids.end();
  };
  if (!listed(kLibraryMath)) return true;
  return target == DeviceMath::amdgcn && type.isFloatTy() && listed(kAmdgpuFloatMath);
}

RhiStatus check_device_math(const llvm::Module &module, DeviceMath target, const char *device) {
  for (const llvm::Function &f : module) {
    if (!f.isIntrinsic() || f.use_empty()) continue;
    const llvm::Type &type = *f.getReturnType()->getScalarType();
    if (lowered_natively(f.getIntrinsicID(), type, target)) continue;
    const std::string name = llvm::Intrinsic::getBaseName(f.getIntrinsicID()).drop_front(5).str();  // "llvm."
    const char *dtype = type.isFloatTy() ? "float32" : type.isDoubleTy() ? "float64" : "this type";
    const bool cuda = target == DeviceMath::nvptx;
    if (f.getReturnType()->isVectorTy())  // the libraries have scalar functions only
      return std::unexpected(make_failure(
          RhiResult::not_supported, device, kSite,
          fmt::format("{} on a vector of {} is not supported on {}: kiln links the math library's scalar "
                      "functions only; call {} once per element",
                      name, dtype, cuda ? "cuda" : "amdgpu", name)));
    const char *variable = cuda ? "KILN_LIBDEVICE" : "KILN_OCML";
    const char *chosen = std::getenv(variable);
    const std::string found = chosen != nullptr && std::string_view(chosen) == "none"
                                  ? fmt::format("{}=none turned it off", variable)
                                  : std::string("kiln found none");
    return std::unexpected(make_failure(
        RhiResult::not_supported, device, kSite,
        cuda ? fmt::format("{} on {} needs CUDA's libdevice on cuda (LLVM's NVPTX back end has none of its own) "
                           "and {}: set KILN_LIBDEVICE to libdevice.10.bc (in the CUDA toolkit's "
                           "nvvm/libdevice), or run the kernel on cpu or mock",
                           name, dtype, found)
             : fmt::format("{} on {} needs ROCm's ocml on amdgpu (LLVM's AMDGPU back end cannot expand it) and "
                           "{}: install rocm-device-libs or set KILN_OCML to ocml.bc, or run the "
                           "kernel on cpu or mock",
                           name, dtype, found)));
  }
  return {};
}

}  // namespace kiln::runtime
