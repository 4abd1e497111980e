// user_module_comment, parse_user_module_comment (user_kernel_abi.h): a user kernel's IR carried
// in a comment of its PTX for the fake CUDA driver.
#include <string>

#include "kiln/runtime/user_kernel_abi.h"

namespace kiln::runtime {
namespace {

constexpr std::string_view kMarker = "// kiln-user-module ";
constexpr std::string_view kTypeLetters = "pfdil";  // ptr, f32, f64, i32, i64 (UserValueType order)
constexpr std::string_view kHex = "0123456789abcdef";

}  // namespace

std::string user_module_comment(std::span<const std::byte> ir, std::string_view entry,
                                std::span<const UserValueType> params) {
  std::string line(kMarker);
  line.append(entry).push_back(' ');
  if (params.empty()) line.push_back('-');
  for (const UserValueType p : params) line.push_back(kTypeLetters[static_cast<std::size_t>(p)]);
  line.push_back(' ');
  for (const std::byte b : ir) {
    line.push_back(kHex[static_cast<unsigned>(b) >> 4]);
    line.push_back(kHex[static_cast<unsigned>(b) & 15]);
  }
  return line + "\n";
}

bool parse_user_module_comment(std::string_view text, std::string *ir, std::string *entry,
                               std::vector<UserValueType> *params) {
  const std::size_t at = text.rfind(kMarker);
  if (at == std::string_view::npos) return false;
  std::string_view rest = text.substr(at + kMarker.size());
  rest = rest.substr(0, rest.find('\n'));
  const std::size_t name_end = rest.find(' ');
  if (name_end == std::string_view::npos || name_end == 0) return false;
  const std::size_t types_end = rest.find(' ', name_end + 1);
  if (types_end == std::string_view::npos) return false;
  *entry = std::string(rest.substr(0, name_end));
  params->clear();
  const std::string_view types = rest.substr(name_end + 1, types_end - name_end - 1);
  if (types != "-") {
    for (const char c : types) {
      const std::size_t k = kTypeLetters.find(c);
      if (k == std::string_view::npos) return false;
      params->push_back(static_cast<UserValueType>(k));
    }
  }
  const std::string_view hex = rest.substr(types_end + 1);
  if (hex.size() % 2 != 0) return false;
  ir->clear();
  for (std::size_t k = 0; k < hex.size(); k += 2) {
    const std::size_t hi = kHex.find(hex[k]), lo = kHex.find(hex[k + 1]);
    if (hi == std::string_view::npos || lo == std::string_view::npos) return false;
    ir->push_back(static_cast<char>(hi * 16 + lo));
  }
  return true;
}

}  // namespace kiln::runtime
