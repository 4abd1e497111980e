// Every function of the operation language, in float32 and float64, compiles for each GPU target
// or is not_supported naming itself (check_device_math): never an LLVM fatal error, a missing
// libcall or a code image the driver would refuse. The not_supported sets are the measured ones
// of runtime/jit/user_module.h.
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kiln/executor/errors.h"
#include "kiln/runtime/amdgcn_codegen.h"
#include "kiln/runtime/host_memory_guard.h"
#include "kiln/runtime/kernel_language.h"
#include "kiln/runtime/ptx_codegen.h"

using namespace kiln;
using namespace kiln::runtime;

namespace {

/// y = f(x, x, ...) for `function` of `arity`, as the operation language compiles it.
std::string operation_ir(std::string_view function, int arity, UserValueType type) {
  std::string call = std::string(function) + "(x";
  for (int k = 1; k < arity; ++k) call += ", x";
  ElementwiseSource source;
  source.name = "f";
  source.operation = "y = " + call + ")";
  source.params = {{"x", type, true, false, {}}, {"y", type, true, true, {}}};
  return value_or_throw(build_elementwise_ir(source, "test"));
}

/// The functions a target refused, "exp/f64", as compiling `y = f(x)` for it answered.
std::set<std::string> refused_on(bool cuda) {
  install_llvm_error_handlers();
  std::set<std::string> refused;
  const UserValueType params[] = {UserValueType::ptr, UserValueType::ptr};
  for (const UserValueType type : {UserValueType::f32, UserValueType::f64}) {
    for (const auto &[function, arity] : kKernelFunctions) {
      const std::string ir = operation_ir(function, arity, type);
      const auto bytes = std::as_bytes(std::span(ir.data(), ir.size()));
      const std::string key = std::string(function) + (type == UserValueType::f32 ? "/f32" : "/f64");
      INFO(key);
      Failure failure;
      if (cuda) {
        auto ptx = guard_host_exceptions("cuda", "test", [&] { return generate_user_ptx(bytes, "f", params, "sm_80", "cuda"); });
        if (ptx) {
          CHECK(ptx->find(".extern") == std::string::npos);  // nothing left for a library to supply
          continue;
        }
        failure = ptx.error();
      } else {
        auto hsaco = guard_host_exceptions("amdgpu", "test", [&] { return generate_user_hsaco(bytes, "f", params, "gfx90a", "amdgpu"); });
        if (hsaco) continue;
        failure = hsaco.error();
      }
      CHECK(failure.result == RhiResult::not_supported);
      CHECK_THAT(failure.message(), Catch::StartsWith(std::string(cuda ? "cuda: " : "amdgpu: ") + std::string(function) + " on "));
      refused.insert(key);
    }
  }
  return refused;
}

}  // namespace

TEST_CASE("on cuda the library math of every type is not supported, named, and everything else compiles",
          "[user_kernel][codegen][kernel_language]") {
  std::set<std::string> expected;
  for (const char *f : {"exp", "exp2", "exp10", "log", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan",
                        "sinh", "cosh", "tanh", "pow"})
    for (const char *t : {"/f32", "/f64"}) expected.insert(std::string(f) + t);
  CHECK(refused_on(/*cuda=*/true) == expected);
}

TEST_CASE("on amdgpu float32 exp, log, sin, cos and pow compile; float64 library math is not supported",
          "[amdgpu][user_kernel][codegen][kernel_language]") {
  std::set<std::string> expected{"tan/f32", "asin/f32", "acos/f32", "atan/f32", "sinh/f32", "cosh/f32", "tanh/f32"};
  for (const char *f : {"exp", "exp2", "exp10", "log", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan",
                        "sinh", "cosh", "tanh", "pow"})
    expected.insert(std::string(f) + "/f64");
  CHECK(refused_on(/*cuda=*/false) == expected);
}
