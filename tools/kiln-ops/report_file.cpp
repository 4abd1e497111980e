// Where kiln-ops' reports go: a file, or stdout for "-".
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "reports.h"

namespace kiln::ops {
namespace {

std::string system_reason(int error) { return std::strerror(error != 0 ? error : EIO); }

}  // namespace

RhiStatus check_writable(std::string_view flag, const std::string &path) {
  if (path == "-") return {};
  // Asked, not tried: nothing is created or truncated before the run, so a usage error found
  // later leaves no empty report behind. An existing path must be a writable file; a new one
  // needs a writable, searchable folder.
  std::error_code ec;
  const std::filesystem::path file(path);
  const bool exists = std::filesystem::exists(file, ec);
  std::filesystem::path folder = file.parent_path();
  if (folder.empty()) folder = ".";
  errno = 0;
  const bool ok = exists ? !std::filesystem::is_directory(file, ec) && access(path.c_str(), W_OK) == 0
                         : access(folder.c_str(), W_OK | X_OK) == 0;
  if (ok) return {};
  const std::string why = exists && std::filesystem::is_directory(file, ec)
                              ? system_reason(EISDIR)
                              : system_reason(errno);
  return std::unexpected(invalid_usage(
      "kiln-ops", "check_writable", fmt::format("{} {}: cannot write there ({})", flag, path, why)));
}

RhiStatus write_text(const std::string &text, const std::string &path) {
  const bool to_stdout = path == "-";
  errno = 0;
  std::FILE *file = to_stdout ? stdout : std::fopen(path.c_str(), "w");
  bool ok = file != nullptr && std::fwrite(text.data(), 1, text.size(), file) == text.size();
  if (file != nullptr)
    ok = (to_stdout ? std::fflush(file) == 0 && std::ferror(file) == 0 : std::fclose(file) == 0) &&
         ok;
  if (ok) return {};
  return std::unexpected(make_failure(
      RhiResult::error, "kiln-ops", "write_text",
      fmt::format("cannot write {} ({})", to_stdout ? "stdout" : path, system_reason(errno))));
}

}  // namespace kiln::ops
