// A minimal reader of ELF64 little-endian images: the header fields that say what a GPU code
// object is for, and the names of the functions it exports. Used by Program (which kernels an
// HSACO has), by the code-object tests (e_machine, e_flags) and by the fake HIP runtime
// (hipModuleLoadData). Depends on nothing but the C++ library, so the fake can compile it in.
// Field layout: the System V ABI's ELF-64 object file format.
#ifndef KILN_RUNTIME_ELF_IMAGE_H_
#define KILN_RUNTIME_ELF_IMAGE_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::runtime {

inline constexpr uint16_t kElfMachineAmdgpu = 224;      ///< EM_AMDGPU
inline constexpr uint8_t kElfOsAbiAmdgpuHsa = 64;       ///< ELFOSABI_AMDGPU_HSA
inline constexpr uint32_t kElfAmdgpuMachMask = 0x0ff;   ///< EF_AMDGPU_MACH
inline constexpr uint8_t kElfAbiVersionAmdgpuHsaV5 = 3; ///< ELFABIVERSION_AMDGPU_HSA_V5 (code object v5)

struct ElfImageInfo {
  uint16_t type = 0;     ///< e_type (3 = ET_DYN, a shared object: what ld.lld -shared writes)
  uint16_t machine = 0;  ///< e_machine
  uint32_t flags = 0;    ///< e_flags (AMDGPU: the processor in EF_AMDGPU_MACH, xnack/sramecc)
  uint8_t os_abi = 0;
  uint8_t abi_version = 0;
  /// Global or weak STT_FUNC symbols defined in .dynsym (or .symtab when there is no .dynsym).
  std::vector<std::string> functions;
};

/// Reads `image`. On success fills *info and returns true; otherwise writes why to *error
/// (not ELF, not 64-bit little-endian, a header or section that lies outside the image) and
/// returns false. Never reads outside `image`.
[[nodiscard]] bool read_elf_image(std::span<const std::byte> image, ElfImageInfo *info,
                                  std::string *error);

/// The contents of the section named `name` of `image` (an ELF64 little-endian image), found
/// through the section-name string table (e_shstrndx); nullopt when there is no such section or
/// the image is malformed (a header, name or section outside the image). Never reads outside
/// `image`; a section of type SHT_NOBITS has no contents and is not returned.
[[nodiscard]] std::optional<std::span<const std::byte>> find_elf_section(std::span<const std::byte> image,
                                                                         std::string_view name);

/// The size in bytes of the ELF64 image that starts at `image` (which must have 64 readable
/// bytes), from its header: the end of the section or program header table, whichever is later
/// (ld.lld writes the section headers last). 0 if `image` is no ELF64 little-endian header. For
/// loaders given a bare pointer, as hipModuleLoadData is.
[[nodiscard]] uint64_t elf_image_size(const void *image);

/// The gfx processor an AMDGPU e_flags names, for the processors kiln builds code objects for
/// (the EF_AMDGPU_MACH values of LLVM 19's BinaryFormat/ELF.h); empty otherwise.
[[nodiscard]] std::string_view amdgpu_processor(uint32_t e_flags);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_ELF_IMAGE_H_
