// A user module (kernel_abi.h's user-kernel ABI) made ready to compile: parsed from LLVM IR text
// or bitcode, verified, its element function checked against the declared parameters, wrapped
// in the range kernel kiln_user_entry, and linked with what it uses of the device runtime.
// Private to runtime/: every LLVM error becomes a Failure here, and nothing aborts.
#ifndef KILN_RUNTIME_JIT_USER_MODULE_H_
#define KILN_RUNTIME_JIT_USER_MODULE_H_

#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/Module.h>

#include "kiln/rhi/result.h"
#include "kiln/runtime/user_kernel_abi.h"

namespace kiln::runtime {

/// `ir` (LLVM IR text, or bitcode: it starts with "BC\xC0\xDE") parsed into `context`, verified,
/// with `entry` wrapped in kiln_user_entry: for each element index of its range, it calls
/// entry(context, args...) with the launch's user_args converted to `params`. `runtime` (the
/// device runtime module for the same target, in `context`) is linked in for the functions the
/// module calls (kiln_index, kiln_heap_allocate, ...) and nothing else. `device` names the
/// device in failures.
/// Errors: invalid_usage (site "user kernel") for text that does not parse (with its line and
/// column), a module the verifier refuses (its first message), a name the module defines that
/// the runtime defines too, no definition of `entry`, a signature that is not
/// void(ptr, <params>), more than KILN_MAX_USER_PARAMS parameters; error when linking fails.
/// With `gpu_entry`, the module also defines kUserGpuEntryName(ptr runtime, ptr args): thread g
/// runs kiln_user_entry over indices g, g + G, ... below args->num_elements (G the grid's
/// threads), its geometry from the GPU runtime's kiln_grid_first_index and kiln_grid_threads;
/// the caller marks it a kernel for its target.
[[nodiscard]] RhiExpected<std::unique_ptr<llvm::Module>> prepare_user_module(
    llvm::LLVMContext &context, std::span<const std::byte> ir, std::string_view entry,
    std::span<const UserValueType> params, std::unique_ptr<llvm::Module> runtime,
    const char *device, bool gpu_entry = false);

/// A GPU back end whose math prepare_user_module's callers check (check_device_math).
enum class DeviceMath : uint8_t { nvptx, amdgcn };

/// Refuses a module that still calls a math intrinsic `target`'s back end cannot lower by itself:
/// LLVM 19 turns those into calls of a vendor library (CUDA's libdevice, ROCm's ocml), which fail
/// in code generation with an LLVM fatal error or a missing libcall. generate_user_ptx and
/// generate_user_hsaco replace them with the library's functions first when they find the
/// library (math_library.h).
/// NVPTX lowers none of exp, exp2, exp10, log, log2, log10, sin, cos, tan, asin, acos, atan,
/// sinh, cosh, tanh, pow (sqrt, fma, floor, min, powi and friends it does); AMDGPU lowers the
/// float32 exp, log and sin/cos families and pow, and none of them for float64. Measured for each
/// intrinsic and type with LLVM 19.1.7 (sm_80, gfx90a). Checked before optimization, so whether
/// a kernel compiles never depends on what O3 folds away.
/// Errors: not_supported naming the first such function, its type, the target and where it runs.
/// A call of a vector of one (<2 x double> llvm.exp) is refused too: the libraries have scalar
/// functions only.
[[nodiscard]] RhiStatus check_device_math(const llvm::Module &module, DeviceMath target, const char *device);

/// Whether `target`'s back end lowers intrinsic `id` on element type `type` by itself (true for
/// every intrinsic outside check_device_math's list).
[[nodiscard]] bool lowered_natively(llvm::Intrinsic::ID id, const llvm::Type &type, DeviceMath target);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_JIT_USER_MODULE_H_
