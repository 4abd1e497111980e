// User kernels from LLVM IR (kernel_abi.h's user-kernel ABI) on the host backends: results, the
// device-runtime functions (index, count, heap, assertion), the code charged while the kernel
// lives, and every mistake a named invalid_usage before anything is allocated.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "fake_gpu_handle.h"
#include "kiln/executor/operation_kernels.h"
#include "kiln/executor/user_kernel.h"
#include "kernel_sources.h"
#include "test_support.h"

using namespace kiln;
using namespace kiln::test;

namespace {

std::span<const std::byte> text(const std::string &ir) { return std::as_bytes(std::span(ir.data(), ir.size())); }

// z[i] = (x[i] - y[i])^2 * scale: CuPy's squared difference, with a scalar.
const std::string kSquaredDiff = squared_diff_ir();

std::vector<KernelParam> squared_diff_params() {
  return {{"x", ParamKind::in, DataType::f32}, {"y", ParamKind::in, DataType::f32},
          {"z", ParamKind::out, DataType::f32}, {"scale", ParamKind::scalar, DataType::f32}};
}

// out[i] = i + count: the index and the count functions, over a launch of `count` elements.
const std::string kIota = R"(
declare i64 @kiln_index(ptr)
declare i64 @kiln_count(ptr)
define void @iota(ptr %ctx, ptr %out) {
  %i = call i64 @kiln_index(ptr %ctx)
  %n = call i64 @kiln_count(ptr %ctx)
  %v = add i64 %i, %n
  %p = getelementptr i64, ptr %out, i64 %i
  store i64 %v, ptr %p
  ret void
}
)";

// Each element allocates `bytes` from the device heap and writes through it; a null result
// returns (the launch then fails with the heap's figures): test/support/heap_user.ll, which the
// Python tests load too.
const std::string &heap_user_ir() {
  static const std::string text = [] {
    std::ifstream file(KILN_HEAP_USER_IR);
    REQUIRE(file);
    return std::string(std::istreambuf_iterator<char>(file), {});
  }();
  return text;
}

// Asserts x[i] >= 0.
const std::string kCheckPositive = R"(
@msg = private constant [23 x i8] c"x must not be negative\00"
declare i64 @kiln_index(ptr)
declare void @kiln_assert(ptr, i32, ptr)
define void @check_positive(ptr %ctx, ptr %x) {
  %i = call i64 @kiln_index(ptr %ctx)
  %p = getelementptr float, ptr %x, i64 %i
  %v = load float, ptr %p
  %ok = fcmp oge float %v, 0.0
  %c = zext i1 %ok to i32
  call void @kiln_assert(ptr %ctx, i32 %c, ptr @msg)
  ret void
}
)";

std::shared_ptr<UserKernel> compile(LlvmRuntimeExecutor &ex, const std::string &ir, const std::string &entry,
                                    std::vector<KernelParam> params) {
  return value_or_throw(UserKernel::create(ex, text(ir), entry, std::move(params)));
}

uint64_t code_bytes(LlvmRuntimeExecutor &ex) {
  return ex.memory().in_use_by_category()[static_cast<std::size_t>(MemoryCategory::code_object)];
}

Failure create_failure(LlvmRuntimeExecutor &ex, const std::string &ir, const std::string &entry,
                       std::vector<KernelParam> params) {
  auto kernel = UserKernel::create(ex, text(ir), entry, std::move(params));
  REQUIRE_FALSE(kernel);
  return kernel.error();
}

}  // namespace

TEST_CASE("a user kernel from IR text computes its elements on cpu and mock", "[user_kernel]") {
  for (Backend backend : {Backend::cpu, Backend::mock}) {
    ExecutorConfig config;
    config.backend = backend;
    auto ex = make_executor(config);
    auto kernel = compile(*ex, kSquaredDiff, "squared_diff", squared_diff_params());
    std::vector<float> xs(100000), ys(100000);  // more than one task's worth
    for (std::size_t i = 0; i < xs.size(); ++i) {
      xs[i] = static_cast<float>(i % 17);
      ys[i] = static_cast<float>(i % 5);
    }
    Ndarray x = upload<float>(*ex, DataType::f32, xs), y = upload<float>(*ex, DataType::f32, ys);
    const int64_t shape[1] = {static_cast<int64_t>(xs.size())};
    Ndarray z = value_or_throw(ex->ndarray(DataType::f32, shape));
    const KernelArg args[] = {KernelArg::of(x), KernelArg::of(y), KernelArg::of(z), KernelArg::of(Scalar::of(0.5))};
    REQUIRE(ex->launch(*kernel, args));
    const std::vector<float> got = download<float>(*ex, z);
    for (std::size_t i = 0; i < xs.size(); ++i) REQUIRE(got[i] == (xs[i] - ys[i]) * (xs[i] - ys[i]) * 0.5f);
  }
}

TEST_CASE("a user kernel's index and count functions see the launch", "[user_kernel]") {
  auto ex = make_executor();
  auto kernel = compile(*ex, kIota, "iota", {{"out", ParamKind::out, DataType::i64}});
  Ndarray out = upload<int64_t>(*ex, DataType::i64, std::vector<int64_t>(5, -1));
  const KernelArg args[] = {KernelArg::of(out)};
  REQUIRE(ex->launch(*kernel, args));
  CHECK(download<int64_t>(*ex, out) == std::vector<int64_t>{5, 6, 7, 8, 9});
}

TEST_CASE("a user kernel's code is charged while it lives and released after", "[user_kernel]") {
  auto ex = make_executor();
  const uint64_t before = code_bytes(*ex);
  {
    auto kernel = compile(*ex, kIota, "iota", {{"out", ParamKind::out, DataType::i64}});
    CHECK(kernel->code_size_bytes() > 0);
    CHECK(code_bytes(*ex) == before + kernel->code_size_bytes());
  }
  CHECK(code_bytes(*ex) == before);
}

TEST_CASE("a user kernel whose code does not fit the budget is refused, charging nothing", "[user_kernel]") {
  auto ex = make_executor();
  ExecutorConfig config;
  config.budget.limit_bytes = ledger_bytes(*ex) + 16;  // no room for any code
  auto tight = make_executor(config);
  const uint64_t before = ledger_bytes(*tight);
  auto kernel = UserKernel::create(*tight, text(kIota), "iota", {{"out", ParamKind::out, DataType::i64}});
  REQUIRE_FALSE(kernel);
  CHECK(classify(kernel.error()) == ErrorKind::budget_exceeded);
  CHECK(kernel.error().category == MemoryCategory::code_object);
  CHECK(ledger_bytes(*tight) == before);
}

TEST_CASE("a user kernel that runs the device heap dry is heap exhaustion; the device stays usable",
          "[user_kernel]") {
  ExecutorConfig config;
  config.device_heap_bytes = 4096;
  auto ex = make_executor(config);
  auto kernel = compile(*ex, heap_user_ir(), "heap_user",
                        {{"out", ParamKind::out, DataType::i64}, {"bytes", ParamKind::scalar, DataType::i64}});
  Ndarray out = upload<int64_t>(*ex, DataType::i64, std::vector<int64_t>(64, 0));
  const uint64_t before = ledger_bytes(*ex);
  const KernelArg dry[] = {KernelArg::of(out), KernelArg::of(Scalar::of_int(1024))};  // 64 KiB > 4 KiB
  auto refused = ex->launch(*kernel, dry);
  REQUIRE_FALSE(refused);
  CHECK(classify(refused.error()) == ErrorKind::device_heap_exhausted);
  CHECK_THAT(refused.error().message(), Catch::Contains("heap_user"));
  CHECK(refused.error().requested_bytes == 1024);
  CHECK(ledger_bytes(*ex) == before);
  const KernelArg fits[] = {KernelArg::of(out), KernelArg::of(Scalar::of_int(8))};  // 512 B
  CHECK(ex->launch(*kernel, fits));
}

TEST_CASE("a failed device-side assertion names the kernel, the element and the message", "[user_kernel]") {
  auto ex = make_executor();
  auto kernel = compile(*ex, kCheckPositive, "check_positive", {{"x", ParamKind::in, DataType::f32}});
  Ndarray good = upload<float>(*ex, DataType::f32, {1, 2, 3});
  const KernelArg fine[] = {KernelArg::of(good)};
  REQUIRE(ex->launch(*kernel, fine));
  Ndarray bad = upload<float>(*ex, DataType::f32, {1, 2, -3, 4});
  const KernelArg args[] = {KernelArg::of(bad)};
  auto failed = ex->launch(*kernel, args);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().result == RhiResult::error);
  CHECK_THAT(failed.error().message(),
             Catch::Contains("kernel check_positive: a device-side assertion failed: element 2: x must not be negative"));
  CHECK(ex->launch(*kernel, fine));  // the next launch starts clean
}

TEST_CASE("an assertion message of any bytes reads as printable text, the others escaped", "[user_kernel]") {
  auto ex = make_executor();
  std::string ir = kCheckPositive;
  ir.replace(ir.find("negative"), 8, R"(\FF\FEgative)");  // two bytes that are not text: the length stays 23
  auto kernel = compile(*ex, ir, "check_positive", {{"x", ParamKind::in, DataType::f32}});
  Ndarray bad = upload<float>(*ex, DataType::f32, {-1});
  const KernelArg args[] = {KernelArg::of(bad)};
  auto failed = ex->launch(*kernel, args);
  REQUIRE_FALSE(failed);
  CHECK_THAT(failed.error().message(), Catch::Contains(R"(element 0: x must not be \xff\xfegative)"));
}

TEST_CASE("IR that does not parse is invalid usage with its line, column and a caret", "[user_kernel][bad-input]") {
  auto ex = make_executor();
  const std::string typo = "define void @k(ptr %ctx) {\n  %x = fadd flaot 1.0, 2.0\n  ret void\n}\n";
  const Failure f = create_failure(*ex, typo, "k", {});
  CHECK(classify(f) == ErrorKind::invalid_usage);
  CHECK_THAT(f.message(), Catch::Contains("line 2, column 13: expected type"));
  CHECK_THAT(f.message(), Catch::Contains("  %x = fadd flaot 1.0, 2.0\n              ^"));
  CHECK_THAT(create_failure(*ex, std::string("define\0void", 11), "k", {}).message(),
             Catch::Contains("NUL byte at offset 6"));
  CHECK_THAT(create_failure(*ex, std::string("BC\xC0\xDE garbage", 12), "k", {}).message(),
             Catch::Contains("the bitcode does not parse"));
}

TEST_CASE("a module the verifier refuses is invalid usage, never an LLVM abort", "[user_kernel][bad-input]") {
  auto ex = make_executor();
  // It parses (forward references are allowed) but %x does not dominate its use.
  const std::string undominated =
      "define void @k(ptr %ctx) {\nentry:\n  br label %b\nb:\n  %y = add i32 %x, 1\n  br label %c\n"
      "c:\n  %x = add i32 1, 2\n  ret void\n}\n";
  const Failure f = create_failure(*ex, undominated, "k", {});
  CHECK(classify(f) == ErrorKind::invalid_usage);
  CHECK_THAT(f.message(), Catch::Contains("does not verify"));
}

TEST_CASE("an entry whose signature does not match its parameters is named with both", "[user_kernel][bad-input]") {
  auto ex = make_executor();
  auto params = squared_diff_params();
  params[3].dtype = DataType::f64;  // the IR takes float
  const Failure f = create_failure(*ex, kSquaredDiff, "squared_diff", params);
  CHECK(classify(f) == ErrorKind::invalid_usage);
  CHECK_THAT(f.message(), Catch::Contains("@squared_diff has type void (ptr, ptr, ptr, ptr, float), but its "
                                          "parameters declare void (ptr, ptr, ptr, ptr, double)"));
  params.pop_back();
  CHECK_THAT(create_failure(*ex, kSquaredDiff, "squared_diff", params).message(), Catch::Contains("but its parameters"));
  CHECK_THAT(create_failure(*ex, kSquaredDiff, "nosuch", squared_diff_params()).message(),
             Catch::Contains("defines no function @nosuch; it defines @squared_diff"));
}

TEST_CASE("a module calling what kiln does not provide, or redefining kiln's names, is refused",
          "[user_kernel][bad-input]") {
  auto ex = make_executor();
  const std::string calls_printf = "declare i32 @printf(ptr, ...)\ndefine void @k(ptr %ctx) {\n  ret void\n}\n";
  CHECK_THAT(create_failure(*ex, calls_printf, "k", {}).message(), Catch::Contains("calls @printf, which kiln does not provide"));
  const std::string wrong_type = "declare i32 @kiln_index(ptr)\ndefine void @k(ptr %ctx) {\n  ret void\n}\n";
  CHECK_THAT(create_failure(*ex, wrong_type, "k", {}).message(), Catch::Contains("@kiln_index is declared i32 (ptr); kiln's is i64 (ptr)"));
  const std::string redefines = "define i64 @kiln_count(ptr %c) {\n  ret i64 0\n}\ndefine void @k(ptr %ctx) {\n  ret void\n}\n";
  CHECK_THAT(create_failure(*ex, redefines, "k", {}).message(), Catch::Contains("defines @kiln_count, a name of kiln's"));
}

TEST_CASE("a module reaching outside kiln through a global, one target's intrinsic or assembly is refused",
          "[user_kernel][bad-input]") {
  auto ex = make_executor();
  // The CPU JIT would bind an external global to the process's own symbol: abort() would run.
  const std::string via_global = "@abort = external global i8\ndefine void @k(ptr %ctx) {\n  call void @abort()\n"
                                 "  ret void\n}\n";
  CHECK_THAT(create_failure(*ex, via_global, "k", {}).message(), Catch::Contains("declares the external global @abort"));
  const std::string nvvm = "declare i32 @llvm.nvvm.read.ptx.sreg.tid.x()\ndefine void @k(ptr %ctx) {\n"
                           "  %t = call i32 @llvm.nvvm.read.ptx.sreg.tid.x()\n  ret void\n}\n";
  CHECK_THAT(create_failure(*ex, nvvm, "k", {}).message(), Catch::Contains("an intrinsic of one target"));
  const std::string unknown = "declare float @llvm.foo.bar(float)\ndefine void @k(ptr %ctx) {\n"
                              "  %t = call float @llvm.foo.bar(float 1.0)\n  ret void\n}\n";
  CHECK_THAT(create_failure(*ex, unknown, "k", {}).message(), Catch::Contains("@llvm.foo.bar, which is no LLVM 19 intrinsic"));
  const std::string takes_name = "@kiln_count = global i64 0\ndefine void @k(ptr %ctx) {\n  ret void\n}\n";
  CHECK_THAT(create_failure(*ex, takes_name, "k", {}).message(), Catch::Contains("defines @kiln_count, a name of kiln's"));
  const std::string assembly = "module asm \"ud2\"\ndefine void @k(ptr %ctx) {\n  ret void\n}\n";
  CHECK_THAT(create_failure(*ex, assembly, "k", {}).message(), Catch::Contains("module-level assembly"));
  for (const std::string *ir : {&via_global, &takes_name, &nvvm, &unknown, &assembly})
    CHECK(create_failure(*ex, *ir, "k", {}).kernel_compile);
}

TEST_CASE("integer division by zero in IR gives 0 and INT_MIN / -1 wraps, never a trap", "[user_kernel][bad-input]") {
  auto ex = make_executor();
  // q[i] = n[i] / d[i] and r[i] = n[i] % d[i], signed and unsigned: a CPU would raise SIGFPE.
  std::string divide = R"(
declare i64 @kiln_index(ptr)
define void @k(ptr %ctx, ptr %n, ptr %d, ptr %q, ptr %r, ptr %uq, ptr %ur) {
  %i = call i64 @kiln_index(ptr %ctx)
  %pn = getelementptr i64, ptr %n, i64 %i
  %pd = getelementptr i64, ptr %d, i64 %i
  %a = load i64, ptr %pn
  %b = load i64, ptr %pd
)";
  int step = 0;  // %v<step> = <op> i64 %a, %b, stored to <out>[i]
  for (const auto &[op, out] : {std::pair{"sdiv", "q"}, {"srem", "r"}, {"udiv", "uq"}, {"urem", "ur"}}) {
    const std::string v = "%v" + std::to_string(++step), p = "%p" + std::to_string(step);
    divide += "  " + v + " = " + op + " i64 %a, %b\n  " + p + " = getelementptr i64, ptr %" + out + ", i64 %i\n" +
              "  store i64 " + v + ", ptr " + p + "\n";
  }
  divide += "  ret void\n}\n";
  auto k = compile(*ex, divide, "k",
                   {{"n", ParamKind::in, DataType::i64}, {"d", ParamKind::in, DataType::i64},
                    {"q", ParamKind::out, DataType::i64}, {"r", ParamKind::out, DataType::i64},
                    {"uq", ParamKind::out, DataType::i64}, {"ur", ParamKind::out, DataType::i64}});
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  Ndarray n = upload<int64_t>(*ex, DataType::i64, {7, 7, kMin, -7});
  Ndarray d = upload<int64_t>(*ex, DataType::i64, {0, 2, -1, -1});
  std::vector<Ndarray> outs;
  for (int o = 0; o < 4; ++o) outs.push_back(upload<int64_t>(*ex, DataType::i64, {9, 9, 9, 9}));
  const KernelArg args[] = {KernelArg::of(n),       KernelArg::of(d),       KernelArg::of(outs[0]),
                            KernelArg::of(outs[1]), KernelArg::of(outs[2]), KernelArg::of(outs[3])};
  REQUIRE(ex->launch(*k, args));
  CHECK(download<int64_t>(*ex, outs[0]) == std::vector<int64_t>{0, 3, kMin, 7});  // kMin / -1 wraps
  CHECK(download<int64_t>(*ex, outs[1]) == std::vector<int64_t>{0, 1, 0, 0});
  CHECK(download<int64_t>(*ex, outs[2]) == std::vector<int64_t>{0, 3, 0, 0});  // unsigned: 2^63 / (2^64 - 1) = 0
  CHECK(download<int64_t>(*ex, outs[3]) == std::vector<int64_t>{0, 1, kMin, -7});
}

TEST_CASE("a bad declaration is refused before LLVM runs", "[user_kernel][bad-input]") {
  auto ex = make_executor();
  CHECK_THAT(create_failure(*ex, kIota, "", {}).message(), Catch::Contains("is not a function name"));
  CHECK_THAT(create_failure(*ex, kIota, "iota", {{"a", ParamKind::out, DataType::i64}, {"a", ParamKind::in, DataType::i64}})
                 .message(),
             Catch::Contains("must be given and distinct, got 'a'"));
  std::vector<KernelParam> many;
  for (int i = 0; i < 17; ++i) many.push_back({"p" + std::to_string(i), ParamKind::in, DataType::f32});
  CHECK_THAT(create_failure(*ex, kIota, "iota", many).message(), Catch::Contains("at most 16"));
}

TEST_CASE("every launch mistake is invalid usage naming the parameter, and nothing runs", "[user_kernel][bad-input]") {
  auto ex = make_executor();
  auto kernel = compile(*ex, kSquaredDiff, "squared_diff", squared_diff_params());
  Ndarray x = upload<float>(*ex, DataType::f32, {1, 2, 3}), y = upload<float>(*ex, DataType::f32, {1, 1, 1});
  Ndarray z = upload<float>(*ex, DataType::f32, {9, 9, 9});
  Ndarray short_z = upload<float>(*ex, DataType::f32, {9, 9});
  Ndarray ints = upload<int32_t>(*ex, DataType::i32, {1, 2, 3});
  const Scalar half = Scalar::of(0.5);
  const auto fails_with = [&](std::vector<KernelArg> args, const std::string &said) {
    auto r = ex->launch(*kernel, args);
    REQUIRE_FALSE(r);
    CHECK(classify(r.error()) == ErrorKind::invalid_usage);
    CHECK_THAT(r.error().message(), Catch::Contains(said));
    CHECK(download<float>(*ex, z) == std::vector<float>{9, 9, 9});  // nothing ran
  };
  fails_with({KernelArg::of(x), KernelArg::of(y), KernelArg::of(z)}, "takes 4 arguments, got 3");
  fails_with({KernelArg::of(x), KernelArg::of(y), KernelArg::of(half), KernelArg::of(half)},
             "z is an array parameter, got a scalar");
  fails_with({KernelArg::of(x), KernelArg::of(y), KernelArg::of(z), KernelArg::of(z)}, "scale is a scalar parameter");
  fails_with({KernelArg::of(ints), KernelArg::of(y), KernelArg::of(z), KernelArg::of(half)}, "x is declared f32, got the array");
  fails_with({KernelArg::of(x), KernelArg::of(y), KernelArg::of(short_z), KernelArg::of(half)},
             "z is the array f32[2] of 2 elements; the launch has 3");
  fails_with({KernelArg::of(x), KernelArg::of(y), KernelArg::of(x), KernelArg::of(half)}, "z (out) overlaps x");
  Ndarray freed = upload<float>(*ex, DataType::f32, {1, 2, 3});
  REQUIRE(ex->free(freed));
  fails_with({KernelArg::of(freed), KernelArg::of(y), KernelArg::of(z), KernelArg::of(half)}, "freed");
  auto other = make_executor();
  Ndarray theirs = upload<float>(*other, DataType::f32, {1, 2, 3});
  fails_with({KernelArg::of(theirs), KernelArg::of(y), KernelArg::of(z), KernelArg::of(half)}, "another executor");
  auto foreign = compile(*other, kIota, "iota", {{"out", ParamKind::out, DataType::i64}});
  Ndarray out = upload<int64_t>(*ex, DataType::i64, {0});
  const KernelArg one[] = {KernelArg::of(out)};
  auto r = ex->launch(*foreign, one);
  REQUIRE_FALSE(r);
  CHECK_THAT(r.error().message(), Catch::Contains("compiled for another executor"));
  const KernelArg in_place[] = {KernelArg::of(x), KernelArg::of(y), KernelArg::of(z), KernelArg::of(half)};
  CHECK(ex->launch(*kernel, in_place));  // usable after every refusal
  CHECK(download<float>(*ex, z) == std::vector<float>{0, 0.5f, 2});
}

TEST_CASE("a launch without arrays needs its count, within int64", "[user_kernel][bad-input]") {
  auto ex = make_executor();
  const std::string scalar_only = "define void @k(ptr %ctx, i64 %v) {\n  ret void\n}\n";
  auto kernel = compile(*ex, scalar_only, "k", {{"v", ParamKind::scalar, DataType::i64}});
  const KernelArg args[] = {KernelArg::of(Scalar::of_int(3))};
  auto no_count = ex->launch(*kernel, args);
  REQUIRE_FALSE(no_count);
  CHECK_THAT(no_count.error().message(), Catch::Contains("has no array argument: give the launch's element count"));
  auto too_many = ex->launch(*kernel, args, uint64_t{1} << 63);
  REQUIRE_FALSE(too_many);
  CHECK_THAT(too_many.error().message(), Catch::Contains("9223372036854775808 elements is beyond int64"));
  CHECK(ex->launch(*kernel, args, 1000));  // a given count runs
}

namespace {

/// The fake driver of `backend`, reset, kiln's loader pointed at it (other tests may point the
/// variable elsewhere).
kiln::test::FakeGpu &fake_driver(Backend backend) {
  const bool cuda = backend == Backend::cuda;
  static kiln::test::FakeGpu fake_cuda =
      kiln::test::FakeGpu::open(KILN_FAKE_CUDA_LIBRARY, "KILN_CUDA_DRIVER", "kiln_fake_cuda_");
  static kiln::test::FakeGpu fake_hip =
      kiln::test::FakeGpu::open(KILN_FAKE_HIP_LIBRARY, "KILN_HIP_RUNTIME", "kiln_fake_hip_");
  setenv(cuda ? "KILN_CUDA_DRIVER" : "KILN_HIP_RUNTIME", cuda ? KILN_FAKE_CUDA_LIBRARY : KILN_FAKE_HIP_LIBRARY, 1);
  kiln::test::FakeGpu &fake = cuda ? fake_cuda : fake_hip;
  fake.reset();
  return fake;
}

/// The GPU backends a user kernel runs on here: cuda, and amdgpu unless kiln was built without
/// AMDGPU user kernels (KILN_EXPECT_HSACO 0).
std::vector<Backend> user_kernel_gpus() {
  if (!KILN_EXPECT_HSACO) return {Backend::cuda};
  return {Backend::cuda, Backend::amdgpu};
}

std::unique_ptr<LlvmRuntimeExecutor> fake_gpu_executor(Backend backend) {
  fake_driver(backend);
  return make_gpu_executor(backend);
}

}  // namespace

TEST_CASE("a user kernel runs on the fake CUDA driver and the fake HIP runtime from the PTX or HSACO kiln "
          "made, its IR run for the host",
          "[user_kernel]") {
  auto gpu = fake_gpu_executor(GENERATE(from_range(user_kernel_gpus())));
  INFO(to_string(gpu->device().backend()));
  const uint64_t before = ledger_bytes(*gpu);
  const uint64_t code_before = code_bytes(*gpu);
  {
    auto kernel = compile(*gpu, kSquaredDiff, "squared_diff", squared_diff_params());
    CHECK(code_bytes(*gpu) > code_before);  // the PTX or HSACO image, charged while the kernel lives
    std::vector<float> xs(70000), ys(70000);  // more indices than one grid-stride pass of a block
    for (std::size_t i = 0; i < xs.size(); ++i) {
      xs[i] = static_cast<float>(i % 13);
      ys[i] = static_cast<float>(i % 4);
    }
    Ndarray x = upload<float>(*gpu, DataType::f32, xs), y = upload<float>(*gpu, DataType::f32, ys);
    Ndarray z = upload<float>(*gpu, DataType::f32, std::vector<float>(xs.size(), -1.0f));
    const KernelArg args[] = {KernelArg::of(x), KernelArg::of(y), KernelArg::of(z), KernelArg::of(Scalar::of(2.0))};
    REQUIRE(gpu->launch(*kernel, args));
    const std::vector<float> got = download<float>(*gpu, z);
    for (std::size_t i = 0; i < xs.size(); ++i) REQUIRE(got[i] == (xs[i] - ys[i]) * (xs[i] - ys[i]) * 2.0f);
  }
  CHECK(code_bytes(*gpu) == code_before);  // unloaded and uncharged with the kernel
  CHECK(ledger_bytes(*gpu) == before);
}

TEST_CASE("a reduction on the fake CUDA driver and the fake HIP runtime runs its interleaved lanes, fold and "
          "combine as the GPU plan says",
          "[user_kernel]") {
  auto gpu = fake_gpu_executor(GENERATE(from_range(user_kernel_gpus())));
  INFO(to_string(gpu->device().backend()));
  const ReductionKernels kernels = value_or_throw(compile_reduction(*gpu, sum_of_squares_i64()));
  REQUIRE(kernels.fold != nullptr);
  constexpr int64_t n = 200000;
  const ReductionPlan plan = plan_reduction(true, n, 1, 1);
  REQUIRE((plan.lanes == 256 && plan.parts == 12 && plan.fold_lanes == 256));  // all three levels
  std::vector<int64_t> values(n);
  int64_t want = 0;
  for (int64_t i = 0; i < n; ++i) {
    values[static_cast<std::size_t>(i)] = i % 1001 - 500;
    want += (i % 1001 - 500) * (i % 1001 - 500);
  }
  Ndarray x = upload<int64_t>(*gpu, DataType::i64, values);
  Ndarray partial = upload<int64_t>(*gpu, DataType::i64, std::vector<int64_t>(plan.partial_values(1), -1));
  Ndarray folded = upload<int64_t>(*gpu, DataType::i64, std::vector<int64_t>(256, -1));
  Ndarray y = upload<int64_t>(*gpu, DataType::i64, {-1});
  const auto i64 = [](int64_t v) { return KernelArg::of(Scalar::of_int(v)); };
  const KernelArg first[] = {KernelArg::of(x), KernelArg::of(partial), i64(n), i64(1), i64(plan.parts),
                             i64(plan.lanes)};
  REQUIRE(gpu->launch(*kernels.partial, first));
  const KernelArg second[] = {KernelArg::of(partial), KernelArg::of(folded), i64(plan.parts * plan.lanes),
                              i64(plan.fold_lanes)};
  REQUIRE(gpu->launch(*kernels.fold, second));
  const KernelArg third[] = {KernelArg::of(folded), KernelArg::of(y), i64(plan.combine_parts())};
  REQUIRE(gpu->launch(*kernels.combine, third));
  CHECK(download<int64_t>(*gpu, y)[0] == want);
  // Thread 1 of part 0 folded elements 1, 257, 513, ... of part 0 ([0, 16666)).
  int64_t lane1 = 0;
  for (int64_t i = 1; i < n / 12; i += 256) lane1 += (i % 1001 - 500) * (i % 1001 - 500);
  CHECK(download<int64_t>(*gpu, partial)[1] == lane1);
}

TEST_CASE("a user kernel's device heap and assertion work on the fake CUDA driver and the fake HIP runtime",
          "[user_kernel]") {
  auto gpu = fake_gpu_executor(GENERATE(from_range(user_kernel_gpus())));
  INFO(to_string(gpu->device().backend()));
  auto heap_user = compile(*gpu, heap_user_ir(), "heap_user",
                           {{"out", ParamKind::out, DataType::i64}, {"bytes", ParamKind::scalar, DataType::i64}});
  Ndarray out = upload<int64_t>(*gpu, DataType::i64, std::vector<int64_t>(64, 0));
  const KernelArg too_much[] = {KernelArg::of(out), KernelArg::of(Scalar::of_int(int64_t{1} << 40))};
  auto refused = gpu->launch(*heap_user, too_much);
  REQUIRE_FALSE(refused);
  CHECK(classify(refused.error()) == ErrorKind::device_heap_exhausted);
  const KernelArg fine[] = {KernelArg::of(out), KernelArg::of(Scalar::of_int(8))};
  CHECK(gpu->launch(*heap_user, fine));  // the device is usable after

  auto check = compile(*gpu, kCheckPositive, "check_positive", {{"x", ParamKind::in, DataType::f32}});
  Ndarray x = upload<float>(*gpu, DataType::f32, {1.0f, -2.0f, 3.0f});
  const KernelArg args[] = {KernelArg::of(x)};
  auto failed = gpu->launch(*check, args);
  REQUIRE_FALSE(failed);
  CHECK_THAT(failed.error().message(), Catch::Contains("x must not be negative") && Catch::Contains("check_positive"));
}

TEST_CASE("a user kernel whose module the GPU driver refuses is named and gives its charge back",
          "[user_kernel]") {
  const Backend backend = GENERATE(from_range(user_kernel_gpus()));
  INFO(to_string(backend));
  kiln::test::FakeGpu &fake = fake_driver(backend);
  auto gpu = make_gpu_executor(backend);
  const uint64_t before = ledger_bytes(*gpu);
  constexpr int kErrorOutOfMemory = 2;  // CUDA_ERROR_OUT_OF_MEMORY, hipErrorOutOfMemory
  const char *load = backend == Backend::cuda ? "cuModuleLoadData" : "hipModuleLoadData";
  REQUIRE(fake.inject_fault(load, 1, kErrorOutOfMemory) == 0);  // the next load
  auto kernel = UserKernel::create(*gpu, text(kSquaredDiff), "squared_diff", squared_diff_params());
  REQUIRE_FALSE(kernel);
  CHECK(kernel.error().result == RhiResult::out_of_memory);
  CHECK_THAT(kernel.error().message(), Catch::Contains("loading user kernel squared_diff"));
  CHECK(ledger_bytes(*gpu) == before);  // the code's charge went back with the failed kernel
  CHECK(compile(*gpu, kSquaredDiff, "squared_diff", squared_diff_params()));  // the next load works
}
