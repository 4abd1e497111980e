// The executor's success paths and every bad input of the spine issue: each gets its named error
// and leaves the process, the device and every other allocation usable.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <thread>

#include "kiln/executor/launcher.h"
#include "test_support.h"

using namespace kiln;
using namespace kiln::test;

namespace {
const int64_t kShape8[1] = {8};

ErrorKind kind_of(const Failure &f) { return classify(f); }
}  // namespace

TEST_CASE("ops compute the right values on a small array", "[executor]") {
  auto ex = make_executor();
  Ndarray x = upload<float>(*ex, DataType::f32, {1, -2, 3, -4, 5});
  Ndarray y = upload<float>(*ex, DataType::f32, {10, 10, 10, 10, 10});
  REQUIRE(ex->axpy(Scalar::of(2.0), x, y));
  CHECK(download<float>(*ex, y) == std::vector<float>{12, 6, 16, 2, 20});
  auto sum = ex->reduce_sum(y);
  REQUIRE(sum);
  CHECK(sum->f64 == Approx(56.0));
  auto positive = ex->compact_positive(x);
  REQUIRE(positive);
  CHECK(download<float>(*ex, *positive) == std::vector<float>{1, 3, 5});
}

TEST_CASE("a negative dimension is InvalidUsage and allocates nothing", "[executor][bad-input]") {
  auto ex = make_executor();
  const uint64_t before = ledger_bytes(*ex);
  const int64_t shape[2] = {4, -1};
  auto a = ex->ndarray(DataType::f32, shape);
  REQUIRE_FALSE(a);
  CHECK(kind_of(a.error()) == ErrorKind::invalid_usage);
  CHECK_THAT(a.error().message(), Catch::Contains("negative dimension"));
  CHECK(ledger_bytes(*ex) == before);
  CHECK(ex->ndarray(DataType::f32, kShape8));
}

TEST_CASE("a shape whose byte count overflows is InvalidUsage, never a small allocation",
          "[executor][bad-input]") {
  auto ex = make_executor();
  const uint64_t before = ledger_bytes(*ex);
  const int64_t elements_overflow[2] = {int64_t{1} << 40, int64_t{1} << 40};
  const int64_t bytes_overflow[1] = {int64_t{1} << 62};  // 2^62 f64 elements = 2^65 bytes
  for (auto shape : {std::span<const int64_t>(elements_overflow), std::span<const int64_t>(bytes_overflow)}) {
    auto a = ex->ndarray(DataType::f64, shape);
    REQUIRE_FALSE(a);
    CHECK(kind_of(a.error()) == ErrorKind::invalid_usage);
    CHECK_THAT(a.error().message(), Catch::Contains("overflows"));
  }
  CHECK(ledger_bytes(*ex) == before);
  // only the runtime state, the launch's argument and result buffers, and the heap
  CHECK(ex->device().live_allocation_count() == 4);
}

TEST_CASE("an array larger than the budget is BudgetExceeded and the next small one works",
          "[executor][oom]") {
  auto ex = make_executor();
  const uint64_t before = ledger_bytes(*ex);
  const int64_t huge[1] = {int64_t{1} << 40};  // 4 TiB of f32
  auto a = ex->ndarray(DataType::f32, huge);
  REQUIRE_FALSE(a);
  CHECK(kind_of(a.error()) == ErrorKind::budget_exceeded);
  CHECK(a.error().requested_bytes == (uint64_t{1} << 42));
  CHECK_THAT(a.error().message(), Catch::Contains("4.00 TiB") && Catch::Contains("budget") &&
                                      Catch::Contains("f32[1099511627776]"));
  CHECK(ledger_bytes(*ex) == before);
  auto small = ex->ndarray(DataType::f32, kShape8);
  REQUIRE(small);
  CHECK(ex->fill(*small, Scalar::of(1.0)));
}

TEST_CASE("a zero-size ndarray allocates nothing and every op on it is a no-op", "[executor]") {
  auto ex = make_executor();
  const uint64_t before = ledger_bytes(*ex);
  const int64_t shape[2] = {0, 5};
  auto a = ex->ndarray(DataType::i32, shape);
  REQUIRE(a);
  CHECK(a->num_elements() == 0);
  CHECK(a->nbytes() == 0);
  CHECK(ledger_bytes(*ex) == before);
  CHECK(ex->fill(*a, Scalar::of_int(3)));
  auto sum = ex->reduce_sum(*a);
  REQUIRE(sum);
  CHECK(sum->i64 == 0);
  auto compacted = ex->compact_positive(*a);
  REQUIRE(compacted);
  CHECK(compacted->num_elements() == 0);
  CHECK(ex->free(*a));
}

TEST_CASE("using an ndarray after free and freeing it twice are InvalidUsage", "[executor][bad-input]") {
  auto ex = make_executor();
  Ndarray keep = upload<int32_t>(*ex, DataType::i32, {1, 2, 3});
  auto a = ex->ndarray(DataType::i32, kShape8);
  REQUIRE(a);
  Ndarray alias = *a;
  REQUIRE(ex->free(*a));
  auto twice = ex->free(alias);
  REQUIRE_FALSE(twice);
  CHECK(kind_of(twice.error()) == ErrorKind::invalid_usage);
  auto filled = ex->fill(alias, Scalar::of_int(1));
  REQUIRE_FALSE(filled);
  CHECK(kind_of(filled.error()) == ErrorKind::invalid_usage);
  CHECK_THAT(filled.error().message(), Catch::Contains("used after it was freed"));
  std::vector<int32_t> out(8);
  CHECK_FALSE(ex->read(alias, std::as_writable_bytes(std::span<int32_t>(out))));
  CHECK(download<int32_t>(*ex, keep) == std::vector<int32_t>{1, 2, 3});  // others untouched
}

TEST_CASE("a launch with mismatched dtypes or shapes is InvalidUsage and launches nothing",
          "[executor][bad-input]") {
  auto ex = make_executor();
  Ndarray f = upload<float>(*ex, DataType::f32, {1, 2, 3});
  Ndarray d = upload<double>(*ex, DataType::f64, {1, 2, 3});
  Ndarray f4 = upload<float>(*ex, DataType::f32, {1, 2, 3, 4});
  const uint64_t allocations = ex->memory().stats().allocations;
  auto wrong_dtype = ex->copy(f, d);
  REQUIRE_FALSE(wrong_dtype);
  CHECK(kind_of(wrong_dtype.error()) == ErrorKind::invalid_usage);
  auto wrong_shape = ex->axpy(Scalar::of(1.0), f4, f);
  REQUIRE_FALSE(wrong_shape);
  CHECK(kind_of(wrong_shape.error()) == ErrorKind::invalid_usage);
  const int64_t s23[2] = {2, 3}, s22[2] = {2, 2};
  Ndarray a = value_or_throw(ex->ndarray(DataType::f32, s23));
  Ndarray c = value_or_throw(ex->ndarray(DataType::f32, s22));
  auto bad_matmul = ex->matmul(c, a, a);
  REQUIRE_FALSE(bad_matmul);
  CHECK(kind_of(bad_matmul.error()) == ErrorKind::invalid_usage);
  auto bad_host = ex->axpy_from_host(Scalar::of(1.0), std::span<const std::byte>(), f);
  REQUIRE_FALSE(bad_host);
  CHECK(kind_of(bad_host.error()) == ErrorKind::invalid_usage);
  // Only the two matmul operands were allocated: no launch buffers for the refused launches.
  CHECK(ex->memory().stats().allocations == allocations + 2);
  CHECK(download<float>(*ex, f) == std::vector<float>{1, 2, 3});
}

TEST_CASE("an unknown kernel and an unknown backend are InvalidUsage", "[executor][bad-input]") {
  auto program = host_program();
  auto kernel = program->kernel("kiln_no_such_kernel_f32");
  REQUIRE_FALSE(kernel);
  CHECK(kind_of(kernel.error()) == ErrorKind::invalid_usage);
  CHECK_THAT(kernel.error().message(), Catch::Contains("kiln_no_such_kernel_f32"));
  CHECK(program->kernel("kiln_axpy_f32"));
  auto backend = parse_backend("tpu");
  REQUIRE_FALSE(backend);
  CHECK(kind_of(backend.error()) == ErrorKind::invalid_usage);
  CHECK_THAT(backend.error().message(), Catch::Contains("tpu"));
}

TEST_CASE("the executor opens the device_ordinal it is given: mock:1 is InvalidUsage",
          "[executor][bad-input]") {
  ExecutorConfig config;
  config.backend = Backend::mock;
  config.device_ordinal = 1;
  auto ex = LlvmRuntimeExecutor::create(config);
  REQUIRE_FALSE(ex);
  CHECK(kind_of(ex.error()) == ErrorKind::invalid_usage);
  CHECK_THAT(ex.error().message(), Catch::Contains("mock:1"));
  config.device_ordinal = 0;
  CHECK(LlvmRuntimeExecutor::create(config));
}

TEST_CASE("a GPU backend without its driver library is NotSupported", "[executor]") {
  const char *saved = std::getenv("KILN_CUDA_DRIVER");
  const std::string restore = saved != nullptr ? saved : "";
  setenv("KILN_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
  ExecutorConfig config;
  config.backend = Backend::cuda;
  auto ex = LlvmRuntimeExecutor::create(config);
  if (saved != nullptr) setenv("KILN_CUDA_DRIVER", restore.c_str(), 1); else unsetenv("KILN_CUDA_DRIVER");
  REQUIRE_FALSE(ex);
  CHECK(kind_of(ex.error()) == ErrorKind::not_supported);
  CHECK_THAT(ex.error().message(), Catch::Contains("/nonexistent/libcuda.so.1"));
}

TEST_CASE("a program of another arch than the device's is InvalidUsage", "[executor][bad-input]") {
  ExecutorConfig config;
  config.backend = Backend::mock;
  auto nvptx = Program::shared(CodegenArch::nvptx64);
  REQUIRE(nvptx);
  auto ex = LlvmRuntimeExecutor::create(config, *nvptx);
  REQUIRE_FALSE(ex);
  CHECK(kind_of(ex.error()) == ErrorKind::invalid_usage);
}

TEST_CASE("an ndarray of another executor is InvalidUsage", "[executor][bad-input]") {
  auto ex1 = make_executor();
  auto ex2 = make_executor();
  Ndarray a = upload<float>(*ex1, DataType::f32, {1});
  auto filled = ex2->fill(a, Scalar::of(2.0));
  REQUIRE_FALSE(filled);
  CHECK(kind_of(filled.error()) == ErrorKind::invalid_usage);
  auto freed = ex2->free(a);
  REQUIRE_FALSE(freed);
  CHECK(kind_of(freed.error()) == ErrorKind::invalid_usage);
  CHECK_FALSE(a.is_freed());  // the refused free left the array alone
  CHECK(ex1->free(a));
}

TEST_CASE("a launch whose staging does not fit is refused whole: nothing held, nothing launched",
          "[executor][oom][launch]") {
  auto ex = make_mock_executor(256_MiB, 4_MiB);  // 1 MiB heap + code leave < 3 MiB
  const std::vector<float> x(512 * 1024, 1.0f);  // 2 MiB staged
  const std::vector<float> y_values(512 * 1024, 5.0f);
  Ndarray y = upload<float>(*ex, DataType::f32, y_values);
  const uint64_t ledger_before = ledger_bytes(*ex);
  const uint64_t device_before = ex->device().live_allocation_bytes();
  auto launched = ex->axpy_from_host(Scalar::of(1.0), bytes_of(x), y);
  REQUIRE_FALSE(launched);
  CHECK(kind_of(launched.error()) == ErrorKind::budget_exceeded);
  CHECK_THAT(launched.error().message(), Catch::Contains("preparing launch of kiln_axpy_f32"));
  CHECK(ledger_bytes(*ex) == ledger_before);
  CHECK(ex->device().live_allocation_bytes() == device_before);
  CHECK(download<float>(*ex, y) == y_values);  // nothing ran
}

TEST_CASE("a fault at any allocation of a launch leaves the ledger as it was", "[executor][oom][launch]") {
  auto ex = make_mock_executor();
  const std::vector<int64_t> x = {1, 2, 3, 4};
  Ndarray y = upload<int64_t>(*ex, DataType::i64, {10, 20, 30, 40});
  const uint64_t before = ledger_bytes(*ex);
  int refused = 0;
  for (uint64_t k = 1; k <= 3; ++k) {
    ex->memory().fault_plan().fail_nth_allocation(k);
    auto launched = ex->axpy_from_host(Scalar::of_int(1), bytes_of(x), y);
    ex->memory().fault_plan().clear();
    if (!launched) {
      ++refused;
      CHECK(kind_of(launched.error()) == ErrorKind::device_out_of_memory);
      CHECK(launched.error().category == MemoryCategory::staging);
    }
    CHECK(ledger_bytes(*ex) == before);
    CHECK(ex->memory().in_use_by_category()[static_cast<int>(MemoryCategory::staging)] == 0);
  }
  CHECK(refused == 1);  // the staging: the argument and result buffers are the executor's
  CHECK(download<int64_t>(*ex, y) == std::vector<int64_t>{12, 24, 36, 48});  // the two clean runs
}

namespace {

uint64_t held(LlvmRuntimeExecutor &ex, MemoryCategory category) {
  return ex.memory().in_use_by_category()[static_cast<std::size_t>(category)];
}

}  // namespace

TEST_CASE("the executor holds the launch buffers for its life; launches without host operands "
          "request nothing", "[executor][launch]") {
  ExecutorConfig config;
  config.backend = Backend::mock;
  config.num_threads = 2;
  auto ex = make_executor(config);
  const uint64_t args_bytes = held(*ex, MemoryCategory::argument_buffer);
  const uint64_t result_bytes = held(*ex, MemoryCategory::result_buffer);
  CHECK(args_bytes >= sizeof(KilnKernelArgs));
  CHECK(result_bytes >= CpuKernelLauncher::max_tasks_for(2) * sizeof(KilnTaskResult));
  CHECK(CpuKernelLauncher::max_tasks_for(2) == 8);

  std::vector<double> values(1'000'003);  // 16 tasks' worth of elements: capped at 8 slots
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<double>(i % 7);
  Ndarray x = upload<double>(*ex, DataType::f64, values);
  Ndarray y = upload<double>(*ex, DataType::f64, values);
  const uint64_t requests = ex->memory().fault_plan().allocation_count();
  REQUIRE(ex->fill(y, Scalar::of(1.0)));
  REQUIRE(ex->axpy(Scalar::of(2.0), x, y));
  const Scalar sum = value_or_throw(ex->reduce_sum(y));
  const Scalar small = value_or_throw(ex->reduce_sum(x));  // after a launch of more tasks
  CHECK(ex->memory().fault_plan().allocation_count() == requests);
  double expected = 0;
  for (double v : values) expected += 1.0 + 2.0 * v;
  CHECK(sum.f64 == expected);
  double expected_small = 0;
  for (double v : values) expected_small += v;
  CHECK(small.f64 == expected_small);
  CHECK(held(*ex, MemoryCategory::argument_buffer) == args_bytes);
  CHECK(held(*ex, MemoryCategory::result_buffer) == result_bytes);
}

TEST_CASE("a launch under a full budget still runs: its buffers are the executor's",
          "[executor][oom][launch]") {
  auto ex = make_mock_executor(256_MiB, 64_MiB);
  Ndarray x = upload<float>(*ex, DataType::f32, std::vector<float>(4096, 2.0f));
  Ndarray y = upload<float>(*ex, DataType::f32, std::vector<float>(4096, 1.0f));
  ex->memory().release_cached();
  ex->memory().set_limit_bytes(ex->memory().in_use_bytes());  // full: any growth is refused
  const int64_t shape[1] = {16};
  auto refused = ex->ndarray(DataType::f32, shape);
  REQUIRE_FALSE(refused);
  CHECK(kind_of(refused.error()) == ErrorKind::budget_exceeded);

  REQUIRE(ex->fill(y, Scalar::of(3.0)));
  REQUIRE(ex->axpy(Scalar::of(2.0), x, y));
  CHECK(value_or_throw(ex->reduce_sum(y)).f64 == 4096 * 7.0);
  CHECK(download<float>(*ex, y) == std::vector<float>(4096, 7.0f));
}

TEST_CASE("an executor whose launch buffers do not fit is not made, with the named error",
          "[executor][oom][launch]") {
  ExecutorConfig config;
  config.backend = Backend::mock;
  config.device_heap_bytes = 0;
  config.num_threads = 2;
  config.budget.caching = false;  // no size classes: the ledger holds exactly what was asked
  const uint64_t needed = [&] {
    auto ex = make_executor(config);
    return ledger_bytes(*ex);
  }();
  config.budget.limit_bytes = needed - 1;
  auto created = LlvmRuntimeExecutor::create(config, host_program());
  REQUIRE_FALSE(created);
  CHECK(kind_of(created.error()) == ErrorKind::budget_exceeded);
  CHECK_THAT(created.error().message(), Catch::Contains("launch buffers"));
  config.budget.limit_bytes = needed;
  CHECK(LlvmRuntimeExecutor::create(config, host_program()));
}

TEST_CASE("device heap exhaustion is DeviceHeapExhausted and the next launch runs normally",
          "[executor][oom][heap]") {
  ExecutorConfig config;
  config.device_heap_bytes = 4_KiB;
  auto ex = make_executor(config);
  const std::vector<double> x(100000, 1.0);  // 800 KB of positives: cannot fit in 4 KiB
  Ndarray dx = upload<double>(*ex, DataType::f64, x);
  const uint64_t before = ledger_bytes(*ex);
  auto compacted = ex->compact_positive(dx);
  REQUIRE_FALSE(compacted);
  CHECK(kind_of(compacted.error()) == ErrorKind::device_heap_exhausted);
  CHECK(compacted.error().category == MemoryCategory::runtime_heap);
  CHECK(compacted.error().requested_bytes > 4_KiB);
  CHECK_THAT(compacted.error().message(), Catch::Contains("device heap exhausted"));
  CHECK(ledger_bytes(*ex) == before);
  auto sum = ex->reduce_sum(dx);
  REQUIRE(sum);
  CHECK(sum->f64 == 100000.0);
  Ndarray small = upload<double>(*ex, DataType::f64, {-1.0, 2.0});
  auto ok = ex->compact_positive(small);
  REQUIRE(ok);
  CHECK(download<double>(*ex, *ok) == std::vector<double>{2.0});
}

TEST_CASE("an executor whose heap does not fit the budget is refused at creation", "[executor][oom]") {
  ExecutorConfig config;
  config.backend = Backend::mock;
  config.budget.limit_bytes = 1_MiB;
  config.device_heap_bytes = 2_MiB;
  auto ex = LlvmRuntimeExecutor::create(config, host_program());
  REQUIRE_FALSE(ex);
  CHECK(kind_of(ex.error()) == ErrorKind::budget_exceeded);
  CHECK_THAT(ex.error().message(), Catch::Contains("device runtime heap"));
}

TEST_CASE("ndarrays may outlive their executor", "[executor]") {
  Ndarray a;
  {
    auto ex = make_executor();
    a = upload<int32_t>(*ex, DataType::i32, {1, 2});
  }
  CHECK(a.num_elements() == 2);
  CHECK_FALSE(a.is_freed());
}  // a's destructor frees through the DeviceContext it keeps alive (ASan checks)

TEST_CASE("write and read check the byte count", "[executor][bad-input]") {
  auto ex = make_executor();
  Ndarray a = value_or_throw(ex->ndarray(DataType::f32, kShape8));
  const std::vector<float> three(3);
  auto written = ex->write(a, bytes_of(three));
  REQUIRE_FALSE(written);
  CHECK(kind_of(written.error()) == ErrorKind::invalid_usage);
}

TEST_CASE("launches use every core unless num_threads says otherwise", "[executor]") {
  auto all = make_executor();
  CHECK(all->worker_threads() == std::max(1u, std::thread::hardware_concurrency()));
  ExecutorConfig one;
  one.num_threads = 1;
  CHECK(make_executor(one)->worker_threads() == 1);
}

TEST_CASE("a zero dimension beside large ones is a zero-size array, not an overflow", "[executor]") {
  auto ex = make_executor();
  const int64_t shape[3] = {int64_t{1} << 20, int64_t{1} << 20, 0};
  auto a = ex->ndarray(DataType::f64, shape);
  REQUIRE(a);
  CHECK(a->nbytes() == 0);
  const int64_t leading_zero[3] = {0, int64_t{1} << 20, int64_t{1} << 20};
  auto b = ex->ndarray(DataType::f64, leading_zero);
  REQUIRE(b);
  CHECK(b->num_elements() == 0);
}

TEST_CASE("a zero-size shape whose other dimensions overflow numpy's int64 is InvalidUsage",
          "[executor][bad-input]") {
  auto ex = make_executor();
  const uint64_t allocations = ex->memory().stats().allocations;
  const int64_t zero_and_huge[2] = {0, int64_t{1} << 62};  // 2**62 f32 elements: 2**64 bytes
  auto a = ex->ndarray(DataType::f32, zero_and_huge);
  REQUIRE_FALSE(a);
  CHECK(kind_of(a.error()) == ErrorKind::invalid_usage);
  CHECK_THAT(a.error().message(), Catch::Contains("non-zero dimensions"));
  const int64_t huge_then_zero[3] = {int64_t{1} << 40, int64_t{1} << 40, 0};
  CHECK_FALSE(ex->ndarray(DataType::f64, huge_then_zero));
  CHECK(ex->memory().stats().allocations == allocations);
}

TEST_CASE("more than 32 dimensions is InvalidUsage; 32 are fine", "[executor][bad-input]") {
  auto ex = make_executor();
  const std::vector<int64_t> ones32(kMaxDimensions, 1), ones33(kMaxDimensions + 1, 1);
  CHECK(ex->ndarray(DataType::i32, ones32));
  auto too_many = ex->ndarray(DataType::i32, ones33);
  REQUIRE_FALSE(too_many);
  CHECK(kind_of(too_many.error()) == ErrorKind::invalid_usage);
  CHECK_THAT(too_many.error().message(), Catch::Contains("at most 32"));
}

TEST_CASE("a dtype value outside DataType is InvalidUsage", "[executor][bad-input]") {
  auto ex = make_executor();
  const auto bogus = static_cast<DataType>(4);
  CHECK_FALSE(is_valid(bogus));
  auto a = ex->ndarray(bogus, kShape8);
  REQUIRE_FALSE(a);
  CHECK(kind_of(a.error()) == ErrorKind::invalid_usage);
}

TEST_CASE("matmul_output_shape checks a matmul whole before its output exists",
          "[executor][bad-input]") {
  auto ex = make_executor();
  const int64_t s_tall[2] = {100000, 1}, s_wide[2] = {2, 100000}, s23[2] = {2, 3}, s34[2] = {3, 4};
  Ndarray tall = value_or_throw(ex->ndarray(DataType::f32, s_tall));
  Ndarray wide = value_or_throw(ex->ndarray(DataType::f32, s_wide));
  Ndarray a = value_or_throw(ex->ndarray(DataType::f32, s23));
  Ndarray b = value_or_throw(ex->ndarray(DataType::f32, s34));
  Ndarray b64 = value_or_throw(ex->ndarray(DataType::f64, s34));
  const uint64_t allocations = ex->memory().stats().allocations;
  auto mismatched = ex->matmul_output_shape(tall, wide);  // (100000,1) @ (2,100000): k 1 vs 2
  REQUIRE_FALSE(mismatched);
  CHECK(kind_of(mismatched.error()) == ErrorKind::invalid_usage);
  CHECK_FALSE(ex->matmul_output_shape(a, b64));                  // dtypes differ
  CHECK_FALSE(ex->matmul_output_shape(a, value_or_throw(ex->ndarray(DataType::f32, kShape8))));
  CHECK(ex->memory().stats().allocations == allocations + 1);  // only the 1-D operand above
  auto ok = ex->matmul_output_shape(a, b);
  REQUIRE(ok);
  CHECK(*ok == std::array<int64_t, 2>{2, 4});
}

TEST_CASE("matmul into one of its own operands is InvalidUsage", "[executor][bad-input]") {
  auto ex = make_executor();
  const int64_t s22[2] = {2, 2};
  Ndarray a = value_or_throw(ex->ndarray(DataType::f32, s22));
  Ndarray b = value_or_throw(ex->ndarray(DataType::f32, s22));
  auto aliased = ex->matmul(a, a, b);
  REQUIRE_FALSE(aliased);
  CHECK(kind_of(aliased.error()) == ErrorKind::invalid_usage);
  CHECK_FALSE(ex->matmul(b, a, b));
}

TEST_CASE("a float sum that does not fit int64 leaves i64 at 0 instead of undefined behaviour",
          "[executor]") {
  auto ex = make_executor();
  Ndarray x = upload<float>(*ex, DataType::f32, {std::numeric_limits<float>::infinity(), 1.0f});
  auto sum = ex->reduce_sum(x);
  REQUIRE(sum);
  CHECK(std::isinf(sum->f64));
  CHECK(sum->i64 == 0);
  CHECK(Scalar::of(std::nan("")).i64 == 0);
  CHECK(Scalar::of(-3.7).i64 == -3);
}

TEST_CASE("an executor whose code object does not fit the budget is refused before any allocation",
          "[executor][oom]") {
  ExecutorConfig config;
  config.backend = Backend::mock;
  config.budget.limit_bytes = 4_KiB;  // the JIT's code object alone is larger
  auto ex = LlvmRuntimeExecutor::create(config, host_program());
  REQUIRE_FALSE(ex);
  CHECK(kind_of(ex.error()) == ErrorKind::budget_exceeded);
  CHECK(ex.error().category == MemoryCategory::code_object);
  CHECK(ex.error().requested_bytes == host_program()->code_size_bytes());
}

TEST_CASE("a host operand is staged as staging, and a fault at its buffer names that category",
          "[executor][launch]") {
  auto ex = make_mock_executor();
  const std::vector<int64_t> x = {1, 2, 3, 4};
  Ndarray y = upload<int64_t>(*ex, DataType::i64, {10, 20, 30, 40});
  const auto staging = static_cast<std::size_t>(MemoryCategory::staging);
  ex->memory().reset_peaks();
  REQUIRE(ex->axpy_from_host(Scalar::of_int(1), bytes_of(x), y));
  CHECK(ex->memory().stats().ledger.peak_bytes[staging] >= x.size() * sizeof(int64_t));
  CHECK(ex->memory().in_use_by_category()[staging] == 0);  // given back after the launch
  ex->memory().fault_plan().fail_nth_allocation(1);  // the staging: the launch's only request
  auto refused = ex->axpy_from_host(Scalar::of_int(1), bytes_of(x), y);
  ex->memory().fault_plan().clear();
  REQUIRE_FALSE(refused);
  CHECK(refused.error().category == MemoryCategory::staging);
}
