// The failure kinds of a FaultSpec (runtime/memory/fault_spec.h) and its kernel= filter, through
// an executor on cpu and mock: kind=lost (device_lost, sticky, nothing held), kind=launch (a
// non-sticky launch failure of the selected kernel, its buffers released), kind=heap
// (DeviceHeapExhausted, injected), kernel= on allocation kinds (only the requests made for that
// kernel's launch), and the parse errors of the combinations that cannot work.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "kiln/executor/errors.h"
#include "kiln/rhi/mock_device.h"
#include "kiln/runtime/memory/fault_spec.h"
#include "test_support.h"

using namespace kiln;
using namespace kiln::test;
using kiln::runtime::FaultKind;
using kiln::runtime::FaultSpec;

namespace {

FaultSpec parsed(const std::string &text) {
  auto spec = FaultSpec::parse(text);
  INFO("spec: '" << text << "'");
  REQUIRE(spec);
  return *spec;
}

/// The parse error's detail for `text` (fails the test when it parses).
std::string parse_error(const std::string &text) {
  auto spec = FaultSpec::parse(text);
  INFO("spec: '" << text << "'");
  REQUIRE_FALSE(spec);
  CHECK(spec.error().result == RhiResult::invalid_usage);
  return spec.error().detail;
}

/// An executor on `backend` (cpu or mock) with one worker thread.
std::unique_ptr<LlvmRuntimeExecutor> executor_on(Backend backend) {
  ExecutorConfig config;
  config.backend = backend;
  config.num_threads = 1;
  return make_executor(config);
}

}  // namespace

TEST_CASE("FaultSpec::parse reads kind=lost|launch|heap and kernel=, and writes them back",
          "[fault_spec][fault_kinds]") {
  CHECK(parsed("kind=lost").kind == FaultKind::lost);
  CHECK(parsed("kind=launch").kind == FaultKind::launch);
  CHECK(parsed("kind=heap,nth=2").kind == FaultKind::heap);
  CHECK(parsed("nth=1").kind == FaultKind::oom);
  const FaultSpec launch = parsed("kind=launch,kernel=axpy,nth=2");
  CHECK(launch.kernel == "axpy");
  CHECK(launch.nth == 2);
  CHECK(launch.targets_launches());
  CHECK(parsed("kernel=kiln_matmul_f64,category=staging").kernel == "kiln_matmul_f64");
  const FaultSpec round = parsed(parsed("kind=lost,kernel=fill,p=0.5,seed=3").to_text());
  CHECK(round.kind == FaultKind::lost);
  CHECK(round.kernel == "fill");
  CHECK(round.probability == 0.5);
  CHECK(parsed(parsed("kind=heap").to_text()).kind == FaultKind::heap);
}

TEST_CASE("kernel= names an op (every dtype) or one kernel, never a longer op's prefix",
          "[fault_spec][fault_kinds]") {
  CHECK(FaultSpec::kernel_named("axpy", "kiln_axpy_f32"));
  CHECK(FaultSpec::kernel_named("axpy", "kiln_axpy_i64"));
  CHECK(FaultSpec::kernel_named("kiln_axpy_f32", "kiln_axpy_f32"));
  CHECK_FALSE(FaultSpec::kernel_named("kiln_axpy_f32", "kiln_axpy_f64"));
  CHECK(FaultSpec::kernel_named("reduce_sum", "kiln_reduce_sum_f32"));
  CHECK_FALSE(FaultSpec::kernel_named("reduce", "kiln_reduce_sum_f32"));
  CHECK_FALSE(FaultSpec::kernel_named("axpy", ""));  // a request made outside a launch
  CHECK_FALSE(FaultSpec::kernel_named("axpy", "kiln_fill_f32"));
}

TEST_CASE("a fault spec that cannot work is invalid_usage naming the term",
          "[fault_spec][fault_kinds]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"kind=launch,category=staging", "term 'category' filters allocation requests; kind=launch"},
      {"kind=heap,min_bytes=1MiB", "term 'min_bytes' filters allocation requests; kind=heap"},
      {"kind=heap,min_bytes=0", "term 'min_bytes'"},
      {"kind=boom", "term 'kind=boom' names no failure kind (oom, lost, launch, heap)"},
      {"kernel=", "term 'kernel=' needs an op or kernel name"},
      {"kernel=1axpy", "term 'kernel=1axpy' needs an op or kernel name"},
      {"kernel=a-b", "term 'kernel=a-b'"},
      {"kind=lost,kind=oom", "term 'kind=oom' repeats its key"},
  };
  for (const auto &[text, expected] : cases) {
    INFO("spec: '" << text << "'");
    const std::string detail = parse_error(text);
    CHECK_THAT(detail, Catch::Contains(expected));
    CHECK_THAT(detail, Catch::Contains("grammar: comma-separated key=value terms"));
  }
}

TEST_CASE("the executor refuses a kernel= that names no kernel, naming the ops, and arms nothing",
          "[fault_spec][fault_kinds]") {
  CHECK(check_fault_kernel(parsed("kernel=axpy")));
  CHECK(check_fault_kernel(parsed("kind=launch,kernel=kiln_compact_positive_i32")));
  CHECK(check_fault_kernel(parsed("nth=1")));
  for (const std::string text : {"kernel=axpyy", "kind=heap,kernel=reduce", "kernel=kiln_axpy_f16"}) {
    INFO("spec: '" << text << "'");
    auto known = check_fault_kernel(parsed(text));
    REQUIRE_FALSE(known);
    CHECK(known.error().result == RhiResult::invalid_usage);
    CHECK_THAT(known.error().detail, Catch::Contains("names no kernel"));
    CHECK_THAT(known.error().detail,
               Catch::Contains("fill, copy, axpy, reduce_sum, matmul, compact_positive"));
  }
  auto ex = executor_on(Backend::mock);
  auto armed = ex->arm_fault(parsed("kind=launch,kernel=nosuch"));
  REQUIRE_FALSE(armed);
  CHECK(classify(armed.error()) == ErrorKind::invalid_usage);
  CHECK_FALSE(ex->memory().fault_plan().armed());
}

TEST_CASE("kind=lost fails the request device_lost, marks the device lost for every later call, "
          "and holds nothing",
          "[fault_spec][fault_kinds][lost]") {
  const Backend backend = GENERATE(Backend::cpu, Backend::mock);
  INFO("backend: " << to_string(backend));
  auto ex = executor_on(backend);
  Ndarray before = upload<float>(*ex, DataType::f32, {1.0f, 2.0f});
  const uint64_t ledger_before = ledger_bytes(*ex);
  int observed = 0;  // OOM observers see out-of-memory refusals, not a lost device
  ex->memory().add_oom_observer([&observed](const Failure &) { ++observed; });
  REQUIRE(ex->arm_fault(parsed("kind=lost,nth=2")));
  const int64_t shape[1] = {256};
  Ndarray first = value_or_throw(ex->ndarray(DataType::f32, shape));  // the 1st: passes
  auto second = ex->ndarray(DataType::f32, shape);
  REQUIRE_FALSE(second);
  CHECK(second.error().result == RhiResult::device_lost);
  CHECK(classify(second.error()) == ErrorKind::device_lost);
  CHECK(second.error().injected);
  CHECK_THAT(second.error().message(), Catch::Contains("injected device loss"));
  CHECK(ex->device().is_lost());
  CHECK(observed == 0);
  value_or_throw(ex->free(first));
  CHECK(ledger_bytes(*ex) == ledger_before);  // the refused request holds nothing

  // Sticky: later unrelated calls fail fast, with the plan cleared too.
  ex->memory().fault_plan().clear();
  auto again = ex->ndarray(DataType::f32, shape);
  REQUIRE_FALSE(again);
  CHECK(again.error().result == RhiResult::device_lost);
  CHECK_THAT(again.error().message(), Catch::Contains("was lost earlier"));
  std::vector<float> out(2);
  auto read = ex->read(before, std::as_writable_bytes(std::span<float>(out)));
  REQUIRE_FALSE(read);
  CHECK(read.error().result == RhiResult::device_lost);
  auto filled = ex->fill(before, Scalar::of(3.0));
  REQUIRE_FALSE(filled);
  CHECK(filled.error().result == RhiResult::device_lost);
  auto charged = ex->memory().charge(MemoryCategory::code_object, 4096);  // a module's bytes
  REQUIRE_FALSE(charged);
  CHECK(charged.error().result == RhiResult::device_lost);
  CHECK(ledger_bytes(*ex) == ledger_before);

  // Recovery: the arrays let go, a new executor for the backend works.
  value_or_throw(ex->free(before));
  ExecutorConfig config = ex->config();
  REQUIRE(recreate_executor(ex, config));
  CHECK_FALSE(ex->device().is_lost());
  CHECK(download<float>(*ex, upload<float>(*ex, DataType::f32, {4.0f})) == std::vector<float>{4.0f});
}

TEST_CASE("an injected loss keeps the device: what is freed after it still reaches the driver",
          "[fault_spec][fault_kinds][lost]") {
  auto ex = executor_on(Backend::mock);
  auto &mock = dynamic_cast<MockDevice &>(ex->device());
  (void)ex->memory().release_cached();
  const uint64_t held_at_start = mock.held_bytes();
  const int64_t shape[1] = {1 << 18};
  Ndarray kept = value_or_throw(ex->ndarray(DataType::f32, shape));
  REQUIRE(mock.held_bytes() > held_at_start);
  REQUIRE(ex->arm_fault(parsed("kind=lost,nth=1")));
  REQUIRE_FALSE(ex->ndarray(DataType::f32, shape));
  REQUIRE(ex->device().is_lost());
  CHECK_FALSE(ex->device().resources_lost());  // a real sticky fault's memory is gone; not this
  value_or_throw(ex->free(kept));
  (void)ex->memory().release_cached();
  CHECK(mock.held_bytes() == held_at_start);  // freed at the driver, not only forgotten
}

TEST_CASE("kind=launch,kernel=axpy fails axpy launches only, as a launch failure, nothing leaked",
          "[fault_spec][fault_kinds][launch]") {
  const Backend backend = GENERATE(Backend::cpu, Backend::mock);
  INFO("backend: " << to_string(backend));
  auto ex = executor_on(backend);
  Ndarray y = upload<float>(*ex, DataType::f32, {1.0f, 2.0f});
  const std::vector<float> x = {10.0f, 20.0f};
  const uint64_t ledger_before = ledger_bytes(*ex);
  const uint64_t device_before = ex->device().live_allocation_bytes();
  REQUIRE(ex->arm_fault(parsed("kind=launch,kernel=axpy,nth=2")));
  REQUIRE(ex->memory().fault_plan().armed());
  REQUIRE(ex->axpy_from_host(Scalar::of(1.0), bytes_of(x), y));  // the 1st axpy launch runs
  REQUIRE(ex->fill(y, Scalar::of(5.0)));                          // not selected
  REQUIRE(ex->reduce_sum(y));                                     // not selected
  auto failed = ex->axpy_from_host(Scalar::of(1.0), bytes_of(x), y);  // the 2nd axpy launch
  REQUIRE_FALSE(failed);
  CHECK(failed.error().result == RhiResult::error);
  CHECK(classify(failed.error()) == ErrorKind::runtime_error);
  CHECK(failed.error().injected);
  CHECK_THAT(failed.error().message(), Catch::Contains("kiln_axpy_f32"));
  CHECK_THAT(failed.error().message(), Catch::Contains("injected launch fault"));
  CHECK_FALSE(ex->device().is_lost());  // not sticky
  // Its staging, argument and result buffers went back: the ledger and the device at baseline.
  CHECK(ledger_bytes(*ex) == ledger_before);
  CHECK(ex->memory().in_use_by_category()[static_cast<std::size_t>(MemoryCategory::staging)] == 0);
  ex->memory().release_cached();
  CHECK(ex->device().live_allocation_bytes() == device_before);
  CHECK(download<float>(*ex, y) == std::vector<float>{5.0f, 5.0f});  // nothing ran
  REQUIRE(ex->axpy_from_host(Scalar::of(1.0), bytes_of(x), y));  // once: the 3rd runs
  CHECK(download<float>(*ex, y) == std::vector<float>{15.0f, 25.0f});
}

TEST_CASE("kind=heap reports device-heap exhaustion of the selected launch as a real one",
          "[fault_spec][fault_kinds][heap]") {
  auto ex = executor_on(Backend::mock);
  Ndarray x = upload<double>(*ex, DataType::f64, {-1.0, 2.0, 3.0});
  const uint64_t ledger_before = ledger_bytes(*ex);
  REQUIRE(ex->arm_fault(parsed("kind=heap,kernel=compact_positive")));
  REQUIRE(ex->reduce_sum(x));  // another kernel: passes
  auto compacted = ex->compact_positive(x);
  REQUIRE_FALSE(compacted);
  CHECK(compacted.error().result == RhiResult::out_of_memory);
  CHECK(compacted.error().oom_source == OomSource::device_heap);
  CHECK(classify(compacted.error()) == ErrorKind::device_heap_exhausted);
  CHECK(is_out_of_memory(classify(compacted.error())));
  CHECK(compacted.error().injected);
  CHECK(compacted.error().category == MemoryCategory::runtime_heap);
  CHECK_THAT(compacted.error().message(), Catch::Contains("device heap exhausted"));
  CHECK_THAT(compacted.error().message(), Catch::Contains("kiln_compact_positive_f64"));
  CHECK_THAT(compacted.error().message(), !Catch::Contains("a kernel asked for"));
  CHECK_THROWS_AS(value_or_throw(ex->compact_positive(x)), DeviceHeapExhaustedError);
  CHECK(ledger_bytes(*ex) == ledger_before);
  ex->memory().fault_plan().clear();
  auto ok = ex->compact_positive(x);
  REQUIRE(ok);
  CHECK(download<double>(*ex, *ok) == std::vector<double>{2.0, 3.0});
}

TEST_CASE("kernel= on an allocation kind fails only the requests made for that kernel's launch",
          "[fault_spec][fault_kinds][kernel]") {
  auto ex = executor_on(Backend::mock);
  Ndarray y = upload<int64_t>(*ex, DataType::i64, {1, 2});
  Ndarray xd = upload<int64_t>(*ex, DataType::i64, {1, 2});
  const std::vector<int64_t> x = {10, 20};
  const uint64_t ledger_before = ledger_bytes(*ex);

  // nth counts only axpy's requests: an ndarray, fill's launch and an axpy of device arrays
  // (its argument and result buffers are the executor's) make none for axpy.
  REQUIRE(ex->arm_fault(parsed("kernel=axpy,nth=1")));
  const int64_t shape[1] = {64};
  Ndarray other = value_or_throw(ex->ndarray(DataType::i64, shape));  // no launch: passes
  REQUIRE(ex->fill(other, Scalar::of_int(1)));                         // fill's launch: passes
  value_or_throw(ex->free(other));
  REQUIRE(ex->axpy(Scalar::of_int(1), xd, y));  // no request at all: passes, y = {2, 4}
  auto first = ex->axpy_from_host(Scalar::of_int(1), bytes_of(x), y);  // axpy's first request
  REQUIRE_FALSE(first);
  CHECK(classify(first.error()) == ErrorKind::device_out_of_memory);
  CHECK(first.error().injected);
  CHECK(first.error().category == MemoryCategory::staging);
  CHECK_THAT(first.error().message(), Catch::Contains("preparing launch of kiln_axpy_i64"));
  CHECK(ledger_bytes(*ex) == ledger_before);

  // With category=staging: axpy without staging passes, axpy with staging is refused.
  REQUIRE(ex->arm_fault(parsed("kernel=axpy,category=staging")));
  REQUIRE(ex->axpy(Scalar::of_int(1), xd, y));
  auto refused = ex->axpy_from_host(Scalar::of_int(1), bytes_of(x), y);
  REQUIRE_FALSE(refused);
  CHECK(classify(refused.error()) == ErrorKind::device_out_of_memory);
  CHECK(refused.error().category == MemoryCategory::staging);
  CHECK(ledger_bytes(*ex) == ledger_before);
  CHECK(download<int64_t>(*ex, y) == std::vector<int64_t>{3, 6});  // only the plain axpys ran
}
