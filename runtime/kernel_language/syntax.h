// The operation language of ElementwiseKernel / ReductionKernel (kernel_language.h): its syntax
// tree and its parser. A small C-like language: statements `T name = expr`, `name = expr`,
// `name op= expr` separated by ';'; expressions with C's operators and precedence, casts
// `(T)x` and `T(x)`, calls `f(a, b)`, int and float literals (a trailing f makes a float32).
// Private to runtime/: kernel_language.cpp is its only user.
#ifndef KILN_RUNTIME_KERNEL_LANGUAGE_SYNTAX_H_
#define KILN_RUNTIME_KERNEL_LANGUAGE_SYNTAX_H_

#include <cstdint>
#include <expected>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::runtime::lang {

/// A mistake in the text: its byte offset and what is wrong.
struct SourceError {
  uint32_t offset = 0;
  std::string message;
};

template <class T>
using Parsed = std::expected<T, SourceError>;

/// One expression. `text` is the operator ("+", "?:", unary "-"), the name (of a variable, a
/// function, a cast's type) or the literal's spelling.
struct Expr {
  enum class Kind : uint8_t { int_literal, float_literal, bool_literal, name, unary, binary, ternary, call, cast };
  Kind kind = Kind::name;
  std::string text;
  uint32_t offset = 0;  ///< where it starts (an operator: where the operator is)
  int64_t int_value = 0;
  double float_value = 0.0;
  bool float32 = false;  ///< a float literal with an f suffix
  uint32_t height = 1;   ///< 1 + the tallest operand's (the parser refuses trees past its limit)
  std::vector<std::unique_ptr<Expr>> operands;
};

/// `T name = value` (a declaration: type_name set) or `name op value` (op "=", "+=", ...).
struct Statement {
  std::string type_name;  ///< empty for an assignment
  std::string name;
  std::string op = "=";
  bool constant = false;  ///< declared const: later assignments are refused
  uint32_t offset = 0;  ///< of the name
  std::unique_ptr<Expr> value;
};

/// Statements separated by ';' (a trailing ';' and empty statements are allowed).
[[nodiscard]] Parsed<std::vector<Statement>> parse_statements(std::string_view text);
/// One expression, the whole text.
[[nodiscard]] Parsed<std::unique_ptr<Expr>> parse_expression(std::string_view text);

/// Whether `name` is a type name of the language: float, double, float32, float64, int, long,
/// int32, int64, bool.
[[nodiscard]] bool is_builtin_type_name(std::string_view name);

/// "line 2, column 5: <message>\n  <that line>\n  <caret>": `error` placed in `text`.
[[nodiscard]] std::string describe(std::string_view text, const SourceError &error, uint32_t *line,
                                   uint32_t *column);

}  // namespace kiln::runtime::lang

#endif  // KILN_RUNTIME_KERNEL_LANGUAGE_SYNTAX_H_
