// HSACO code objects for the AMDGPU backend. The device runtime module is compiled at build time
// to generic amdgcn bitcode, then for each gfx processor of KILN_AMDGPU_TARGETS that this LLVM
// knows, kiln-amdgcn-codegen (runtime/jit/amdgcn_codegen_main.cpp) emits a relocatable object
// and ld.lld links it into an HSACO (an ELF shared object, e_machine EM_AMDGPU), embedded in
// kiln_codegen. hipModuleLoadData loads it; nothing is compiled at run time.
//
// Built with LLVM 19 (kiln-amdgcn-codegen, ld.lld-19), code object v5: gfx90a (the default),
// gfx942, gfx1100, gfx908, gfx1030, gfx1101, gfx1102, gfx1200, gfx1201 (KILN_AMDGPU_TARGETS).
#ifndef KILN_RUNTIME_AMDGCN_CODEGEN_H_
#define KILN_RUNTIME_AMDGCN_CODEGEN_H_

#include <cstdint>
#include <span>
#include <string_view>

#include "kiln/rhi/result.h"

namespace kiln::runtime {

/// One embedded code object: for `target` ("gfx90a"), the HSACO bytes, which live in the
/// binary's read-only data for the life of the process.
struct AmdgcnCodeObject {
  std::string_view target;
  std::span<const uint8_t> image;
};

/// Every code object built into this kiln, in KILN_AMDGPU_TARGETS order (the first is the
/// default). Empty when this LLVM has no AMDGPU target or ld.lld was not found. Thread-safe.
[[nodiscard]] std::span<const AmdgcnCodeObject> amdgcn_code_objects();

/// The code object for `target`, a gfx processor or target ID ("gfx90a", "gfx90a:sramecc+:xnack-":
/// the feature suffix is ignored, the code objects are built for "any"); an empty `target` gives
/// the first built. Errors: not_supported naming `target` and the targets that were built.
[[nodiscard]] RhiExpected<AmdgcnCodeObject> amdgcn_code_object(std::string_view target = {});

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_AMDGCN_CODEGEN_H_
