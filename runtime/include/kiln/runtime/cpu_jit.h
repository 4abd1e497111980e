// The CPU JIT: compiles the embedded host device-runtime bitcode with LLVM ORC LLJIT and hands
// out the kernels of kernel_abi.h as function pointers.
#ifndef KILN_RUNTIME_CPU_JIT_H_
#define KILN_RUNTIME_CPU_JIT_H_

#include <cstdint>
#include <memory>
#include <string_view>

#include "kiln/rhi/result.h"
#include "kiln/runtime/kernel_abi.h"

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

 private:
  struct Impl;
  explicit CpuJit(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_CPU_JIT_H_
