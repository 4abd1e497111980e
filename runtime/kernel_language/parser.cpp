// The operation language's recursive-descent parser (syntax.h), over lexer.h's tokens. Precedence and
// associativity are C's (ISO C 6.5), lowest first: ?: || && | ^ & == != < <= > >= << >> + - * / %
// and the unary operators - + ! ~ and casts.
#include "syntax.h"

#include "lexer.h"

#include <algorithm>
#include <array>
#include <optional>
#include <cctype>
#include <charconv>
#include <limits>
#include <utility>

#include <fmt/format.h>

namespace kiln::runtime::lang {
namespace {

std::unique_ptr<Expr> node(Expr::Kind kind, std::string text, uint32_t offset) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->text = std::move(text);
  e->offset = offset;
  return e;
}

/// The binary operators by precedence level, lowest first (the ternary sits below them all).
constexpr std::array<std::array<std::string_view, 4>, 10> kBinaryLevels = {{
    {"||"}, {"&&"}, {"|"}, {"^"}, {"&"}, {"==", "!="}, {"<", "<=", ">", ">="}, {"<<", ">>"},
    {"+", "-"}, {"*", "/", "%"}}};

/// `e` with its operands' height: 1 + the tallest. The tree's walks (type check, code generation,
/// destruction) recurse, so a tree taller than kMaxHeight is refused, never a stack overflow.
constexpr uint32_t kMaxHeight = 200;

Parsed<std::unique_ptr<Expr>> measured(std::unique_ptr<Expr> e) {
  uint32_t tallest = 0;
  for (const auto &operand : e->operands) tallest = std::max(tallest, operand->height);
  e->height = tallest + 1;
  if (e->height > kMaxHeight)
    return std::unexpected(SourceError{e->offset, fmt::format("the expression nests deeper than {} levels (split "
                                                              "it with local variables)",
                                                              kMaxHeight)});
  return e;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Parsed<std::vector<Statement>> statements() {
    std::vector<Statement> result;
    while (peek().kind != Token::Kind::end) {
      if (accept(";")) continue;
      auto s = statement();
      if (!s) return std::unexpected(s.error());
      result.push_back(std::move(*s));
      if (peek().kind != Token::Kind::end && !accept(";"))
        return fail(peek(), fmt::format("expected ';' between statements, got {}", shown(peek())));
    }
    return result;
  }

  Parsed<std::unique_ptr<Expr>> whole_expression() {
    if (peek().kind == Token::Kind::end) return fail(peek(), "expected an expression, got nothing");
    auto e = expression();
    if (!e) return e;
    if (peek().kind != Token::Kind::end)
      return fail(peek(), fmt::format("expected the end of the expression, got {}", shown(peek())));
    return e;
  }

 private:
  const Token &peek(std::size_t ahead = 0) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  bool is(const Token &t, std::string_view punct) const {
    return t.kind == Token::Kind::punct && t.text == punct;
  }
  bool accept(std::string_view punct) {
    if (!is(peek(), punct)) return false;
    ++pos_;
    return true;
  }
  static std::string shown(const Token &t) {
    return t.kind == Token::Kind::end ? std::string("the end of the text") : fmt::format("'{}'", t.text);
  }
  static std::unexpected<SourceError> fail(const Token &t, std::string message) {
    return std::unexpected(SourceError{t.offset, std::move(message)});
  }

  Parsed<Statement> statement() {
    Statement s;
    if (peek().kind == Token::Kind::identifier && peek().text == "const") {
      s.constant = true;
      ++pos_;
    }
    const Token &first = peek();
    if (first.kind != Token::Kind::identifier)
      return fail(first, fmt::format("expected a statement (name = expression), got {}", shown(first)));
    if (peek(1).kind == Token::Kind::identifier) {  // T name = value
      s.type_name = first.text;
      ++pos_;
    } else if (s.constant) {
      return fail(first, fmt::format("const declares a local with its type: const float {} = ...", first.text));
    }
    const Token &name = peek();
    if (name.kind != Token::Kind::identifier)
      return fail(name, fmt::format("expected a name after the type {}, got {}", s.type_name, shown(name)));
    if (name.text == "true" || name.text == "false" || name.text == "const")
      return fail(name, fmt::format("{} is a word of the language, not a name", name.text));
    s.name = name.text;
    s.offset = name.offset;
    ++pos_;
    const Token &op = peek();
    static constexpr std::array<std::string_view, 11> kAssign = {"=",  "+=", "-=",  "*=",  "/=", "%=",
                                                                 "&=", "|=", "^=", "<<=", ">>="};
    const bool assigns = op.kind == Token::Kind::punct &&
                         std::find(kAssign.begin(), kAssign.end(), op.text) != kAssign.end();
    if (!assigns || (!s.type_name.empty() && op.text != "="))
      return fail(op, fmt::format("expected '=' after {}, got {}", s.name, shown(op)));
    s.op = op.text;
    ++pos_;
    auto value = expression();
    if (!value) return std::unexpected(value.error());
    s.value = std::move(*value);
    return s;
  }

  Parsed<std::unique_ptr<Expr>> expression() {
    if (++depth_ > kMaxDepth) return fail(peek(), fmt::format("the expression nests deeper than {} levels", kMaxDepth));
    struct Leave { int &d; ~Leave() { --d; } } leave{depth_};
    auto condition = binary(0);
    if (!condition || !is(peek(), "?")) return condition;
    const Token &question = peek();
    ++pos_;
    auto then = expression();
    if (!then) return then;
    if (!accept(":")) return fail(peek(), fmt::format("expected ':' of the '?' operator, got {}", shown(peek())));
    auto otherwise = expression();
    if (!otherwise) return otherwise;
    auto e = node(Expr::Kind::ternary, "?:", question.offset);
    e->operands.push_back(std::move(*condition));
    e->operands.push_back(std::move(*then));
    e->operands.push_back(std::move(*otherwise));
    return measured(std::move(e));
  }

  Parsed<std::unique_ptr<Expr>> binary(std::size_t level) {
    if (level == kBinaryLevels.size()) return unary();
    auto left = binary(level + 1);
    if (!left) return left;
    for (;;) {
      const Token &op = peek();
      const auto &ops = kBinaryLevels[level];
      if (op.kind != Token::Kind::punct || std::find(ops.begin(), ops.end(), op.text) == ops.end() || op.text.empty())
        return left;
      ++pos_;
      auto right = binary(level + 1);
      if (!right) return right;
      auto e = node(Expr::Kind::binary, op.text, op.offset);
      e->operands.push_back(std::move(*left));
      e->operands.push_back(std::move(*right));
      left = measured(std::move(e));
      if (!left) return left;
    }
  }

  /// '(' T ')' starting here, T a type name (a builtin one, or any name when what follows the
  /// ')' can only start an operand: "(T)x", "(T)(a + b)").
  bool at_cast() const {
    if (!is(peek(), "(") || peek(1).kind != Token::Kind::identifier || !is(peek(2), ")")) return false;
    if (is_builtin_type_name(peek(1).text)) return true;
    const Token &after = peek(3);
    return after.kind == Token::Kind::identifier || after.kind == Token::Kind::int_literal ||
           after.kind == Token::Kind::float_literal || is(after, "(") || is(after, "!") || is(after, "~");
  }

  Parsed<std::unique_ptr<Expr>> unary() {
    if (++depth_ > kMaxDepth) return fail(peek(), fmt::format("the expression nests deeper than {} levels", kMaxDepth));
    struct Leave { int &d; ~Leave() { --d; } } leave{depth_};
    const Token &t = peek();
    if (is(t, "-") || is(t, "+") || is(t, "!") || is(t, "~")) {
      ++pos_;
      auto operand = unary();
      if (!operand) return operand;
      auto e = node(Expr::Kind::unary, t.text, t.offset);
      e->operands.push_back(std::move(*operand));
      return measured(std::move(e));
    }
    if (at_cast()) {
      const Token &type = peek(1);
      pos_ += 3;
      auto operand = unary();
      if (!operand) return operand;
      auto e = node(Expr::Kind::cast, type.text, type.offset);
      e->operands.push_back(std::move(*operand));
      return measured(std::move(e));
    }
    return postfix();
  }

  Parsed<std::unique_ptr<Expr>> postfix() {
    const Token &t = peek();
    if (t.kind == Token::Kind::identifier && is(peek(1), "(")) {
      auto call = node(Expr::Kind::call, t.text, t.offset);
      pos_ += 2;
      if (!accept(")")) {
        for (;;) {
          auto argument = expression();
          if (!argument) return argument;
          call->operands.push_back(std::move(*argument));
          if (accept(")")) break;
          if (!accept(","))
            return fail(peek(), fmt::format("expected ',' or ')' in the call of {}, got {}", t.text, shown(peek())));
        }
      }
      return measured(std::move(call));
    }
    return primary();
  }

  Parsed<std::unique_ptr<Expr>> primary() {
    const Token &t = peek();
    switch (t.kind) {
      case Token::Kind::identifier: {
        ++pos_;
        if (t.text == "true" || t.text == "false") {
          auto e = node(Expr::Kind::bool_literal, t.text, t.offset);
          e->int_value = t.text == "true";
          return e;
        }
        return node(Expr::Kind::name, t.text, t.offset);
      }
      case Token::Kind::int_literal: {
        ++pos_;
        if (t.text.size() > 1 && t.text[0] == '0')
          return fail(t, fmt::format("{}: an integer with a leading 0 is octal in C; write it without the 0s", t.text));
        auto e = node(Expr::Kind::int_literal, t.text, t.offset);
        const auto [end, ec] = std::from_chars(t.text.data(), t.text.data() + t.text.size(), e->int_value);
        if (ec != std::errc() || end != t.text.data() + t.text.size())
          return fail(t, fmt::format("the integer {} does not fit in int64", t.text));
        return e;
      }
      case Token::Kind::float_literal: {
        ++pos_;
        auto e = node(Expr::Kind::float_literal, t.text, t.offset);
        e->float32 = t.text.back() == 'f';
        // from_chars: C's reading whatever the process's locale (strtod follows LC_NUMERIC).
        const std::string_view digits(t.text.data(), t.text.size() - (e->float32 ? 1 : 0));
        const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), e->float_value);
        if (ec == std::errc::result_out_of_range) {  // as strtod: too small is 0, too large infinity
          const std::size_t exponent = digits.find_first_of("eE");
          const bool tiny = exponent != std::string_view::npos && exponent + 1 < digits.size() &&
                            digits[exponent + 1] == '-';
          e->float_value = tiny ? 0.0 : std::numeric_limits<double>::infinity();
        } else if (ec != std::errc() || end != digits.data() + digits.size())
          return fail(t, fmt::format("{} is not a number", t.text));
        return e;
      }
      case Token::Kind::punct:
        if (accept("(")) {
          auto e = expression();
          if (!e) return e;
          if (!accept(")")) return fail(peek(), fmt::format("expected ')', got {}", shown(peek())));
          return e;
        }
        return fail(t, fmt::format("expected an operand (a name, a number or '('), got {}", shown(t)));
      case Token::Kind::end: break;
    }
    return fail(t, "expected an operand, got the end of the text");
  }

  static constexpr int kMaxDepth = 200;  // deeper text is refused, not a stack overflow
  std::vector<Token> tokens_;
  std::size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

bool is_builtin_type_name(std::string_view name) {
  static constexpr std::array<std::string_view, 9> kNames = {"float", "double", "float32", "float64", "int",
                                                             "long",  "int32",  "int64",   "bool"};
  return std::find(kNames.begin(), kNames.end(), name) != kNames.end();
}

Parsed<std::vector<Statement>> parse_statements(std::string_view text) {
  auto tokens = tokenize(text);
  if (!tokens) return std::unexpected(tokens.error());
  return Parser(std::move(*tokens)).statements();
}

Parsed<std::unique_ptr<Expr>> parse_expression(std::string_view text) {
  auto tokens = tokenize(text);
  if (!tokens) return std::unexpected(tokens.error());
  return Parser(std::move(*tokens)).whole_expression();
}

std::string describe(std::string_view text, const SourceError &error, uint32_t *line, uint32_t *column) {
  const std::size_t offset = std::min<std::size_t>(error.offset, text.size());
  const std::size_t line_start = text.rfind('\n', offset == 0 ? 0 : offset - 1);
  const std::size_t begin = (line_start == std::string_view::npos || (offset == 0 && text[0] != '\n')) ? 0 : line_start + 1;
  std::size_t end = text.find('\n', begin);
  if (end == std::string_view::npos) end = text.size();
  *line = 1 + static_cast<uint32_t>(std::count(text.begin(), text.begin() + static_cast<std::ptrdiff_t>(begin), '\n'));
  *column = 1 + static_cast<uint32_t>(offset - begin);
  // At most kShown characters of the line, around the caret (a long line is cut with "...").
  constexpr std::size_t kShown = 100;
  std::size_t from = begin, to = end;
  if (to - from > kShown) {
    from = offset > begin + kShown / 2 ? offset - kShown / 2 : begin;
    to = std::min(end, from + kShown);
  }
  std::string shown = from > begin ? "..." : "";
  std::string caret = from > begin ? "   " : "";
  for (const char c : text.substr(from, to - from))  // tabs keep the caret aligned
    shown += std::isprint(static_cast<unsigned char>(c)) || c == '\t' ? c : '?';
  if (to < end) shown += "...";
  for (std::size_t k = from; k < offset; ++k) caret += text[k] == '\t' ? '\t' : ' ';
  return fmt::format("line {}, column {}: {}\n    {}\n    {}^", *line, *column, error.message, shown, caret);
}

}  // namespace kiln::runtime::lang
