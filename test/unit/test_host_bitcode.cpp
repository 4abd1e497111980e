// The embedded host runtime bitcode is emitted before LLVM's optimizer (clang -Xclang
// -disable-llvm-optzns, runtime/CMakeLists.txt): the CPU JIT's O3 for the host CPU is then the
// first to vectorize its loops, at the host's width (AVX-512 here). Bitcode optimized at build
// time for generic x86-64 carries SSE-width loops marked llvm.loop.isvectorized, which the JIT's
// loop vectorizer skips, so they would stay 16 bytes wide on every host.
#include <catch2/catch.hpp>

#include <llvm/ADT/StringRef.h>
#include <llvm/Bitcode/BitcodeReader.h>
#include <llvm/IR/Instructions.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Metadata.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/Error.h>
#include <llvm/Support/MemoryBuffer.h>

#include <set>
#include <string>

#include "kiln/runtime/embedded_code.h"

namespace {

/// Whether loop metadata node `loop` (an llvm.loop self-referential node) names `property`.
bool loop_has_property(const llvm::MDNode &loop, llvm::StringRef property) {
  for (const llvm::MDOperand &operand : loop.operands()) {
    const auto *node = llvm::dyn_cast_or_null<llvm::MDNode>(operand.get());
    if (node == nullptr || node->getNumOperands() == 0) continue;
    const auto *name = llvm::dyn_cast_or_null<llvm::MDString>(node->getOperand(0).get());
    if (name != nullptr && name->getString() == property) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("the host runtime bitcode is not vectorized before the JIT sees the host CPU",
          "[codegen]") {
  const auto bytes = kiln::runtime::host_runtime_bitcode();
  REQUIRE(bytes.size() > 4);
  llvm::LLVMContext context;
  auto module = llvm::parseBitcodeFile(
      llvm::MemoryBufferRef(llvm::StringRef(reinterpret_cast<const char *>(bytes.data()),
                                            bytes.size()),
                            "host_runtime"),
      context);
  if (!module) FAIL(llvm::toString(module.takeError()));

  std::set<std::string> vectorized;  // functions with a loop the build-time optimizer vectorized
  bool saw_kernel = false;
  for (const llvm::Function &function : **module) {
    if (function.isDeclaration()) continue;
    saw_kernel = saw_kernel || function.getName().starts_with("kiln_axpy_");
    for (const llvm::BasicBlock &block : function) {
      const llvm::MDNode *loop = block.getTerminator() == nullptr
                                     ? nullptr
                                     : block.getTerminator()->getMetadata("llvm.loop");
      if (loop != nullptr && loop_has_property(*loop, "llvm.loop.isvectorized"))
        vectorized.insert(function.getName().str());
    }
  }
  CHECK(saw_kernel);
  INFO("functions already vectorized in the bitcode: " << vectorized.size() << ", e.g. "
       << (vectorized.empty() ? std::string("-") : *vectorized.begin()));
  CHECK(vectorized.empty());
}
