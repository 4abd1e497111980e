// Every function of the operation language, in float32 and float64, compiles for each GPU target
// or is not_supported naming itself (check_device_math): never an LLVM fatal error, a missing
// libcall or a code image the driver would refuse. The not_supported sets are the measured ones
// of runtime/jit/user_module.h; on cuda, CUDA's libdevice (KILN_LIBDEVICE: a stand-in here, the
// real one where the toolkit is installed) supplies them.
#include <cstdlib>
#include <optional>
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
        auto ptx = guard_host_exceptions("cuda", "test",
                                         [&] { return generate_user_ptx(bytes, "f", params, "sm_80", "cuda"); });
        if (ptx) {
          CHECK(ptx->find(".extern") == std::string::npos);  // nothing left for a library to supply
          continue;
        }
        failure = ptx.error();
      } else {
        auto hsaco = guard_host_exceptions(
            "amdgpu", "test", [&] { return generate_user_hsaco(bytes, "f", params, "gfx90a", "amdgpu"); });
        if (hsaco) continue;
        failure = hsaco.error();
      }
      CHECK(failure.result == RhiResult::not_supported);
      const std::string device = cuda ? "cuda: " : "amdgpu: ";
      CHECK_THAT(failure.message(), Catch::StartsWith(device + std::string(function) + " on "));
      refused.insert(key);
    }
  }
  return refused;
}

/// Sets an environment variable (KILN_LIBDEVICE, KILN_OCML) for the scope, then restores it.
class EnvSetting {
 public:
  EnvSetting(const char *name, const char *value) : name_(name) {
    if (const char *old = std::getenv(name)) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~EnvSetting() {
    if (old_) setenv(name_, old_->c_str(), 1);
    else unsetenv(name_);
  }

 private:
  const char *name_;
  std::optional<std::string> old_;
};

RhiExpected<std::string> cuda_ptx(const std::string &operation, UserValueType type) {
  const std::string ir = operation_ir(operation, 1, type);
  const UserValueType params[] = {UserValueType::ptr, UserValueType::ptr};
  return guard_host_exceptions("cuda", "test", [&] {
    return generate_user_ptx(std::as_bytes(std::span(ir.data(), ir.size())), "f", params, "sm_80", "cuda");
  });
}

}  // namespace

TEST_CASE("without libdevice, cuda's library math of every type is not supported, named, and everything "
          "else compiles",
          "[user_kernel][codegen][kernel_language]") {
  const EnvSetting none("KILN_LIBDEVICE", "none");
  std::set<std::string> expected;
  for (const char *f : {"exp", "exp2", "exp10", "log", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan",
                        "sinh", "cosh", "tanh", "pow"})
    for (const char *t : {"/f32", "/f64"}) expected.insert(std::string(f) + t);
  CHECK(refused_on(/*cuda=*/true) == expected);
  const auto exp = cuda_ptx("exp", UserValueType::f32);
  REQUIRE_FALSE(exp);
  CHECK_THAT(exp.error().message(), Catch::Contains("KILN_LIBDEVICE=none turned it off"));
}

TEST_CASE("on amdgpu without ocml, float32 exp, log, sin, cos and pow compile; the rest of the library math "
          "is not supported",
          "[amdgpu][user_kernel][codegen][kernel_language]") {
  if (!KILN_EXPECT_HSACO) return;  // built without AMDGPU user kernels
  const EnvSetting none("KILN_OCML", "none");
  std::set<std::string> expected{"tan/f32", "asin/f32", "acos/f32", "atan/f32", "sinh/f32", "cosh/f32", "tanh/f32"};
  for (const char *f : {"exp", "exp2", "exp10", "log", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan",
                        "sinh", "cosh", "tanh", "pow"})
    expected.insert(std::string(f) + "/f64");
  CHECK(refused_on(/*cuda=*/false) == expected);
}

TEST_CASE("with a libdevice, cuda links the functions a kernel calls from it, and names one it lacks",
          "[user_kernel][codegen][kernel_language]") {
  const EnvSetting stand_in("KILN_LIBDEVICE", KILN_STAND_IN_LIBDEVICE);
  const std::string exp = value_or_throw(cuda_ptx("exp", UserValueType::f32));
  CHECK(exp.find(".extern") == std::string::npos);
  CHECK(exp.find("0f40400000") != std::string::npos);  // the stand-in's x * 3.0f, inlined
  const std::string tanh = value_or_throw(cuda_ptx("tanh", UserValueType::f64));
  CHECK(tanh.find("0d4014000000000000") != std::string::npos);  // x * 5.0
  auto sin = cuda_ptx("sin", UserValueType::f32);
  REQUIRE_FALSE(sin);
  CHECK(sin.error().result == RhiResult::not_supported);
  CHECK_THAT(sin.error().message(), Catch::Contains("has no __nv_sinf") && Catch::Contains("stand_in_libdevice.ll"));
  CHECK(value_or_throw(cuda_ptx("sqrt", UserValueType::f32)).find(".extern") == std::string::npos);  // no library

  const EnvSetting missing("KILN_LIBDEVICE", "/nonexistent/libdevice.10.bc");
  auto unreadable = cuda_ptx("exp", UserValueType::f32);
  REQUIRE_FALSE(unreadable);
  CHECK(unreadable.error().result == RhiResult::not_supported);
  CHECK_THAT(unreadable.error().message(), Catch::Contains("cannot read CUDA's libdevice at /nonexistent"));
}

TEST_CASE("with the CUDA toolkit's libdevice, every function of the operation language compiles for cuda",
          "[user_kernel][codegen][kernel_language]") {
  const EnvSetting found("KILN_LIBDEVICE", nullptr);  // searched for: CUDA_HOME, /usr/local/cuda, Debian's path
  if (!find_libdevice()) {
    WARN("no CUDA toolkit libdevice on this machine: only the stand-in's test ran");
    return;
  }
  CHECK(refused_on(/*cuda=*/true).empty());
}

TEST_CASE("with ROCm's ocml (Debian's rocm-device-libs), every function of the operation language compiles "
          "for amdgpu",
          "[amdgpu][user_kernel][codegen][kernel_language]") {
  const EnvSetting found("KILN_OCML", nullptr);  // searched for: ROCM_PATH, /opt/rocm, Debian's path
  if (!KILN_EXPECT_HSACO) return;
  if (!find_ocml()) {  // scripts/install-deps.sh installs rocm-device-libs
    WARN("no ocml.bc on this machine (apt-get install rocm-device-libs): only the test without it ran");
    return;
  }
  CHECK(refused_on(/*cuda=*/false).empty());
  const EnvSetting missing("KILN_OCML", "/nonexistent/ocml.bc");
  const std::string ir = operation_ir("tanh", 1, UserValueType::f64);
  const UserValueType params[] = {UserValueType::ptr, UserValueType::ptr};
  auto unreadable =
      generate_user_hsaco(std::as_bytes(std::span(ir.data(), ir.size())), "f", params, "gfx90a", "amdgpu");
  REQUIRE_FALSE(unreadable);
  CHECK(unreadable.error().result == RhiResult::not_supported);
  CHECK_THAT(unreadable.error().message(), Catch::Contains("cannot read ROCm's ocml at /nonexistent/ocml.bc"));
}

TEST_CASE("an ocml that reads an oclc control kiln does not know is refused by name, not guessed",
          "[amdgpu][user_kernel][codegen]") {
  if (!KILN_EXPECT_HSACO) return;
  const EnvSetting future("KILN_OCML", KILN_OCML_UNKNOWN_CONTROL);
  const std::string ir = operation_ir("tanh", 1, UserValueType::f64);
  const UserValueType params[] = {UserValueType::ptr, UserValueType::ptr};
  auto refused = generate_user_hsaco(std::as_bytes(std::span(ir.data(), ir.size())), "f", params, "gfx90a", "amdgpu");
  REQUIRE_FALSE(refused);
  CHECK(refused.error().result == RhiResult::not_supported);
  CHECK_THAT(refused.error().message(), Catch::Contains("reads __oclc_future_knob, whose value kiln does not know"));
}

TEST_CASE("with ocml found, what amdgpu expands itself is not taken from ocml", "[amdgpu][user_kernel][codegen]") {
  if (!KILN_EXPECT_HSACO || !find_ocml()) return;  // nothing to compare
  const std::string ir = operation_ir("sin", 1, UserValueType::f32);
  const auto bytes = std::as_bytes(std::span(ir.data(), ir.size()));
  const UserValueType params[] = {UserValueType::ptr, UserValueType::ptr};
  const auto with = value_or_throw(generate_user_hsaco(bytes, "f", params, "gfx90a", "amdgpu"));
  const EnvSetting none("KILN_OCML", "none");
  const auto without = value_or_throw(generate_user_hsaco(bytes, "f", params, "gfx90a", "amdgpu"));
  CHECK(with == without);  // the same code: float32 sin is the back end's own either way
}

TEST_CASE("a vector of library math is refused by name: the libraries have scalar functions only",
          "[user_kernel][codegen][bad-input]") {
  const EnvSetting stand_in("KILN_LIBDEVICE", KILN_STAND_IN_LIBDEVICE);
  const std::string ir = R"(
declare <2 x double> @llvm.tanh.v2f64(<2 x double>)
define void @f(ptr %ctx, ptr %x) {
  %v = load <2 x double>, ptr %x
  %t = call <2 x double> @llvm.tanh.v2f64(<2 x double> %v)
  store <2 x double> %t, ptr %x
  ret void
}
)";
  const UserValueType params[] = {UserValueType::ptr};
  auto ptx = generate_user_ptx(std::as_bytes(std::span(ir.data(), ir.size())), "f", params, "sm_80", "cuda");
  REQUIRE_FALSE(ptx);
  CHECK(ptx.error().result == RhiResult::not_supported);
  CHECK_THAT(ptx.error().message(), Catch::Contains("tanh on a vector of float64 is not supported on cuda"));
}
