// The device code built into kiln, one accessor per kind. At build time the device runtime module
// (runtime/device/kiln_runtime.cpp) is compiled to LLVM bitcode for the host and for nvptx64
// (cmake/KilnDeviceBitcode.cmake), and to one HSACO code object per gfx processor of
// KILN_AMDGPU_TARGETS that this LLVM knows (cmake/KilnAmdgpuCodeObjects.cmake:
// kiln-amdgcn-codegen emits a relocatable object, ld.lld links it into an ELF shared object,
// e_machine EM_AMDGPU). The bytes are embedded in kiln_codegen's read-only data and live for the
// life of the process. All functions are thread-safe.
#ifndef KILN_RUNTIME_EMBEDDED_CODE_H_
#define KILN_RUNTIME_EMBEDDED_CODE_H_

#include <cstdint>
#include <span>
#include <string_view>

#include "kiln/rhi/result.h"

namespace kiln::runtime {

/// The device runtime module for the host triple, as LLVM bitcode bytes (the CPU JIT's input).
[[nodiscard]] std::span<const uint8_t> host_runtime_bitcode();

/// The device runtime module for nvptx64-nvidia-cuda (no SM version chosen), as LLVM bitcode
/// bytes (generate_ptx's input). Empty when this LLVM has no NVPTX target.
[[nodiscard]] std::span<const uint8_t> nvptx_runtime_bitcode();

/// The device runtime module for amdgcn-amd-amdhsa (no processor chosen, code object v5), as LLVM
/// bitcode bytes (generate_user_hsaco's input). Empty when this kiln makes no HSACO at run time
/// (its LLVM has no AMDGPU target, or it was built with KILN_LLVM_STATIC).
[[nodiscard]] std::span<const uint8_t> amdgcn_runtime_bitcode();

/// One embedded HSACO code object: for `target` ("gfx90a"), its bytes. hipModuleLoadData loads
/// it; nothing is compiled at run time.
struct AmdgcnCodeObject {
  std::string_view target;
  std::span<const uint8_t> image;
};

/// Every code object built into this kiln, in KILN_AMDGPU_TARGETS order (the first is the
/// default). Empty when this LLVM has no AMDGPU target or ld.lld was not found.
[[nodiscard]] std::span<const AmdgcnCodeObject> amdgcn_code_objects();

/// The code object for `target`, a gfx processor or target ID ("gfx90a", "gfx90a:sramecc+:xnack-":
/// the feature suffix is ignored, the code objects are built for "any"); an empty `target` gives
/// the first built. Errors: not_supported naming `target` and the targets that were built.
[[nodiscard]] RhiExpected<AmdgcnCodeObject> amdgcn_code_object(std::string_view target = {});

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_EMBEDDED_CODE_H_
