// The control API of a fake GPU driver (test/fake_cuda, test/fake_hip) for in-process tests,
// resolved on the same handle kiln's loader opens (dlopen refcounts it, so there is one fake
// state). Both fakes export the same functions, prefixed kiln_fake_cuda_ / kiln_fake_hip_.
#ifndef KILN_TEST_FAKE_GPU_HANDLE_H_
#define KILN_TEST_FAKE_GPU_HANDLE_H_

#include <dlfcn.h>

#include <cstdlib>
#include <optional>
#include <string>

#include <catch2/catch.hpp>

namespace kiln::test {

struct FakeGpu {
  void *handle = nullptr;
  void (*reset)() = nullptr;
  int (*inject_fault)(const char *, unsigned long long, int) = nullptr;
  unsigned long long (*call_count)(const char *) = nullptr;
  size_t (*held_bytes)() = nullptr;
  int (*set_mode)(const char *) = nullptr;
  int (*set_arch)(const char *) = nullptr;
  size_t (*last_module_target_into)(char *, size_t) = nullptr;
  size_t (*device_held_bytes)(int) = nullptr;  ///< device `ordinal`'s held bytes (0: none such)
  /// Device `ordinal`'s sticky error (a driver code; 0: none, or no such device).
  int (*device_sticky_error)(int) = nullptr;
  /// Contexts made on device `ordinal` since the last reset (0: none ever, or no such device).
  unsigned long long (*device_contexts)(int) = nullptr;
  unsigned long long (*device_launch_count)(int) = nullptr;  ///< launches that ran on `ordinal`

  /// The target of the module loaded last ("sm_90", "gfx942"; "" before any).
  [[nodiscard]] std::string last_module_target() const {
    char target[64] = {};
    last_module_target_into(target, sizeof target);
    return target;
  }

  /// Points kiln at `library` through `env_var` (KILN_CUDA_DRIVER, KILN_HIP_RUNTIME), opens it
  /// and resolves <prefix>reset, ... ("kiln_fake_cuda_"); fails the test if it cannot.
  static FakeGpu open(const char *library, const char *env_var, const std::string &prefix) {
    std::string why;
    std::optional<FakeGpu> f = try_open(library, env_var, prefix, &why);
    INFO(why);
    REQUIRE(f);
    REQUIRE(f->handle != nullptr);
    const auto as_ptr = [](auto fn) { return reinterpret_cast<const void *>(fn); };
    for (const void *fn : {as_ptr(f->reset), as_ptr(f->inject_fault), as_ptr(f->call_count),
                           as_ptr(f->held_bytes), as_ptr(f->set_mode), as_ptr(f->set_arch),
                           as_ptr(f->last_module_target_into)})
      REQUIRE(fn != nullptr);
    return *f;
  }

  /// As open(), but nullopt with `*why` saying what failed (dlopen's or dlsym's answer) when the
  /// library does not load or lacks an entry point.
  static std::optional<FakeGpu> try_open(const char *library, const char *env_var,
                                         const std::string &prefix, std::string *why) {
    setenv(env_var, library, 1);
    FakeGpu f;
    f.handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (f.handle == nullptr) {
      *why = std::string("dlopen: ") + dlerror();
      return std::nullopt;
    }
    bool ok = true;
    const auto get = [&](auto &fn, const char *name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(f.handle, (prefix + name).c_str()));
      if (fn == nullptr && ok) *why = library + std::string(" has no ") + prefix + name;
      ok = ok && fn != nullptr;
    };
    get(f.reset, "reset");
    get(f.inject_fault, "inject_fault");
    get(f.call_count, "call_count");
    get(f.held_bytes, "held_bytes");
    get(f.set_mode, "set_mode");
    get(f.set_arch, "set_arch");
    get(f.last_module_target_into, "last_module_target");
    get(f.device_held_bytes, "device_held_bytes");
    get(f.device_sticky_error, "device_sticky_error");
    get(f.device_contexts, "device_contexts");
    get(f.device_launch_count, "device_launch_count");
    if (!ok) return std::nullopt;
    return f;
  }
};

}  // namespace kiln::test

#endif  // KILN_TEST_FAKE_GPU_HANDLE_H_
