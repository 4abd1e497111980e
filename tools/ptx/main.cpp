// kiln-ptx: prints the code that kiln's GPU backends load: the PTX of the CUDA backend for one SM
// version (the device runtime's, or a user kernel's), or a user kernel's HSACO code object for
// one AMDGPU processor (binary, to stdout: redirect it to a file).
//
//   kiln-ptx [sm_<digits>]                                  (default sm_80)
//   kiln-ptx sm_<digits> --user <file.ll|file.bc> <entry> <types>
//   kiln-ptx gfx<id> --user <file.ll|file.bc> <entry> <types>
//
// <types>: the LLVM types of the element function's parameters after its context, comma-separated
// (ptr, float, double, i32, i64), or "-" for none: what UserKernel::create derives from its
// declared parameters. Exit status 0 with the code on stdout; 1 with the named failure on stderr
// when generation fails (not_supported: no NVPTX or AMDGPU target in this LLVM, no lld, or math
// the target cannot compile; invalid_usage: the user IR does not compile); 2 on bad usage. Used
// by the ptxas test (test/ptx, label "ptxas"), the user code-object test (test/amdgcn) and handy
// for reading what the driver gets.
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/runtime/amdgcn_codegen.h"
#include "kiln/runtime/host_memory_guard.h"
#include "kiln/runtime/ptx_codegen.h"

namespace {

int usage() {
  std::fprintf(stderr, "usage: kiln-ptx [sm_<digits>]   (default sm_80)\n"
                       "       kiln-ptx sm_<digits> --user <file.ll|file.bc> <entry> <ptr,float,...|->\n"
                       "       kiln-ptx gfx<id> --user <file.ll|file.bc> <entry> <ptr,float,...|->   (HSACO)\n");
  return 2;
}

bool parse_types(std::string_view text, std::vector<kiln::runtime::UserValueType> *types) {
  using kiln::runtime::UserValueType;
  if (text == "-") return true;
  std::stringstream list{std::string(text)};
  for (std::string word; std::getline(list, word, ',');) {
    if (word == "ptr") types->push_back(UserValueType::ptr);
    else if (word == "float") types->push_back(UserValueType::f32);
    else if (word == "double") types->push_back(UserValueType::f64);
    else if (word == "i32") types->push_back(UserValueType::i32);
    else if (word == "i64") types->push_back(UserValueType::i64);
    else return false;
  }
  return true;
}

/// Writes the code (PTX text or HSACO bytes) to stdout, or the named failure to stderr.
template <class Code>
int print(const kiln::RhiExpected<Code> &code) {
  if (!code) {
    std::fprintf(stderr, "kiln-ptx: %s: %s\n", std::string(kiln::to_string(code.error().result)).c_str(),
                 code.error().message().c_str());
    return code.error().result == kiln::RhiResult::invalid_usage ? 2 : 1;
  }
  std::fwrite(code->data(), 1, code->size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc == 2 && (std::string_view(argv[1]) == "-h" || std::string_view(argv[1]) == "--help")) return usage();
  if (argc <= 2) return print(kiln::runtime::generate_ptx(argc == 2 ? argv[1] : "sm_80"));
  if (argc != 6 || std::string_view(argv[2]) != "--user") return usage();
  std::ifstream file(argv[3], std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "kiln-ptx: cannot read %s\n", argv[3]);
    return 2;
  }
  const std::string ir((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  std::vector<kiln::runtime::UserValueType> types;
  if (!parse_types(argv[5], &types)) return usage();
  kiln::runtime::install_llvm_error_handlers();  // an LLVM fatal error is a named failure, not an abort
  const auto bytes = std::as_bytes(std::span(ir.data(), ir.size()));
  if (std::string_view(argv[1]).starts_with("gfx"))
    return print(kiln::runtime::guard_host_exceptions("amdgpu", "kiln-ptx", [&] {
      return kiln::runtime::generate_user_hsaco(bytes, argv[4], types, argv[1], "amdgpu");
    }));
  return print(kiln::runtime::guard_host_exceptions("cuda", "kiln-ptx", [&] {
    return kiln::runtime::generate_user_ptx(bytes, argv[4], types, argv[1], "cuda");
  }));
}
