// lld as a library: a relocatable AMDGPU object linked into an HSACO (what `ld.lld -shared` does at
// build time for kiln's own code objects), in process. Private to runtime/.
#ifndef KILN_RUNTIME_JIT_HSACO_LINKER_H_
#define KILN_RUNTIME_JIT_HSACO_LINKER_H_

#include <cstddef>
#include <span>
#include <vector>

#include "kiln/rhi/result.h"

namespace kiln::runtime {

/// Whether lld was linked into this kiln (KILN_HAVE_LLD).
[[nodiscard]] bool have_hsaco_linker();

/// `object` (an ELF relocatable object for amdgcn-amd-amdhsa) linked by lld's ELF driver with
/// `-shared --no-undefined --threads=1` into an ELF shared object. lld reads and writes files, so
/// the object and the image pass through two temporary files (llvm::sys::fs::createTemporaryFile),
/// removed before this returns. `device` names the device in failures.
/// Errors: not_supported without lld; error when a temporary file cannot be written or read, or
/// lld refuses the object (its messages in the detail: an undefined symbol, a malformed object),
/// or an earlier link left lld unable to run again (lld::Result::canRunAgain false). Never exits
/// the process: lld's fatal errors, which would call _exit, are caught by crash recovery, on
/// (llvm::CrashRecoveryContext::Enable) only during the link. lld reads LLD_REPRODUCE from the
/// environment like the ld.lld program: set, each link also writes a reproducer archive there.
/// Thread-safe: links are serialized (lld keeps process-wide state); the lock is held across
/// fork(), so a child never inherits it held.
[[nodiscard]] RhiExpected<std::vector<std::byte>> link_hsaco(std::span<const char> object, const char *device);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_JIT_HSACO_LINKER_H_
