// Access to the host device-runtime bitcode that kiln_embed_bitcode() (cmake/KilnDeviceBitcode.cmake)
// links into kiln_codegen. The symbol names follow the bitcode target name used in
// runtime/CMakeLists.txt: kiln_device_runtime_host.
#include <cstddef>
#include <cstdint>
#include <span>

#include "kiln/runtime/cpu_jit.h"

extern "C" const uint8_t kiln_bitcode_kiln_device_runtime_host_begin[];
extern "C" const uint8_t kiln_bitcode_kiln_device_runtime_host_end[];

namespace kiln::runtime {

std::span<const uint8_t> host_runtime_bitcode() {
  const auto size = static_cast<std::size_t>(kiln_bitcode_kiln_device_runtime_host_end -
                                             kiln_bitcode_kiln_device_runtime_host_begin);
  return {kiln_bitcode_kiln_device_runtime_host_begin, size};
}

}  // namespace kiln::runtime
