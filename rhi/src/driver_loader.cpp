#include "driver_loader.h"

#include <dlfcn.h>

#include <cstdlib>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kiln::driver {

std::vector<std::string> library_candidates(const LibraryInfo &info,
                                            std::initializer_list<const char *> defaults) {
  const char *env = std::getenv(info.env_var);
  if (env != nullptr && *env != '\0') return {env};
  return {defaults.begin(), defaults.end()};
}

RhiExpected<OpenedLibrary> open_first(const LibraryInfo &info,
                                      const std::vector<std::string> &candidates) {
  std::string errors;
  for (const std::string &library : candidates) {
    if (void *handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL)) return OpenedLibrary{handle, library};
    const char *error = dlerror();
    if (!errors.empty()) errors += "; ";
    errors += error != nullptr ? error : library + ": unknown dlopen error";
  }
  return std::unexpected(make_failure(
      RhiResult::not_supported, info.backend, "dlopen",
      fmt::format("{} {} could not be loaded ({}); {} or set {}", info.what,
                  fmt::join(candidates, ", "), errors, info.install_hint, info.env_var)));
}

RhiExpected<void *> resolve(const LibraryInfo &info, const OpenedLibrary &library, const char *name) {
  if (void *address = dlsym(library.handle, name)) return address;
  return std::unexpected(make_failure(
      RhiResult::not_supported, info.backend, "dlsym",
      fmt::format("{} {} has no entry point {}; it is too old", info.what, library.library, name)));
}

}  // namespace kiln::driver
