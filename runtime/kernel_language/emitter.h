// The operation language's type checker and code generator in one pass (kernel_language.h):
// each expression and statement is checked and emitted with LLVM's IRBuilder at the builder's
// insertion point. Private to runtime/.
#ifndef KILN_RUNTIME_KERNEL_LANGUAGE_EMITTER_H_
#define KILN_RUNTIME_KERNEL_LANGUAGE_EMITTER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <llvm/IR/IRBuilder.h>

#include "kiln/runtime/user_kernel_abi.h"
#include "syntax.h"

namespace kiln::runtime::lang {

/// The types of the language: bool, then the element types.
enum class Ty : uint8_t { b1, i32, i64, f32, f64 };

/// "bool", "int32", "int64", "float32", "float64".
[[nodiscard]] const char *name_of(Ty type);
[[nodiscard]] Ty ty_of(UserValueType type);

struct Typed {
  llvm::Value *value = nullptr;
  Ty type = Ty::i32;
};

/// What a name stands for: a value (read-only), or a place (`pointer`) it is read from and, when
/// writable, written to.
struct Binding {
  Ty type = Ty::i32;
  llvm::Value *value = nullptr;
  llvm::Value *pointer = nullptr;
  bool writable = false;
  const char *what = "a local";  ///< for messages: "an input", "an output", "the index"
};

class Emitter {
 public:
  /// `entry` is the function's entry block: locals are allocated there. `type_names` adds
  /// placeholder types ("T").
  Emitter(llvm::IRBuilder<> &b, llvm::BasicBlock *entry, std::vector<std::pair<std::string, Ty>> type_names);

  void bind(const std::string &name, Binding binding) { names_[name] = binding; }
  [[nodiscard]] llvm::Type *llvm_type(Ty type) const;
  /// A new local of `type` (an alloca in the entry block).
  [[nodiscard]] llvm::Value *local(Ty type, const std::string &name);

  [[nodiscard]] Parsed<Typed> expr(const Expr &e);
  [[nodiscard]] Parsed<void> statements(const std::vector<Statement> &list);
  /// `v` converted to `to` as C converts on assignment.
  [[nodiscard]] Typed convert(Typed v, Ty to);

 private:
  Parsed<Ty> resolve_type(const std::string &name, uint32_t offset) const;
  Parsed<Typed> name(const Expr &e);
  Parsed<Typed> unary(const Expr &e);
  Parsed<Typed> binary(const Expr &e);
  Parsed<Typed> binary_values(const std::string &op, Typed l, Typed r, uint32_t offset);
  Parsed<Typed> ternary(const Expr &e);
  Parsed<Typed> call(const Expr &e);
  Parsed<Typed> numeric(Typed v, uint32_t offset, const std::string &op);
  Typed to_bool(Typed v);
  Typed int_divide(bool remainder, Typed l, Typed r);
  Parsed<void> statement(const Statement &s);
  std::string known_names() const;

  llvm::IRBuilder<> &b_;
  llvm::BasicBlock *entry_;
  std::vector<std::pair<std::string, Ty>> type_names_;
  std::map<std::string, Binding> names_;
};

}  // namespace kiln::runtime::lang

#endif  // KILN_RUNTIME_KERNEL_LANGUAGE_EMITTER_H_
