// The HSACO code objects built into kiln (runtime/include/kiln/runtime/amdgcn_codegen.h): each is
// an ELF shared object for EM_AMDGPU / ELFOSABI_AMDGPU_HSA whose EF_AMDGPU_MACH is its gfx
// target and which exports the 24 kiln_<op>_<dtype>_gpu kernels; Program picks them.
#include <set>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "kiln/executor/errors.h"
#include "kiln/executor/program.h"
#include "kiln/runtime/amdgcn_codegen.h"
#include "kiln/runtime/elf_image.h"

using namespace kiln;
using namespace kiln::runtime;

TEST_CASE("gfx90a first, gfx908 and gfx1030 (LLVM 14), gfx1100 (llc-16), never gfx942",
          "[amdgpu][codegen]") {
  std::set<std::string> built;
  for (const AmdgcnCodeObject &object : amdgcn_code_objects()) built.emplace(object.target);
  REQUIRE_FALSE(amdgcn_code_objects().empty());
  CHECK(amdgcn_code_objects().front().target == "gfx90a");
  std::set<std::string> expected{"gfx90a", "gfx908", "gfx1030"};
  std::vector<const char *> absent{"gfx942"};  // needs LLVM 17; neither llc knows it
  if (KILN_TEST_HAVE_LLVM_16_TOOLS)
    expected.emplace("gfx1100");
  else
    absent.push_back("gfx1100");
  CHECK(built == expected);
  for (const char *target : absent) {
    auto missing = amdgcn_code_object(target);
    REQUIRE_FALSE(missing);
    CHECK(missing.error().result == RhiResult::not_supported);
    CHECK_THAT(missing.error().message(), Catch::Contains(target) && Catch::Contains("gfx90a"));
  }
  CHECK(value_or_throw(amdgcn_code_object()).target == "gfx90a");
  CHECK(value_or_throw(amdgcn_code_object("gfx1030:xnack-")).target == "gfx1030");
  if (KILN_TEST_HAVE_LLVM_16_TOOLS)
    CHECK(value_or_throw(amdgcn_code_object("gfx1100")).target == "gfx1100");
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
  if (KILN_TEST_HAVE_LLVM_16_TOOLS) {
    auto gfx1100 = value_or_throw(Program::create(CodegenArch::amdgcn, "gfx1100"));
    CHECK(gfx1100->code_size_bytes() == value_or_throw(amdgcn_code_object("gfx1100")).image.size());
    CHECK(gfx1100->has_kernel("kiln_matmul_f64"));
  }
  auto absent = Program::create(CodegenArch::amdgcn, "gfx942");
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
