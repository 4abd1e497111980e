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
[[nodiscard]] RhiExpected<std::unique_ptr<llvm::Module>> prepare_user_module(
    llvm::LLVMContext &context, std::span<const std::byte> ir, std::string_view entry,
    std::span<const UserValueType> params, std::unique_ptr<llvm::Module> runtime,
    const char *device);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_JIT_USER_MODULE_H_
