// The HSACO code objects built into kiln (runtime/internal/kiln/runtime/embedded_code.h): each is
// an ELF shared object for EM_AMDGPU / ELFOSABI_AMDGPU_HSA whose EF_AMDGPU_MACH is its gfx
// target and which exports the 24 kiln_<op>_<dtype>_gpu kernels; Program picks them.
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kiln/executor/errors.h"
#include "kiln/executor/program.h"
#include "kiln/runtime/amdgcn_codegen.h"
#include "kiln/runtime/embedded_code.h"
#include "kiln/runtime/elf_image.h"
#include "kiln/runtime/user_kernel_abi.h"
#include "kernel_sources.h"
#include "hsaco_linker.h"

using namespace kiln;
using namespace kiln::runtime;

// The processors (gfx90a, gfx942, gfx1100) and the other CDNA/RDNA ones LLVM 19 builds.
const std::set<std::string> kExpectedTargets{"gfx90a",  "gfx942",  "gfx1100", "gfx908", "gfx1030",
                                             "gfx1101", "gfx1102", "gfx1200", "gfx1201"};

TEST_CASE("gfx90a first, then gfx942, gfx1100 and every other CDNA/RDNA target, all from LLVM 19",
          "[amdgpu][codegen]") {
  std::set<std::string> built;
  for (const AmdgcnCodeObject &object : amdgcn_code_objects()) built.emplace(object.target);
  REQUIRE_FALSE(amdgcn_code_objects().empty());
  CHECK(amdgcn_code_objects().front().target == "gfx90a");
  CHECK(built == kExpectedTargets);
  for (const char *target : {"gfx906", "gfx1151", "gfx950"}) {  // not built (gfx950: LLVM 20)
    auto missing = amdgcn_code_object(target);
    REQUIRE_FALSE(missing);
    CHECK(missing.error().result == RhiResult::not_supported);
    CHECK_THAT(missing.error().message(), Catch::Contains(target) && Catch::Contains("gfx942"));
  }
  CHECK(value_or_throw(amdgcn_code_object()).target == "gfx90a");
  CHECK(value_or_throw(amdgcn_code_object("gfx1030:xnack-")).target == "gfx1030");
  CHECK(value_or_throw(amdgcn_code_object("gfx942:sramecc+:xnack-")).target == "gfx942");
}

TEST_CASE("every code object is an AMDGPU HSA ELF for its own gfx target with all 24 kernels",
          "[amdgpu][codegen]") {
  for (const AmdgcnCodeObject &object : amdgcn_code_objects()) {
    INFO(object.target);
    ElfImageInfo info;
    std::string error;
    REQUIRE(read_elf_image(std::as_bytes(object.image), &info, &error));
    CHECK(info.machine == kElfMachineAmdgpu);  // EM_AMDGPU = 224
    CHECK(info.os_abi == kElfOsAbiAmdgpuHsa);
    CHECK(info.abi_version == kElfAbiVersionAmdgpuHsaV5);  // code object v5, pinned at build
    CHECK(info.type == 3);  // ET_DYN: linked by ld.lld -shared
    CHECK(amdgpu_processor(info.flags) == object.target);
    CHECK(elf_image_size(object.image.data()) == object.image.size());
    std::set<std::string> kernels;
    for (const std::string &name : info.functions)
      if (name.ends_with("_gpu")) kernels.insert(name);
    CHECK(kernels.size() == KILN_NUM_KERNELS);
    CHECK(kernels.contains("kiln_axpy_f32_gpu"));
    CHECK(kernels.contains("kiln_compact_positive_i64_gpu"));
  }
}

TEST_CASE("Program::create(amdgcn) holds the chosen code object and knows its kernels",
          "[amdgpu][codegen]") {
  auto program = value_or_throw(Program::create(CodegenArch::amdgcn));
  CHECK(program->arch() == CodegenArch::amdgcn);
  CHECK(program->has_kernel("kiln_matmul_f64"));
  CHECK_FALSE(program->has_kernel("kiln_matmul_f16"));
  const AmdgcnCodeObject gfx90a = value_or_throw(amdgcn_code_object("gfx90a"));
  CHECK(program->code_size_bytes() == gfx90a.image.size());
  CHECK(program->code_image().size() == gfx90a.image.size());
  auto gfx1030 = value_or_throw(Program::create(CodegenArch::amdgcn, "gfx1030"));
  CHECK(gfx1030->code_size_bytes() == value_or_throw(amdgcn_code_object("gfx1030")).image.size());
  for (const char *target : {"gfx942", "gfx1100", "gfx1201"}) {
    INFO(target);
    auto chosen = value_or_throw(Program::create(CodegenArch::amdgcn, target));
    CHECK(chosen->code_size_bytes() == value_or_throw(amdgcn_code_object(target)).image.size());
    CHECK(chosen->has_kernel("kiln_matmul_f64"));
  }
  auto absent = Program::create(CodegenArch::amdgcn, "gfx906");
  REQUIRE_FALSE(absent);
  CHECK(absent.error().result == RhiResult::not_supported);
  CHECK_FALSE(Program::create(CodegenArch::nvptx64, "gfx90a"));  // a target only for amdgcn
}

TEST_CASE("the ELF reader refuses what is not a 64-bit little-endian ELF", "[amdgpu][codegen]") {
  ElfImageInfo info;
  std::string error;
  const std::string ptx(128, '.');
  CHECK_FALSE(read_elf_image(std::as_bytes(std::span(ptx.data(), ptx.size())), &info, &error));
  CHECK_THAT(error, Catch::Contains("not an ELF"));
  std::string elf32 = "\x7f" "ELF";
  elf32 += '\x01';  // ELFCLASS32
  elf32.resize(64, '\0');
  CHECK_FALSE(read_elf_image(std::as_bytes(std::span(elf32.data(), elf32.size())), &info, &error));
  CHECK(elf_image_size(elf32.data()) == 0);
}

namespace {

// z[i] = (x[i] - y[i])^2 * scale, and a device-heap allocation: a user kernel that calls into the
// device runtime, so the HSACO links kiln's amdgcn runtime as well as the user's code.
const std::string kUserIr = kiln::test::squared_diff_ir(/*heap_scratch=*/true);
constexpr UserValueType kUserParams[] = {UserValueType::ptr, UserValueType::ptr, UserValueType::ptr,
                                         UserValueType::f32};

std::span<const std::byte> user_ir() { return std::as_bytes(std::span(kUserIr.data(), kUserIr.size())); }

}  // namespace

TEST_CASE("a user kernel's HSACO, linked at run time, is a code object v5 for its processor with the "
          "user's IR in a section of its own",
          "[amdgpu][codegen][user_kernel]") {
  CHECK(can_generate_hsaco() == static_cast<bool>(KILN_EXPECT_HSACO));  // the build's choice, kept
  if (!KILN_EXPECT_HSACO) {
    WARN("built with -DKILN_AMDGPU_USER_KERNELS=OFF (or KILN_LLVM_STATIC): no user HSACO");
    return;
  }
  for (const char *target : {"gfx90a", "gfx942:sramecc+:xnack-", "gfx1100", "gfx1201"}) {
    INFO(target);
    const std::vector<std::byte> image = value_or_throw(generate_user_hsaco(user_ir(), "squared_diff", kUserParams,
                                                                           target, "amdgpu:0"));
    ElfImageInfo info;
    std::string error;
    REQUIRE(read_elf_image(image, &info, &error));
    CHECK(info.machine == kElfMachineAmdgpu);
    CHECK(info.os_abi == kElfOsAbiAmdgpuHsa);
    CHECK(info.abi_version == kElfAbiVersionAmdgpuHsaV5);
    CHECK(info.type == 3);  // ET_DYN: lld -shared
    CHECK(amdgpu_processor(info.flags) == std::string_view(target).substr(0, std::string_view(target).find(':')));
    CHECK(elf_image_size(image.data()) == image.size());
    CHECK(info.functions == std::vector<std::string>{kUserGpuEntryName});  // the one kernel, exported
    const auto section = find_elf_section(image, kUserModuleSection);
    REQUIRE(section);
    std::string ir, entry;
    std::vector<UserValueType> params;
    REQUIRE(parse_user_module_comment(
        std::string_view(reinterpret_cast<const char *>(section->data()), section->size()), &ir, &entry, &params));
    CHECK(ir == kUserIr);
    CHECK(entry == "squared_diff");
    CHECK(params == std::vector<UserValueType>(std::begin(kUserParams), std::end(kUserParams)));
  }
}

TEST_CASE("a user HSACO for a processor kiln has no code object for is not supported; bad IR is a compile error",
          "[amdgpu][codegen][user_kernel][bad-input]") {
  if (!KILN_EXPECT_HSACO) return;  // not_supported for every processor then
  for (const char *processor : {"gfx600", "gfx9-generic", "gfx906"}) {  // LLVM knows them; kiln builds none
    auto refused = generate_user_hsaco(user_ir(), "squared_diff", kUserParams, processor, "amdgpu:0");
    REQUIRE_FALSE(refused);
    CHECK(refused.error().result == RhiResult::not_supported);
    CHECK(refused.error().device == "amdgpu:0");
    CHECK_THAT(refused.error().message(), Catch::Contains(processor) && Catch::Contains("gfx90a"));
  }
  auto unknown = generate_user_hsaco(user_ir(), "squared_diff", kUserParams, "gfx9999", "amdgpu:0");
  REQUIRE_FALSE(unknown);
  CHECK(unknown.error().result == RhiResult::not_supported);
  CHECK_THAT(unknown.error().message(), Catch::Contains("gfx9999"));
  const std::string bad = "define void @k(ptr %ctx) {\n  ret i32 0\n}\n";
  auto refused = generate_user_hsaco(std::as_bytes(std::span(bad.data(), bad.size())), "k", {}, "gfx90a", "amdgpu:0");
  REQUIRE_FALSE(refused);
  CHECK(refused.error().result == RhiResult::invalid_usage);
  CHECK(refused.error().kernel_compile);
}

TEST_CASE("find_elf_section reads only inside the image", "[amdgpu][codegen][bad-input]") {
  const std::span<const std::byte> image = std::as_bytes(value_or_throw(amdgcn_code_object("gfx90a")).image);
  CHECK(find_elf_section(image, ".text"));
  CHECK_FALSE(find_elf_section(image, kUserModuleSection));  // kiln's own code objects have none
  CHECK_FALSE(find_elf_section(image.first(image.size() / 2), ".text"));  // section headers cut off
}

TEST_CASE("lld's fatal error on a malformed object is a failed link, never the end of the process",
          "[amdgpu][codegen][user_kernel][bad-input]") {
  if (!KILN_EXPECT_HSACO) return;  // built without lld: nothing to link
  REQUIRE(have_hsaco_linker());
  // An object whose section header table lies past its end: lld calls fatal(), whose exitLld
  // would _exit(1) without crash recovery. In a child process, as lld cannot link again in a
  // process after a fatal error (lld::Result::canRunAgain): the child exits 0 only when
  // link_hsaco returned the failure, and 2 when the next link is refused by name.
  const std::span<const uint8_t> image = value_or_throw(amdgcn_code_object("gfx90a")).image;
  std::vector<char> bad(image.begin(), image.end());
  const uint64_t far_away = uint64_t{1} << 40;
  std::memcpy(bad.data() + 40, &far_away, sizeof far_away);  // e_shoff
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    auto linked = link_hsaco(bad, "amdgpu:0");
    if (linked || linked.error().result != RhiResult::error ||
        linked.error().message().find("lld could not link") == std::string::npos)
      _exit(1);
    auto again = link_hsaco(bad, "amdgpu:0");
    _exit(!again && again.error().message().find("unable to run again") != std::string::npos ? 0 : 2);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("link_hsaco refuses what is not an object, named, and links again after", "[amdgpu][codegen][bad-input]") {
  if (!KILN_EXPECT_HSACO) return;  // built without lld: nothing to link
  REQUIRE(have_hsaco_linker());
  const std::string text = "not an object";
  auto refused = link_hsaco(text, "amdgpu:0");
  REQUIRE_FALSE(refused);
  CHECK(refused.error().result == RhiResult::error);
  CHECK_THAT(refused.error().message(), Catch::Contains("lld could not link the code object"));
  CHECK(generate_user_hsaco(user_ir(), "squared_diff", kUserParams, "gfx90a", "amdgpu:0"));  // lld still works
}

TEST_CASE("find_elf_section refuses section headers that point outside the image", "[amdgpu][codegen][bad-input]") {
  const std::span<const uint8_t> original = value_or_throw(amdgcn_code_object("gfx90a")).image;
  const auto patched = [&](std::size_t at, auto value) {
    std::vector<std::byte> bytes(std::as_bytes(original).begin(), std::as_bytes(original).end());
    std::memcpy(bytes.data() + at, &value, sizeof value);
    return bytes;
  };
  CHECK(find_elf_section(patched(0, uint8_t{0}), ".text") == std::nullopt);           // no ELF magic
  CHECK(find_elf_section(patched(62, uint16_t{0xffff}), ".text") == std::nullopt);    // e_shstrndx >= e_shnum
  CHECK(find_elf_section(patched(40, uint64_t{1} << 62), ".text") == std::nullopt);   // e_shoff far away
  // Every section's sh_offset far away: the name table cannot be read.
  uint64_t shoff = 0;
  uint16_t shnum = 0;
  std::memcpy(&shoff, original.data() + 40, sizeof shoff);
  std::memcpy(&shnum, original.data() + 60, sizeof shnum);
  std::vector<std::byte> far(std::as_bytes(original).begin(), std::as_bytes(original).end());
  for (uint16_t i = 0; i < shnum; ++i) {
    const uint64_t huge = uint64_t{1} << 62;
    std::memcpy(far.data() + shoff + i * 64 + 24, &huge, sizeof huge);
  }
  CHECK(find_elf_section(far, ".text") == std::nullopt);
}
