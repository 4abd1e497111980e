// The CPU JIT: compiles the embedded host device-runtime bitcode with LLVM ORC LLJIT and hands
// out the kernels of kernel_abi.h as function pointers.
#ifndef KILN_RUNTIME_CPU_JIT_H_
#define KILN_RUNTIME_CPU_JIT_H_

#include <cstdint>
#include <cstddef>
#include <memory>
#include <span>
#include <string_view>

#include "kiln/rhi/result.h"
#include "kiln/runtime/kernel_abi.h"
#include "kiln/runtime/user_kernel_abi.h"

namespace kiln::runtime {

/// The device runtime's heap allocator entry point (runtime_memory_allocate_aligned).
using KilnHeapAllocateFn = void (*)(KilnRuntime *runtime, uint64_t size_bytes,
                                    uint64_t alignment_bytes, uint64_t *result);

/// The host device-runtime module, JIT-compiled for this CPU. Kernel pointers stay valid for the
/// life of the CpuJit. All member functions are thread-safe.
class CpuJit {
 public:
  /// Parses the embedded host bitcode, optimizes it at O3 for the host CPU (its name and
  /// features), and JIT-compiles it eagerly with ORC LLJIT at aggressive codegen opt level.
  /// Errors: not_supported (the native target cannot be initialized or the host is not detected),
  ///         error (bitcode parse, optimization, or compilation failed; detail has LLVM's text).
  /// Thread-safe: may be called from several threads and several times; each call builds an
  /// independent JIT (a few hundred ms).
  [[nodiscard]] static RhiExpected<std::unique_ptr<CpuJit>> create();

  /// A user module (kernel_abi.h's user-kernel ABI: LLVM IR text or bitcode) with element
  /// function `entry` taking `params` after its context, linked with what it calls of the host
  /// device runtime, optimized like the runtime and JIT-compiled; lookup_kernel("kiln_user_entry")
  /// gives its range kernel. `device` ("cpu", "mock") names the device in failures.
  /// Errors: invalid_usage (site "user kernel") when the IR does not parse (line and column), does
  /// not verify, lacks `entry`, whose type is not void(ptr, params...), or calls what kiln does not
  /// provide; those of create() otherwise. Thread-safe; each call builds its own JIT.
  [[nodiscard]] static RhiExpected<std::unique_ptr<CpuJit>> create_user(
      std::span<const std::byte> ir, std::string_view entry, std::span<const UserValueType> params,
      const char *device);

  /// Looks up a kernel by name, e.g. "kiln_axpy_f32".
  /// Errors: invalid_usage (device "cpu", site "CpuJit::lookup_kernel") if the module defines no
  ///         kernel of that name; error if LLVM fails to resolve a defined one.
  [[nodiscard]] RhiExpected<KilnKernelFn> lookup_kernel(std::string_view name);

  /// Looks up runtime_memory_allocate_aligned (for tests and host-side heap checks).
  /// Errors: error if LLVM fails to resolve it.
  [[nodiscard]] RhiExpected<KilnHeapAllocateFn> lookup_heap_allocator();

  /// Size in bytes of the emitted object code (what the ledger charges as code_object).
  [[nodiscard]] uint64_t code_size_bytes() const;

  ~CpuJit();
  CpuJit(const CpuJit &) = delete;
  CpuJit &operator=(const CpuJit &) = delete;

  struct Impl;  ///< the JIT and its kernels (opaque: cpu_jit.cpp)

 private:
  explicit CpuJit(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_CPU_JIT_H_
