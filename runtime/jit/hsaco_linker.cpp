// link_hsaco (hsaco_linker.h): lld's ELF driver called in process.
#include "hsaco_linker.h"

#include <memory>
#include <mutex>
#include <string>

#include <fmt/format.h>

#include <llvm/ADT/SmallString.h>
#include <llvm/Support/CrashRecoveryContext.h>
#include <llvm/Support/FileSystem.h>
#include <llvm/Support/FileUtilities.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/raw_ostream.h>

#include "kiln/rhi/fork_hooks.h"

#if KILN_HAVE_LLD
#include <lld/Common/Driver.h>
LLD_HAS_DRIVER(elf)
#endif

namespace kiln::runtime {
namespace {

constexpr const char *kSite = "link_hsaco";

Failure link_failure(const char *device, std::string detail) {
  return make_failure(RhiResult::error, device, kSite, std::move(detail));
}

#if KILN_HAVE_LLD
/// A new temporary file's path (created empty, so no other process takes the name).
RhiExpected<std::string> temporary_file(const char *suffix, const char *device) {
  llvm::SmallString<128> path;
  if (const std::error_code ec = llvm::sys::fs::createTemporaryFile("kiln-user-kernel", suffix, path))
    return std::unexpected(link_failure(device, "cannot create a temporary file: " + ec.message()));
  return path.str().str();
}

/// Writes `bytes` to `path`.
RhiStatus write_file(const std::string &path, std::span<const char> bytes, const char *device) {
  std::error_code ec;
  llvm::raw_fd_ostream out(path, ec, llvm::sys::fs::OF_None);
  if (!ec) {
    out.write(bytes.data(), bytes.size());
    out.close();
    if (out.has_error()) ec = out.error();
  }
  if (ec) return std::unexpected(link_failure(device, fmt::format("cannot write {}: {}", path, ec.message())));
  return {};
}

/// lld's ELF driver on `input`, writing `output`; its messages go into the failure.
RhiStatus run_lld(const std::string &input, const std::string &output, const char *device) {
  // Never destroyed: a thread may still link at exit. Held across fork (a fork waits for a link
  // in progress), so a child never inherits it locked.
  static auto *mutex = new ForkSafeMutex(ForkSafeMutex::Policy::hold_across_fork);
  static bool broken = false;  // lld said it cannot run again in this process
  const std::lock_guard lock(*mutex);
  if (broken)
    return std::unexpected(link_failure(device, "an earlier link left lld unable to run again in this process"));
  // --no-undefined: a call left unresolved is refused here, not by hipModuleLoadData on the GPU.
  const char *args[] = {"ld.lld", "-shared", "--no-undefined", "--threads=1", input.c_str(), "-o", output.c_str()};
  std::string messages;
  llvm::raw_string_ostream out(messages), err(messages);
  // lld's fatal errors end in exitLld, which calls _exit unless crash recovery is on: with it,
  // lldMain's own CrashRecoveryContext returns them as a failed link. On only while linking (its
  // signal handlers then hand any signal of another thread back to the handlers before them).
  llvm::CrashRecoveryContext::Enable();
  lld::Result result{1, false};
  try {
    result = lld::lldMain(args, out, err, {{lld::Gnu, &lld::elf::link}});
  } catch (...) {  // an LLVM fatal error (install_llvm_error_handlers) thrown through lld's frames
    llvm::CrashRecoveryContext::Disable();
    broken = true;
    throw;
  }
  llvm::CrashRecoveryContext::Disable();
  broken = !result.canRunAgain;
  if (result.retCode != 0)
    return std::unexpected(link_failure(device, "lld could not link the code object: " + messages));
  return {};
}
#endif

}  // namespace

bool have_hsaco_linker() {
#if KILN_HAVE_LLD
  return true;
#else
  return false;
#endif
}

RhiExpected<std::vector<std::byte>> link_hsaco(std::span<const char> object, const char *device) {
#if KILN_HAVE_LLD
  KILN_ASSIGN_OR_RETURN(const std::string input, temporary_file("o", device));
  const llvm::FileRemover remove_input(input);
  KILN_ASSIGN_OR_RETURN(const std::string output, temporary_file("hsaco", device));
  const llvm::FileRemover remove_output(output);
  KILN_RETURN_IF_ERROR(write_file(input, object, device));
  KILN_RETURN_IF_ERROR(run_lld(input, output, device));
  auto image = llvm::MemoryBuffer::getFile(output, /*IsText=*/false, /*RequiresNullTerminator=*/false);
  if (!image)
    return std::unexpected(link_failure(device, fmt::format("cannot read {}: {}", output, image.getError().message())));
  const auto *begin = reinterpret_cast<const std::byte *>((*image)->getBufferStart());
  return std::vector<std::byte>(begin, begin + (*image)->getBufferSize());
#else
  (void)object;
  return std::unexpected(make_failure(RhiResult::not_supported, device, kSite,
                                      "this kiln was built without lld (apt-get install liblld-19-dev, then "
                                      "rebuild): user kernels cannot be linked for AMDGPU"));
#endif
}

}  // namespace kiln::runtime
