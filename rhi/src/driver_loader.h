// What the dlopen'ed GPU drivers (CUDA's libcuda, HIP's libamdhip64) share: finding and opening
// the library once per process, resolving entry points, and turning a driver code that a
// backend's status table classified into a Failure. Private to kiln_rhi.
#ifndef KILN_RHI_SRC_DRIVER_LOADER_H_
#define KILN_RHI_SRC_DRIVER_LOADER_H_

#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kiln/rhi/fork_hooks.h"
#include "kiln/rhi/result.h"

namespace kiln::driver {

/// Names a backend's driver library in messages: {"cuda", "the CUDA driver", "KILN_CUDA_DRIVER",
/// "install the NVIDIA driver"}.
struct LibraryInfo {
  const char *backend;   ///< the Failure's device when no device exists yet
  const char *what;      ///< "the CUDA driver", "the HIP runtime"
  const char *env_var;   ///< names another library (tests, fakes)
  const char *install_hint;
};

/// The libraries to try: the one `info.env_var` names when it is set and not empty, else
/// `defaults` in order.
[[nodiscard]] std::vector<std::string> library_candidates(const LibraryInfo &info,
                                                          std::initializer_list<const char *> defaults);

/// An opened library; never closed, so names and function pointers it gives stay valid.
struct OpenedLibrary {
  void *handle = nullptr;
  std::string library;  ///< the candidate that opened
};

/// dlopen()s (RTLD_NOW | RTLD_LOCAL) the first candidate that opens.
/// Errors: not_supported naming every candidate tried, dlerror()'s text and what to do.
[[nodiscard]] RhiExpected<OpenedLibrary> open_first(const LibraryInfo &info,
                                                    const std::vector<std::string> &candidates);

/// The address of entry point `name`. Errors: not_supported ("... has no entry point ...; it is
/// too old").
[[nodiscard]] RhiExpected<void *> resolve(const LibraryInfo &info, const OpenedLibrary &library,
                                          const char *name);

/// Loads a driver table once per process and set of candidates. `Table` has a `std::string
/// library` member; `fill(const OpenedLibrary &, Table &)` resolves its entry points and returns
/// an RhiStatus. Thread-safe; a failed load is retried by the next call.
template <class Table, class Fill>
[[nodiscard]] RhiExpected<const Table *> load_once(const LibraryInfo &info,
                                                   std::initializer_list<const char *> defaults,
                                                   Fill fill) {
  // Held across fork() (a fork waits for a load in progress): a child never inherits it locked.
  static auto *mutex = new ForkSafeMutex(ForkSafeMutex::Policy::hold_across_fork);  // never freed
  static std::map<std::vector<std::string>, std::unique_ptr<Table>> loaded;  // never freed
  const std::vector<std::string> candidates = library_candidates(info, defaults);
  std::lock_guard lock(*mutex);
  if (auto it = loaded.find(candidates); it != loaded.end()) return it->second.get();
  KILN_ASSIGN_OR_RETURN(const OpenedLibrary opened, open_first(info, candidates));
  auto table = std::make_unique<Table>();
  table->library = opened.library;
  KILN_RETURN_IF_ERROR(fill(opened, *table));
  return loaded.emplace(candidates, std::move(table)).first->second.get();
}

}  // namespace kiln::driver

#endif  // KILN_RHI_SRC_DRIVER_LOADER_H_
