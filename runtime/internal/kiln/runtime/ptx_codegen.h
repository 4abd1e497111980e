// PTX for the CUDA backend: the device runtime module, compiled at build time to generic nvptx64
// bitcode (cmake/KilnDeviceBitcode.cmake), is turned into PTX text in process by LLVM's NVPTX
// back end for the SM version of the device at hand. The CUDA driver assembles that PTX with
// cuModuleLoadData (its JIT), so kiln needs no CUDA toolkit at build or run time.
#ifndef KILN_RUNTIME_PTX_CODEGEN_H_
#define KILN_RUNTIME_PTX_CODEGEN_H_

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "kiln/rhi/result.h"
#include "kiln/runtime/user_kernel_abi.h"

namespace kiln::runtime {

/// PTX text (NUL-free, ready for cuModuleLoadData once NUL-terminated, which std::string's
/// c_str() is) of the whole device runtime module for `sm_arch` ("sm_<major><minor>"; a
/// feature-set suffix, "sm_90a" or "sm_100f", is accepted and ignored). Every kiln_<op>_<dtype>_gpu
/// function of kernel_abi.h is a `.entry`, one GPU thread per task (grid and block are the
/// launcher's choice); the range kernels and the heap allocator are `.func`s it calls.
///
/// The module is optimized at O3 for the NVPTX target and emitted at aggressive codegen level.
/// The SM version written is the newest this LLVM knows that is not newer than `sm_arch` (LLVM 19
/// knows up to sm_90, so "sm_90" gives a native `.target sm_90`, and "sm_100" gives sm_90 PTX,
/// which the driver JIT-compiles); the PTX ISA version is the lowest that SM version needs (sm_80:
/// 7.0, sm_86: 7.1, sm_90: 7.8), not LLVM's default, so the PTX loads on the oldest driver that
/// supports the device: CUDA 11.0 for sm_80, 11.8 for sm_90, and every CUDA 12 and 13 driver
/// (which accept every PTX ISA version up to their own, 8.0 and 9.0).
///
/// Errors: invalid_usage (`sm_arch` is not of the form sm_<digits>[a|f]),
///         not_supported (this LLVM has no NVPTX target, or knows no SM version <= `sm_arch`),
///         error (the embedded bitcode does not parse or verify, or PTX emission failed; the
///         detail has LLVM's text). Never aborts; every llvm::Error is consumed.
/// Thread-safe. The first call per SM version takes a few hundred ms; the text is cached, so
/// later calls for the same SM version return a copy at once.
[[nodiscard]] RhiExpected<std::string> generate_ptx(std::string_view sm_arch = "sm_80");

/// PTX of a user module (kernel_abi.h's user-kernel ABI; checked as UserKernel::create checks it:
/// user_module.h) for `sm_arch`: the element function `entry` taking `params`, linked with what it
/// calls of the nvptx device runtime, wrapped in the range kernel kiln_user_entry and the GPU entry
/// point kUserGpuEntryName (a grid-stride loop over args->num_elements, at most 256 threads a
/// block), O3 as generate_ptx's, and ended by user_module_comment (for the fake CUDA driver).
/// Library math (exp, log, sin, tanh, pow, ...) calls CUDA's libdevice, linked in from the file
/// find_libdevice names. `device` names the device in failures.
/// Errors: invalid_usage (kernel_compile) as prepare_user_module's; those of generate_ptx;
/// not_supported for library math when no libdevice is found, or the one found cannot be read or
/// lacks the function.
/// Thread-safe (nothing cached: each call compiles).
[[nodiscard]] RhiExpected<std::string> generate_user_ptx(std::span<const std::byte> ir, std::string_view entry,
                                                         std::span<const UserValueType> params,
                                                         std::string_view sm_arch, const char *device);

/// CUDA's libdevice (libdevice.10.bc, the CUDA toolkit's math library) that generate_user_ptx
/// links for exp, log, sin, tanh, pow and their kin, which LLVM's NVPTX back end lacks:
/// $KILN_LIBDEVICE when set and not empty ("none": link none), else the first of
/// $CUDA_HOME/nvvm/libdevice/libdevice.10.bc, $CUDA_PATH/nvvm/libdevice/libdevice.10.bc,
/// /usr/local/cuda/nvvm/libdevice/libdevice.10.bc and Debian's
/// /usr/lib/nvidia-cuda-toolkit/libdevice/libdevice.10.bc that exists; nullopt when none.
/// generate_user_ptx links the first of those that parses. Thread-safe (reads the environment).
[[nodiscard]] std::optional<std::string> find_libdevice();

/// The number of an SM version "sm_<digits>" with an optional feature-set suffix "a" or "f"
/// (sm_80 -> 80, sm_90a -> 90, sm_100f -> 100); nullopt if malformed.
[[nodiscard]] std::optional<int> parse_sm_version(std::string_view sm_arch);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_PTX_CODEGEN_H_
