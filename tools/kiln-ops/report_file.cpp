// Where kiln-ops' reports go: a file, or stdout for "-".
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "reports.h"

namespace kiln::ops {
namespace {

std::string system_reason(int error) { return std::strerror(error != 0 ? error : EIO); }

}  // namespace

RhiStatus check_writable(std::string_view flag, const std::string &path) {
  if (path == "-") return {};
  errno = 0;
  std::FILE *probe = std::fopen(path.c_str(), "a");  // "a": an existing report stays as it is
  if (probe == nullptr)
    return std::unexpected(invalid_usage(
        "kiln-ops", "check_writable",
        fmt::format("{} {}: cannot write there ({})", flag, path, system_reason(errno))));
  std::fclose(probe);
  return {};
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
