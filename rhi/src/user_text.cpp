// Text a user passed, quoted for a message (user_text.h): every byte shown, none acted on.
#include "kiln/rhi/user_text.h"

#include <fmt/format.h>

namespace kiln {

std::string quote_user_text(std::string_view text) {
  std::string out = "'";
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\'' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (byte < 0x20 || byte >= 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  return out + "'";
}

}  // namespace kiln
