// kiln-ptx: prints the PTX that kiln's CUDA backend loads, for one SM version.
//
//   kiln-ptx [sm_<digits>]      (default sm_80)
//
// Exit status 0 with the PTX on stdout; 1 with the named failure on stderr when generate_ptx
// fails (not_supported: no NVPTX target in this LLVM); 2 on bad usage. Used by the ptxas test
// (test/CMakeLists.txt, label "ptxas") and handy for reading what the driver gets.
#include <cstdio>
#include <string_view>

#include "kiln/runtime/ptx_codegen.h"

int main(int argc, char **argv) {
  if (argc > 2 || (argc == 2 && (std::string_view(argv[1]) == "-h" ||
                                 std::string_view(argv[1]) == "--help"))) {
    std::fprintf(stderr, "usage: kiln-ptx [sm_<digits>]   (default sm_80)\n");
    return 2;
  }
  const std::string_view arch = argc == 2 ? std::string_view(argv[1]) : std::string_view("sm_80");
  auto ptx = kiln::runtime::generate_ptx(arch);
  if (!ptx) {
    std::fprintf(stderr, "kiln-ptx: %s: %s\n", std::string(kiln::to_string(ptx.error().result)).c_str(),
                 ptx.error().message().c_str());
    return ptx.error().result == kiln::RhiResult::invalid_usage ? 2 : 1;
  }
  std::fwrite(ptx->data(), 1, ptx->size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}
