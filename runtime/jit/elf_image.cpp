#include "kiln/runtime/elf_image.h"

#include <algorithm>
#include <cstring>

namespace kiln::runtime {
namespace {

// ELF-64 offsets and constants (System V ABI, ELF-64 object file format).
constexpr std::size_t kEhdrSize = 64;
constexpr uint8_t kClass64 = 2, kDataLsb = 1;
constexpr uint32_t kShtSymtab = 2, kShtNobits = 8, kShtDynsym = 11;
constexpr uint8_t kSttFunc = 2, kStbGlobal = 1, kStbWeak = 2;
constexpr std::size_t kSymSize = 24;

template <class T>
bool load(std::span<const std::byte> image, uint64_t offset, T *value) {
  if (offset > image.size() || sizeof(T) > image.size() - offset) return false;
  std::memcpy(value, image.data() + offset, sizeof(T));  // little-endian host assumed (x86-64)
  return true;
}

struct Section {
  uint32_t name = 0;
  uint32_t type = 0;
  uint32_t link = 0;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t entsize = 0;
};

bool section(std::span<const std::byte> image, uint64_t shoff, uint16_t shentsize, uint64_t index,
             Section *s) {
  const uint64_t base = shoff + index * shentsize;
  return load(image, base, &s->name) && load(image, base + 4, &s->type) && load(image, base + 24, &s->offset) &&
         load(image, base + 32, &s->size) && load(image, base + 40, &s->link) &&
         load(image, base + 56, &s->entsize);
}

}  // namespace

bool read_elf_image(std::span<const std::byte> image, ElfImageInfo *info, std::string *error) {
  const auto bad = [&](const char *why) {
    *error = why;
    return false;
  };
  if (image.size() < kEhdrSize || std::memcmp(image.data(), "\x7f" "ELF", 4) != 0)
    return bad("not an ELF image (no \\x7fELF magic)");
  if (static_cast<uint8_t>(image[4]) != kClass64 || static_cast<uint8_t>(image[5]) != kDataLsb)
    return bad("not a 64-bit little-endian ELF image");
  ElfImageInfo out;
  out.os_abi = static_cast<uint8_t>(image[7]);
  out.abi_version = static_cast<uint8_t>(image[8]);
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0;
  if (!load(image, 16, &out.type) || !load(image, 18, &out.machine) || !load(image, 48, &out.flags) ||
      !load(image, 40, &shoff) || !load(image, 58, &shentsize) || !load(image, 60, &shnum))
    return bad("truncated ELF header");
  if (shnum != 0 && shentsize < 64) return bad("ELF section headers are too small");
  // Function symbols: .dynsym when present (what a loader sees), else .symtab.
  for (const uint32_t wanted : {kShtDynsym, kShtSymtab}) {
    for (uint64_t i = 0; i < shnum; ++i) {
      Section symbols, strings;
      if (!section(image, shoff, shentsize, i, &symbols)) return bad("ELF section header outside the image");
      if (symbols.type != wanted) continue;
      if (symbols.link >= shnum || !section(image, shoff, shentsize, symbols.link, &strings) ||
          strings.offset > image.size() || strings.size > image.size() - strings.offset ||
          symbols.offset > image.size() || symbols.size > image.size() - symbols.offset)
        return bad("ELF symbol table outside the image");
      const std::string_view names(reinterpret_cast<const char *>(image.data()) + strings.offset,
                                   strings.size);
      for (uint64_t at = symbols.offset; at + kSymSize <= symbols.offset + symbols.size; at += kSymSize) {
        uint32_t name = 0;
        uint8_t st_info = 0;
        uint16_t shndx = 0;
        if (!load(image, at, &name) || !load(image, at + 4, &st_info) || !load(image, at + 6, &shndx))
          return bad("ELF symbol outside the image");
        const uint8_t bind = st_info >> 4, type = st_info & 0xf;
        if (type != kSttFunc || (bind != kStbGlobal && bind != kStbWeak) || shndx == 0) continue;
        if (name >= names.size()) return bad("ELF symbol name outside its string table");
        const std::string_view rest = names.substr(name);
        out.functions.emplace_back(rest.substr(0, rest.find('\0')));
      }
    }
    if (!out.functions.empty()) break;
  }
  *info = std::move(out);
  return true;
}

std::optional<std::span<const std::byte>> find_elf_section(std::span<const std::byte> image, std::string_view name) {
  if (image.size() < kEhdrSize || std::memcmp(image.data(), "\x7f" "ELF", 4) != 0 ||
      static_cast<uint8_t>(image[4]) != kClass64 || static_cast<uint8_t>(image[5]) != kDataLsb)
    return std::nullopt;
  uint64_t shoff = 0;
  uint16_t shentsize = 0, shnum = 0, shstrndx = 0;
  if (!load(image, 40, &shoff) || !load(image, 58, &shentsize) || !load(image, 60, &shnum) ||
      !load(image, 62, &shstrndx) || shentsize < 64 || shstrndx >= shnum)
    return std::nullopt;
  const auto contents = [&](const Section &s) -> std::optional<std::span<const std::byte>> {
    if (s.offset > image.size() || s.size > image.size() - s.offset) return std::nullopt;
    return image.subspan(s.offset, s.size);
  };
  Section names_section;
  if (!section(image, shoff, shentsize, shstrndx, &names_section)) return std::nullopt;
  const auto names = contents(names_section);
  if (!names) return std::nullopt;
  const std::string_view table(reinterpret_cast<const char *>(names->data()), names->size());
  for (uint64_t i = 0; i < shnum; ++i) {
    Section s;
    if (!section(image, shoff, shentsize, i, &s) || s.name >= table.size()) return std::nullopt;
    const std::string_view rest = table.substr(s.name);
    if (rest.substr(0, rest.find('\0')) != name) continue;
    return s.type == kShtNobits ? std::nullopt : contents(s);
  }
  return std::nullopt;
}

uint64_t elf_image_size(const void *image) {
  const std::span<const std::byte> header(static_cast<const std::byte *>(image), kEhdrSize);
  if (std::memcmp(header.data(), "\x7f" "ELF", 4) != 0 || static_cast<uint8_t>(header[4]) != kClass64 ||
      static_cast<uint8_t>(header[5]) != kDataLsb)
    return 0;
  uint64_t phoff = 0, shoff = 0;
  uint16_t phentsize = 0, phnum = 0, shentsize = 0, shnum = 0;
  (void)load(header, 32, &phoff);
  (void)load(header, 40, &shoff);
  (void)load(header, 54, &phentsize);
  (void)load(header, 56, &phnum);
  (void)load(header, 58, &shentsize);
  (void)load(header, 60, &shnum);
  const uint64_t sections_end = shoff + uint64_t{shnum} * shentsize;
  const uint64_t programs_end = phoff + uint64_t{phnum} * phentsize;
  return std::max({kEhdrSize, sections_end, programs_end});
}

std::string_view amdgpu_processor(uint32_t e_flags) {
  switch (e_flags & kElfAmdgpuMachMask) {
    case 0x030: return "gfx908";
    case 0x036: return "gfx1030";
    case 0x03f: return "gfx90a";
    case 0x041: return "gfx1100";
    case 0x046: return "gfx1101";
    case 0x047: return "gfx1102";
    case 0x048: return "gfx1200";
    case 0x04c: return "gfx942";
    case 0x04e: return "gfx1201";
    default: return {};
  }
}

}  // namespace kiln::runtime
