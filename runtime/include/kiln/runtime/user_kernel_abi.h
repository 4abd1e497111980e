// The value types of a user kernel's parameters (kernel_abi.h's user-kernel ABI), as the host
// side declares them: what each LLVM parameter of an element function after its context is.
#ifndef KILN_RUNTIME_USER_KERNEL_ABI_H_
#define KILN_RUNTIME_USER_KERNEL_ABI_H_

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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

/// The GPU entry point kiln generates around kUserEntryName: `kernel void(ptr runtime, ptr args)`,
/// a grid-stride loop (thread g runs indices g, g + G, ... of [0, args->num_elements), G the
/// grid's threads), the same shape as the built-in elementwise kernels.
inline constexpr const char *kUserGpuEntryName = "kiln_user_entry_gpu";

/// The ELF section of a user kernel's HSACO that holds user_module_comment's text. It has no
/// flags, so it is in no segment: a loader never copies it to the device.
inline constexpr const char *kUserModuleSection = ".kiln.user_module";

/// The comment line that ends a user kernel's PTX, "// kiln-user-module <entry> <types> <hex IR>":
/// the user's IR as given, for the fake CUDA driver, which runs that IR JIT-compiled for the host
/// (test/fake_gpu); a driver ignores comments. A user kernel's HSACO carries the same text in its
/// section kUserModuleSection, for the fake HIP runtime.
[[nodiscard]] std::string user_module_comment(std::span<const std::byte> ir, std::string_view entry,
                                              std::span<const UserValueType> params);
/// The parts of a user_module_comment found in `text` (a whole PTX image, or the contents of an
/// HSACO's kUserModuleSection; the last such line counts); false when it has none or it is
/// malformed.
[[nodiscard]] bool parse_user_module_comment(std::string_view text, std::string *ir, std::string *entry,
                                             std::vector<UserValueType> *params);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_USER_KERNEL_ABI_H_
