// HSACO code objects for user kernels on the AMDGPU backend, made at run time: kiln's own kernels
// are built into HSACO at build time (embedded_code.h), but a user's kernel exists only once the
// user gives it, so kiln compiles it in process with LLVM's AMDGPU back end and links the object
// into an HSACO with lld used as a library (Debian: liblld-19-dev). No ROCm toolchain is needed.
#ifndef KILN_RUNTIME_AMDGCN_CODEGEN_H_
#define KILN_RUNTIME_AMDGCN_CODEGEN_H_

#include <cstddef>
#include <optional>
#include <string>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/rhi/result.h"
#include "kiln/runtime/user_kernel_abi.h"

namespace kiln::runtime {

/// An HSACO (ELF shared object, code object v5, as hipModuleLoadData loads) of a user module
/// (kernel_abi.h's user-kernel ABI; checked as UserKernel::create checks it: user_module.h) for
/// the gfx processor `target` ("gfx90a"; a target ID "gfx90a:sramecc+:xnack-" is accepted and its
/// features ignored, as for the embedded code objects): the element function `entry` taking
/// `params`, linked with what it calls of the amdgcn device runtime, wrapped in kiln_user_entry
/// and the kernel kUserGpuEntryName (a grid-stride loop over args->num_elements, at most 256
/// work-items a workgroup), O3, emitted as an object by LLVM and linked by lld (-shared). The
/// image carries the user's IR in kUserModuleSection. Math the back end cannot expand calls ROCm's
/// ocml, linked in from the file find_ocml names. `device` names the device in failures.
/// The section is charged with the image (UserKernel's code_object) though no segment loads it.
/// Errors: invalid_usage (kernel_compile) as prepare_user_module's; not_supported when this kiln
/// has no AMDGPU code generation (its LLVM has no AMDGPU target, or it was built without
/// liblld), when `target` is not one of the processors kiln built its own code objects for
/// (amdgcn_code_objects: the device runtime is made for those only), and for math the back end
/// cannot expand when no ocml is found or the one found lacks the function (check_device_math);
/// error when emission or linking fails (with LLVM's or lld's words) or a temporary file cannot
/// be written (lld links files: they go to the system's temporary directory, $TMPDIR, and are
/// removed before this returns, on every path).
/// Thread-safe: calls are serialized around lld (a linker with process-wide state), each one
/// compiles; nothing is cached here.
[[nodiscard]] RhiExpected<std::vector<std::byte>> generate_user_hsaco(std::span<const std::byte> ir,
                                                                      std::string_view entry,
                                                                      std::span<const UserValueType> params,
                                                                      std::string_view target,
                                                                      const char *device);

/// ROCm's ocml (ocml.bc, ROCm's math library: Debian's rocm-device-libs) that generate_user_hsaco
/// links for the math LLVM's AMDGPU back end cannot expand (tanh, float64 exp, ...): $KILN_OCML
/// when set and not empty ("none": link none), else the first of $ROCM_PATH/amdgcn/bitcode/ocml.bc,
/// /opt/rocm/amdgcn/bitcode/ocml.bc and Debian's /usr/lib/x86_64-linux-gnu/amdgcn/bitcode/ocml.bc
/// that exists; nullopt when none. generate_user_hsaco links the first of those that LLVM 19 can
/// parse (an ocml written by a newer LLVM is passed over). Thread-safe (reads the environment).
[[nodiscard]] std::optional<std::string> find_ocml();

/// Whether this kiln can make HSACO at run time (an AMDGPU target in its LLVM, the amdgcn device
/// runtime embedded, lld linked in). Thread-safe.
[[nodiscard]] bool can_generate_hsaco();

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_AMDGCN_CODEGEN_H_
