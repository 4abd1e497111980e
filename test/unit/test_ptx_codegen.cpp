// PTX for the CUDA backend (generate_ptx) and the task split every launcher shares
// (kiln_task_split_point). That the PTX assembles is checked by the "ptxas" ctest where the CUDA
// toolkit is installed (test/CMakeLists.txt).
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kiln/rhi/result.h"
#include "kiln/runtime/embedded_code.h"
#include "kiln/runtime/kernel_abi.h"
#include "kiln/runtime/ptx_codegen.h"

using kiln::RhiResult;
using kiln::runtime::generate_ptx;

namespace {

const std::string &ptx_sm80() {
  static const std::string text = [] {
    auto ptx = generate_ptx("sm_80");
    if (!ptx) FAIL("generate_ptx(sm_80) failed: " << ptx.error().message());
    return std::move(ptx).value();
  }();
  return text;
}

std::vector<std::string> all_gpu_entry_names() {
  std::vector<std::string> names;
#define KILN_TEST_NAME(op, dtype) names.push_back("kiln_" #op "_" #dtype "_gpu");
  KILN_FOR_EACH_KERNEL(KILN_TEST_NAME)
#undef KILN_TEST_NAME
  return names;
}

std::string value_or_throw_ptx(std::string_view arch) {
  auto ptx = generate_ptx(arch);
  if (!ptx) FAIL("generate_ptx(" << arch << ") failed: " << ptx.error().message());
  return std::move(ptx).value();
}

/// The split as exact 128-bit arithmetic (host only).
int64_t reference_split(int64_t n, int64_t task, int64_t num_tasks) {
  return static_cast<int64_t>(static_cast<unsigned __int128>(n) * static_cast<uint64_t>(task) /
                              static_cast<uint64_t>(num_tasks));
}

}  // namespace

TEST_CASE("the embedded nvptx bitcode is there", "[ptx]") {
  const auto bitcode = kiln::runtime::nvptx_runtime_bitcode();
  REQUIRE(bitcode.size() > 4);
  CHECK(bitcode[0] == 'B');  // LLVM bitcode magic "BC\xC0\xDE"
  CHECK(bitcode[1] == 'C');
}

TEST_CASE("generate_ptx emits one .entry per kernel of KILN_FOR_EACH_KERNEL", "[ptx]") {
  const std::string &ptx = ptx_sm80();
  const auto names = all_gpu_entry_names();
  REQUIRE(names.size() == KILN_NUM_KERNELS);
  for (const std::string &name : names) {
    INFO(name);
    CHECK(ptx.find(".entry " + name + "(") != std::string::npos);
  }
  // Exactly those entries: nothing else is a kernel.
  const std::regex entry(R"(\.entry\s+(\w+))");
  const auto count = std::distance(std::sregex_iterator(ptx.begin(), ptx.end(), entry),
                                   std::sregex_iterator());
  CHECK(count == KILN_NUM_KERNELS);
}

namespace {

/// The text of entry `name` in `ptx`: from its .entry line to the next .entry (or the end).
std::string entry_text(const std::string &ptx, const std::string &name) {
  const std::size_t begin = ptx.find(".entry " + name + "(");
  if (begin == std::string::npos) return {};
  const std::size_t end = ptx.find(".entry ", begin + 1);
  return ptx.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

}  // namespace

TEST_CASE("generate_ptx: GPU-shaped kernels (grid stride, shared-memory tree and tiles, barriers)",
          "[ptx]") {
  const std::string &ptx = ptx_sm80();
  for (const char *dtype : {"f32", "f64", "i32", "i64"}) {
    for (const char *op : {"fill", "copy", "axpy", "reduce_sum", "matmul", "compact_positive"}) {
      const std::string name = std::string("kiln_") + op + "_" + dtype + "_gpu";
      INFO(name);
      const std::string text = entry_text(ptx, name);
      REQUIRE(!text.empty());
      // The kernels' shared arrays have 256 per-thread slots: the PTX says so to ptxas.
      CHECK(text.find(".maxntid 256, 1, 1") != std::string::npos);
      const std::string_view kind = op;
      if (kind == "reduce_sum" || kind == "matmul") {
        // Block-shared memory in the .shared state space, written, read, and a barrier between.
        CHECK(text.find("st.shared.") != std::string::npos);
        CHECK(text.find("ld.shared.") != std::string::npos);
        CHECK(text.find("bar.sync") != std::string::npos);
      } else {
        CHECK(text.find("bar.sync") == std::string::npos);
      }
      if (kind != "compact_positive") {
        // Grid-stride (and tile-stride) loops step by the grid size, read from %nctaid.x.
        CHECK(text.find("%nctaid.x") != std::string::npos);
      }
    }
  }
}

TEST_CASE("generate_ptx writes the requested target and a PTX ISA version it needs", "[ptx]") {
  const std::string &ptx = ptx_sm80();
  CHECK(ptx.find(".target sm_80\n") != std::string::npos);
  CHECK(ptx.find(".version 7.0\n") != std::string::npos);
  CHECK(ptx.find(".address_size 64") != std::string::npos);
}

TEST_CASE("generate_ptx leaves no call to anything outside the module", "[ptx]") {
  const std::string &ptx = ptx_sm80();
  CHECK(ptx.find(".extern") == std::string::npos);
  CHECK(ptx.find('\0') == std::string::npos);
  // Every call (if any survive inlining) targets a function the module defines.
  const std::regex call(R"(call(?:\.uni)?\s*(?:\([^)]*\),\s*)?(\w+),)");
  for (auto it = std::sregex_iterator(ptx.begin(), ptx.end(), call); it != std::sregex_iterator();
       ++it) {
    const std::string callee = (*it)[1].str();
    INFO(callee);
    CHECK(ptx.find(".func " + callee + "(") != std::string::npos);
  }
}

TEST_CASE("generate_ptx writes native sm_90 PTX with PTX ISA 7.8", "[ptx]") {
  // LLVM 19 knows sm_90: the H100/H200 get their own target, not sm_80/sm_86 PTX the driver
  // JIT-forwards. 7.8 is the lowest PTX ISA version with sm_90 (CUDA 11.8); CUDA 12 and 13
  // drivers accept it.
  auto ptx = generate_ptx("sm_90");
  REQUIRE(ptx);
  CHECK(ptx->find(".target sm_90\n") != std::string::npos);
  CHECK(ptx->find(".version 7.8\n") != std::string::npos);
  CHECK(ptx->find(".address_size 64") != std::string::npos);
  CHECK(ptx->find(".entry kiln_axpy_f32_gpu(") != std::string::npos);
  // "sm_90a" names the same SM version.
  auto suffixed = generate_ptx("sm_90a");
  REQUIRE(suffixed);
  CHECK(*suffixed == *ptx);
}

TEST_CASE("generate_ptx for an SM version newer than LLVM knows uses the newest it knows",
          "[ptx]") {
  auto ptx = generate_ptx("sm_100");  // Blackwell: LLVM 20's; LLVM 19 stops at sm_90
  REQUIRE(ptx);
  CHECK(ptx->find(".target sm_90\n") != std::string::npos);
  CHECK(*ptx == value_or_throw_ptx("sm_90"));
}

TEST_CASE("generate_ptx refuses what is not an SM version", "[ptx]") {
  for (const char *arch : {"", "sm_", "80", "compute_80", "sm_8x", "sm_80ab", "sm_-80"}) {
    INFO(arch);
    auto ptx = generate_ptx(arch);
    REQUIRE_FALSE(ptx);
    CHECK(ptx.error().result == RhiResult::invalid_usage);
  }
  auto ancient = generate_ptx("sm_10");
  REQUIRE_FALSE(ancient);
  CHECK(ancient.error().result == RhiResult::not_supported);
}

TEST_CASE("generate_ptx is thread-safe and gives the same text every time", "[ptx][threads]") {
  std::vector<std::string> texts(4);
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    threads.emplace_back([&texts, i] {
      auto ptx = generate_ptx(i % 2 == 0 ? "sm_80" : "sm_86");
      if (ptx) texts[i] = std::move(*ptx);
    });
  }
  for (auto &thread : threads) thread.join();
  CHECK(texts[0] == ptx_sm80());
  CHECK(texts[2] == ptx_sm80());
  CHECK_FALSE(texts[1].empty());
  CHECK(texts[1] == texts[3]);
  CHECK(texts[1].find(".target sm_86\n") != std::string::npos);
}

TEST_CASE("kiln_task_split_point is floor(n * task / num_tasks) without overflow",
          "[kernel_abi]") {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> sizes = {0, 1, 7, 1000, 1 << 20, (int64_t{1} << 40) + 3,
                                      (int64_t{1} << 62) + 12345, kMax};
  const std::vector<int64_t> task_counts = {1, 3, 64, 1000, 65536, (int64_t{1} << 32) + 1,
                                            (int64_t{1} << 40) - 1, kMax};
  for (int64_t n : sizes) {
    for (int64_t num_tasks : task_counts) {
      for (int64_t task : {int64_t{0}, int64_t{1}, num_tasks / 3, num_tasks / 2, num_tasks - 1,
                           num_tasks}) {
        if (task < 0 || task > num_tasks) continue;
        INFO("n=" << n << " task=" << task << " num_tasks=" << num_tasks);
        CHECK(kiln_task_split_point(n, task, num_tasks) == reference_split(n, task, num_tasks));
      }
    }
  }
  // The ranges tile [0, n) in order, and match the plain formula wherever it does not overflow.
  const int64_t n = 1000003;
  const int64_t num_tasks = 97;
  int64_t previous = 0;
  for (int64_t task = 0; task < num_tasks; ++task) {
    const int64_t begin = kiln_task_split_point(n, task, num_tasks);
    const int64_t end = kiln_task_split_point(n, task + 1, num_tasks);
    CHECK(begin == previous);
    CHECK(begin == n * task / num_tasks);
    CHECK(end >= begin);
    previous = end;
  }
  CHECK(previous == n);
}
