// The operation language's lexer (see lexer.h).
#include "lexer.h"

#include <array>
#include <cctype>
#include <optional>
#include <utility>

#include <fmt/format.h>

namespace kiln::runtime::lang {
namespace {

// Longest first, so "<=" wins over "<".
constexpr std::array<std::string_view, 33> kPunctuators = {
    "<<=", ">>=", "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "==", "!=", "<=", ">=", "&&", "||", "<<",
    ">>",  "+",   "-",  "*",  "/",  "%",  "<",  ">",  "=",  "!",  "~",  "&",  "|",  "^",  "?",  ":"};

bool ident_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool ident_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

/// The lexer of one text: run() once.
class Lexer {
 public:
  explicit Lexer(std::string_view text) : text_(text) {}

  Parsed<std::vector<Token>> run() {
    std::vector<Token> tokens;
    for (;;) {
      if (!skip_space_and_comments())
        return std::unexpected(SourceError{static_cast<uint32_t>(pos_), "this /* comment is not closed by */"});
      const auto at = static_cast<uint32_t>(pos_);
      if (pos_ >= text_.size()) {
        tokens.push_back({Token::Kind::end, "", at});
        return tokens;
      }
      const char c = text_[pos_];
      if (ident_start(c)) {
        while (pos_ < text_.size() && ident_char(text_[pos_])) ++pos_;
        tokens.push_back({Token::Kind::identifier, std::string(text_.substr(at, pos_ - at)), at});
      } else if (std::isdigit(static_cast<unsigned char>(c)) ||
                 (c == '.' && pos_ + 1 < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_ + 1])))) {
        auto number = lex_number();
        if (!number) return std::unexpected(number.error());
        tokens.push_back(std::move(*number));
      } else if (c == '(' || c == ')' || c == ',' || c == ';') {
        tokens.push_back({Token::Kind::punct, std::string(1, c), at});
        ++pos_;
      } else if (auto p = punctuator()) {
        tokens.push_back({Token::Kind::punct, std::string(*p), at});
        pos_ += p->size();
      } else if (c == '"' || c == '\'') {
        return std::unexpected(SourceError{at, "a string or character literal has no meaning here: an "
                                               "operation computes with numbers"});
      } else {
        const auto shown = static_cast<unsigned char>(c);
        return std::unexpected(SourceError{
            at, std::isprint(shown) ? fmt::format("unexpected character '{}'", c)
                                    : fmt::format("unexpected byte 0x{:02x}", static_cast<unsigned>(shown))});
      }
    }
  }

 private:
  /// False, at the comment's start, for a /* comment that is not closed.
  bool skip_space_and_comments() {
    for (;;) {
      while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
      if (text_.substr(pos_, 2) == "//") {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else if (text_.substr(pos_, 2) == "/*") {
        const std::size_t end = text_.find("*/", pos_ + 2);
        if (end == std::string_view::npos) return false;
        pos_ = end + 2;
      } else {
        return true;
      }
    }
  }

  std::optional<std::string_view> punctuator() const {
    for (const std::string_view p : kPunctuators)
      if (text_.substr(pos_, p.size()) == p) return p;
    return std::nullopt;
  }

  Parsed<Token> lex_number() {
    const auto at = static_cast<uint32_t>(pos_);
    bool floating = false;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    if (pos_ < text_.size() && text_[pos_] == '.') {
      floating = true;
      ++pos_;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
    }
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      std::size_t p = pos_ + 1;
      if (p < text_.size() && (text_[p] == '+' || text_[p] == '-')) ++p;
      if (p < text_.size() && std::isdigit(static_cast<unsigned char>(text_[p]))) {
        floating = true;
        pos_ = p;
        while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
      }
    }
    std::string spelling(text_.substr(at, pos_ - at));
    if (pos_ < text_.size() && (text_[pos_] == 'f' || text_[pos_] == 'F')) {
      ++pos_;
      return Token{Token::Kind::float_literal, spelling + "f", at};
    }
    if (pos_ < text_.size() && ident_char(text_[pos_]))
      return std::unexpected(SourceError{static_cast<uint32_t>(pos_),
                                         fmt::format("'{}' cannot follow the number {}", text_[pos_], spelling)});
    return Token{floating ? Token::Kind::float_literal : Token::Kind::int_literal, spelling, at};
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

}  // namespace

Parsed<std::vector<Token>> tokenize(std::string_view text) { return Lexer(text).run(); }

}  // namespace kiln::runtime::lang
