// Text a user passed, shown in a message as they typed it.
#ifndef KILN_RHI_USER_TEXT_H_
#define KILN_RHI_USER_TEXT_H_

#include <string>
#include <string_view>

namespace kiln {

/// `text` in single quotes, every byte that is not printable ASCII (a NUL, a newline, a control
/// or non-ASCII byte) and every quote or backslash written as a C escape (\x00, \n, \', \\), so
/// that a message shows exactly what was passed and a NUL cannot cut it short. Thread-safe.
[[nodiscard]] std::string quote_user_text(std::string_view text);

}  // namespace kiln

#endif  // KILN_RHI_USER_TEXT_H_
