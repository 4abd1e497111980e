// The operation language's lexer (its tokens; syntax.h is the language): identifiers, int and
// float literals (C's spellings, an `f` suffix for float), C's punctuators, and // and /* */
// comments skipped.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "syntax.h"

namespace kiln::runtime::lang {

/// One token and its byte offset in the text.
struct Token {
  enum class Kind : uint8_t { end, identifier, int_literal, float_literal, punct };
  Kind kind = Kind::end;
  std::string text;
  uint32_t offset = 0;
};

/// The tokens of `text`, the last one of kind end. Errors: a SourceError at the offending byte (an
/// unclosed /* comment, a string literal, a character that is no token, a letter after a number).
Parsed<std::vector<Token>> tokenize(std::string_view text);

}  // namespace kiln::runtime::lang
