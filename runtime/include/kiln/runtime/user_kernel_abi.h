// The value types of a user kernel's parameters (kernel_abi.h's user-kernel ABI), as the host
// side declares them: what each LLVM parameter of an element function after its context is.
#ifndef KILN_RUNTIME_USER_KERNEL_ABI_H_
#define KILN_RUNTIME_USER_KERNEL_ABI_H_

#include <cstdint>
#include <string_view>

namespace kiln::runtime {

/// The range kernel (a KilnKernelFn) kiln generates around a user's element function.
inline constexpr const char *kUserEntryName = "kiln_user_entry";

/// A parameter's LLVM type: `ptr` (an array's first element) or a scalar.
enum class UserValueType : uint8_t { ptr, f32, f64, i32, i64 };

/// The LLVM IR spelling: "ptr", "float", "double", "i32", "i64".
[[nodiscard]] constexpr std::string_view llvm_spelling(UserValueType type) {
  switch (type) {
    case UserValueType::ptr: return "ptr";
    case UserValueType::f32: return "float";
    case UserValueType::f64: return "double";
    case UserValueType::i32: return "i32";
    case UserValueType::i64: return "i64";
  }
  return "?";
}

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_USER_KERNEL_ABI_H_
