// The operation language (runtime/kernel_language.h) and its kernels (executor/operation_kernels.h):
// results on the host, compile failures with their line and column, and any text at all giving a
// result or a named failure, never a crash.
#include <catch2/catch.hpp>

#include <random>
#include <string>
#include <vector>

#include "kiln/executor/operation_kernels.h"
#include "kernel_sources.h"
#include "test_support.h"

using namespace kiln;
using namespace kiln::test;
using runtime::OperationParam;
using runtime::UserValueType;

namespace {

runtime::ElementwiseSource squared_diff(std::string operation) {
  return {"squared_diff",
          std::move(operation),
          {{"x", UserValueType::f32, true, false, {}},
           {"y", UserValueType::f32, true, false, {}},
           {"z", UserValueType::f32, true, true, {}}},
          {},
          {}};
}

Failure compile_failure(const runtime::ElementwiseSource &source) {
  auto ir = runtime::build_elementwise_ir(source, "cpu");
  REQUIRE_FALSE(ir);
  return ir.error();
}

}  // namespace

TEST_CASE("an elementwise operation compiles and runs as numpy computes it", "[kernel_language]") {
  auto ex = make_executor();
  auto kernel = value_or_throw(compile_elementwise(*ex, squared_diff("float t = x - y; z = t * t")));
  Ndarray x = upload<float>(*ex, DataType::f32, {1, 2, 3, -4});
  Ndarray y = upload<float>(*ex, DataType::f32, {0, 4, 3, 4});
  Ndarray z = upload<float>(*ex, DataType::f32, {9, 9, 9, 9});
  const KernelArg args[] = {KernelArg::of(x), KernelArg::of(y), KernelArg::of(z)};
  REQUIRE(ex->launch(*kernel, args));
  CHECK(download<float>(*ex, z) == std::vector<float>{1, 4, 0, 64});
}

TEST_CASE("a reduction's kernels fold an axis in parts, each part in order or in interleaved lanes",
          "[kernel_language]") {
  auto ex = make_executor();
  const ReductionKernels kernels = value_or_throw(compile_reduction(*ex, sum_of_squares_i64()));
  CHECK(kernels.fold == nullptr);  // the GPUs' middle level only
  const int64_t lanes = GENERATE(1, 4);
  INFO("lanes " << lanes);
  std::vector<int64_t> values(2 * 1000);  // shape (2, 1000), reduced over axis 1 in 3 parts
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int64_t>(i % 7);
  Ndarray x = upload<int64_t>(*ex, DataType::i64, values);
  Ndarray partial = upload<int64_t>(*ex, DataType::i64, std::vector<int64_t>(static_cast<std::size_t>(6 * lanes), -1));
  Ndarray y = upload<int64_t>(*ex, DataType::i64, {0, 0});
  const KernelArg first[] = {KernelArg::of(x), KernelArg::of(partial), KernelArg::of(Scalar::of_int(1000)),
                             KernelArg::of(Scalar::of_int(1)), KernelArg::of(Scalar::of_int(3)),
                             KernelArg::of(Scalar::of_int(lanes))};
  REQUIRE(ex->launch(*kernels.partial, first));
  const KernelArg second[] = {KernelArg::of(partial), KernelArg::of(y), KernelArg::of(Scalar::of_int(3 * lanes))};
  REQUIRE(ex->launch(*kernels.combine, second));
  int64_t want[2] = {0, 0};
  for (std::size_t i = 0; i < values.size(); ++i) want[i / 1000] += values[i] * values[i];
  CHECK(download<int64_t>(*ex, y) == std::vector<int64_t>{want[0], want[1]});
  // Lane l of part p folds elements begin + l, begin + l + lanes, ...: part 0 of output 0 is
  // [0, 333), so lane 1 (of 4) holds 1 + 5 + 9 + ... of the squares of i % 7.
  if (lanes == 4) {
    int64_t lane1 = 0;
    for (int64_t i = 1; i < 333; i += 4) lane1 += (i % 7) * (i % 7);
    CHECK(download<int64_t>(*ex, partial)[1] == lane1);
  }
}

TEST_CASE("a reduction's plan: whole runs on the host, interleaved lanes and a fold level on GPUs",
          "[kernel_language]") {
  CHECK(plan_reduction(false, 1000, 1, 1).parts == 1);  // cpu, mock: too short to split
  const ReductionPlan host = plan_reduction(false, int64_t{1} << 24, 1, 1);
  CHECK((host.parts == 256 && host.lanes == 1 && host.fold_lanes == 0 && host.combine_parts() == 256));
  CHECK(plan_reduction(false, int64_t{1} << 24, 64, 1).parts == 1);  // enough outputs to share out
  // GPUs: 2^18 threads of >= 64 elements, 256 interleaved lanes per part, then a fold to 256.
  const ReductionPlan gpu = plan_reduction(true, int64_t{1} << 24, 1, 1);
  CHECK((gpu.lanes == 256 && gpu.parts == 1024 && gpu.fold_lanes == 256 && gpu.combine_parts() == 256));
  CHECK(gpu.partial_values(1) == int64_t{1} << 18);
  const ReductionPlan short_gpu = plan_reduction(true, 6400, 1, 1);  // 100 threads, no fold
  CHECK((short_gpu.lanes == 100 && short_gpu.parts == 1 && short_gpu.fold_lanes == 0));
  const ReductionPlan column = plan_reduction(true, int64_t{1} << 20, 8, 8);  // over axis 0 of (K, 8)
  CHECK((column.lanes == 1 && column.parts == 256 && column.fold_lanes == 0));
  CHECK(plan_reduction(true, 100, 1000, 1).parts * plan_reduction(true, 100, 1000, 1).lanes == 1);
  CHECK(plan_reduction(true, 0, 1, 1).partial_values(1) == 1);
}

TEST_CASE("an open comment, a const assigned and a word of the language as a name are compile failures",
          "[kernel_language][bad-input]") {
  CHECK_THAT(compile_failure(squared_diff("z = x /* the rest")).message(), Catch::Contains("is not closed"));
  CHECK_THAT(compile_failure(squared_diff("const float c = x; c = y; z = c")).message(),
             Catch::Contains("c is a const local and cannot be assigned"));
  CHECK_THAT(compile_failure(squared_diff("const c = x; z = c")).message(), Catch::Contains("const declares a local"));
  CHECK_THAT(compile_failure(squared_diff("float true = 2; z = true")).message(),
             Catch::Contains("true is a word of the language"));
  auto ex = make_executor();  // a const that is only read is fine
  auto kernel = value_or_throw(compile_elementwise(*ex, squared_diff("const float t = x - y; z = t * t /* done */")));
  Ndarray x = upload<float>(*ex, DataType::f32, {3}), y = upload<float>(*ex, DataType::f32, {1});
  Ndarray z = upload<float>(*ex, DataType::f32, {0});
  const KernelArg args[] = {KernelArg::of(x), KernelArg::of(y), KernelArg::of(z)};
  REQUIRE(ex->launch(*kernel, args));
  CHECK(download<float>(*ex, z) == std::vector<float>{4});
}

TEST_CASE("a compile failure is invalid_usage with its line and column", "[kernel_language]") {
  const Failure syntax = compile_failure(squared_diff("float t = x;\n  z = t +* y"));
  CHECK(syntax.result == RhiResult::invalid_usage);
  CHECK(syntax.kernel_compile);
  CHECK(std::string(syntax.site) == "kernel compile");
  CHECK(syntax.source_line == 2);
  CHECK(syntax.source_column == 10);
  CHECK_THAT(syntax.detail, Catch::Contains("z = t +* y\n") && Catch::Contains("         ^"));

  const Failure type = compile_failure(squared_diff("z = x + w"));
  CHECK((type.kernel_compile && type.source_line == 1 && type.source_column == 9));
  CHECK_THAT(type.detail, Catch::Contains("unknown name w") && Catch::Contains("x, y, z"));

  CHECK_THAT(compile_failure(squared_diff("x = y")).detail, Catch::Contains("x is an input"));
  CHECK_THAT(compile_failure(squared_diff("z = fma(x, y)")).detail, Catch::Contains("fma takes 3 arguments, got 2"));
  CHECK_THAT(compile_failure(squared_diff("z = x << 2")).detail, Catch::Contains("operator << needs integers"));
}

TEST_CASE("a parameter named twice or i is refused before any text is read", "[kernel_language]") {
  auto source = squared_diff("z = x");
  source.params[1].name = "x";
  const Failure twice = compile_failure(source);
  CHECK((twice.result == RhiResult::invalid_usage && !twice.kernel_compile));
  source.params[1].name = "i";
  CHECK_THAT(compile_failure(source).detail, Catch::Contains("named twice (i is the element's index)"));
}

TEST_CASE("text nested past the parser's depth is a named failure, not a stack overflow", "[kernel_language]") {
  const std::string deep = "z = " + std::string(100000, '(') + "x" + std::string(100000, ')');
  CHECK_THAT(compile_failure(squared_diff(deep)).detail, Catch::Contains("nests deeper than 200"));
  const std::string negations = "z = " + std::string(100000, '-') + "x";
  CHECK(compile_failure(squared_diff(negations)).kernel_compile);
}

TEST_CASE("any text gives a module or a named failure", "[kernel_language]") {
  // Random texts over the language's own characters and a few others: every one parses and
  // compiles, or fails as invalid_usage with kernel_compile set; nothing aborts.
  const std::string alphabet = "xyzi =+-*/%<>!&|^~?:;,.()0123456789efsqrtminaxbool\n\t\"'#@\x01\xff";
  std::mt19937 random(12345);
  int compiled = 0;
  for (int round = 0; round < 2000; ++round) {
    std::string text = round % 2 == 0 ? "z = " : "";
    const int length = static_cast<int>(random() % 24);
    for (int k = 0; k < length; ++k) text += alphabet[random() % alphabet.size()];
    auto ir = runtime::build_elementwise_ir(squared_diff(text), "cpu");
    if (ir) {
      ++compiled;
      continue;
    }
    INFO(text);
    REQUIRE(ir.error().result == RhiResult::invalid_usage);
    REQUIRE(ir.error().kernel_compile);
  }
  CHECK(compiled > 0);
}

TEST_CASE("a fault spec may name a user kernel once it is made", "[kernel_language]") {
  auto ex = make_executor();
  runtime::FaultSpec spec;
  spec.kernel = "squared_diff";
  spec.kind = runtime::FaultKind::launch;
  CHECK_FALSE(ex->arm_fault(spec));
  auto kernel = value_or_throw(compile_elementwise(*ex, squared_diff("z = x - y")));
  REQUIRE(ex->arm_fault(spec));
  Ndarray x = upload<float>(*ex, DataType::f32, {1, 2});
  Ndarray z = upload<float>(*ex, DataType::f32, {0, 0});
  const KernelArg fresh[] = {KernelArg::of(x), KernelArg::of(x), KernelArg::of(z)};
  auto faulted = ex->launch(*kernel, fresh);
  REQUIRE_FALSE(faulted);
  CHECK_THAT(faulted.error().message(), Catch::Contains("squared_diff"));
}
