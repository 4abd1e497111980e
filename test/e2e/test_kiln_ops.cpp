// kiln-ops in process: the suite's verdicts, the ledger after every case, fault sweeps and
// repetitions. (test/e2e/kiln_ops_cli.sh checks the binary itself.)
#include <catch2/catch.hpp>

#include "kiln/rhi/mock_device.h"
#include "exit_status.h"
#include "methods.h"
#include "suite.h"
#include "test_support.h"

using namespace kiln;
using namespace kiln::test;

namespace {

ops::SuiteOptions mock_options(uint64_t max_array_bytes) {
  ops::SuiteOptions options;
  options.config.backend = Backend::mock;
  options.config.device_heap_bytes = 8_MiB;
  options.max_array_bytes = max_array_bytes;
  options.program = host_program();
  options.out = nullptr;
  return options;
}

std::vector<std::string> verdict_lines(const ops::SuiteReport &report, std::size_t begin, std::size_t end) {
  std::vector<std::string> lines;
  for (std::size_t i = begin; i < end; ++i) {
    const auto &r = report.results[i];
    lines.push_back(r.name + (r.verdict == ops::Verdict::ok ? " OK" : " " + r.error_name));
  }
  return lines;
}

}  // namespace

TEST_CASE("on mock every case is OK and after each case the ledger equals what the device holds",
          "[e2e][ledger]") {
  const ops::SuiteReport report = ops::run_suite(mock_options(1_MiB));
  REQUIRE_FALSE(report.setup_failure);
  REQUIRE(report.results.size() >= 40);
  CHECK(report.failed == 0);
  CHECK(report.refused == 0);
  CHECK(report.ledger_after_teardown_bytes == 0);
  CHECK(report.device_after_teardown_bytes == 0);
  for (const auto &r : report.results) {
    INFO(r.name << ": " << r.detail);
    // code objects live in the JIT's memory, every other category in device allocations
    CHECK(r.ledger_after_bytes - r.ledger_code_bytes == r.device_live_bytes);
    // and a finished case holds nothing beyond the executor's own set-up and the pool's cache
    CHECK(r.ledger_after_bytes - r.ledger_cached_bytes == report.ledger_baseline_bytes);
  }
}

TEST_CASE("after teardown the ledger and the device both hold nothing", "[e2e][ledger]") {
  ExecutorConfig config;
  config.backend = Backend::mock;
  auto ex = make_executor(config);
  MockDevice &mock = static_cast<MockDevice &>(ex->device());
  Ndarray a = upload<float>(*ex, DataType::f32, std::vector<float>(1000, 1.0f));
  REQUIRE(ex->reduce_sum(a));
  CHECK(mock.held_bytes() > 0);
  a = Ndarray();  // last handle: frees
  CHECK(ex->memory().in_use_bytes() ==
        ex->memory().in_use_by_category()[static_cast<int>(MemoryCategory::code_object)] +
            ex->device().live_allocation_bytes());
  // A second executor's device is fresh: nothing carried across executors.
  auto ex2 = make_executor(config);
  CHECK(static_cast<MockDevice &>(ex2->device()).high_water_bytes() <= ex2->device().live_allocation_bytes());
}

TEST_CASE("a fault at every allocation of a mock run refuses exactly the faulted case", "[e2e][fault]") {
  ops::SuiteOptions options = mock_options(64_KiB);
  const ops::SuiteReport clean = ops::run_suite(options);
  REQUIRE(clean.failed == 0);
  REQUIRE(clean.allocations > 50);
  for (uint64_t k = 1; k <= clean.allocations; ++k) {
    options.fault_at = k;
    const ops::SuiteReport faulted = ops::run_suite(options);
    INFO("fault at allocation " << k);
    REQUIRE_FALSE(faulted.setup_failure);
    CHECK(faulted.failed == 0);
    CHECK(faulted.refused == 1);
    CHECK(faulted.ledger_after_teardown_bytes == 0);
    CHECK(faulted.device_after_teardown_bytes == 0);
    CHECK(faulted.ok + 1 == static_cast<int>(clean.results.size()));
    for (const auto &r : faulted.results) {
      if (r.verdict == ops::Verdict::refused) CHECK(r.error_name == "DeviceOutOfMemoryError");
      CHECK(r.ledger_after_bytes - r.ledger_code_bytes == r.device_live_bytes);
      CHECK(r.ledger_after_bytes - r.ledger_cached_bytes == faulted.ledger_baseline_bytes);
    }
  }
}

TEST_CASE("repetitions under a small budget give identical verdicts", "[e2e][budget]") {
  ops::SuiteOptions options = mock_options(16_MiB);
  options.config.budget.limit_bytes = 20_MiB;
  options.filter = "/(f32|i64)/";
  options.repeat = 3;
  const ops::SuiteReport report = ops::run_suite(options);
  REQUIRE(report.results.size() % 3 == 0);
  const std::size_t n = report.results.size() / 3;
  CHECK(report.refused > 0);  // i64 medium axpy/copy (16 MiB) + the 8 MiB heap exceed 20 MiB
  CHECK(report.failed == 0);
  const auto first = verdict_lines(report, 0, n);
  CHECK(verdict_lines(report, n, 2 * n) == first);
  CHECK(verdict_lines(report, 2 * n, 3 * n) == first);
  for (const auto &r : report.results)
    if (r.verdict == ops::Verdict::refused) CHECK(r.error_name == "BudgetExceededError");
}

TEST_CASE("a heap too small for the compaction case refuses it and the next case runs", "[e2e][heap]") {
  ops::SuiteOptions options = mock_options(16_MiB);
  options.config.device_heap_bytes = 64_KiB;
  options.filter = "compact_heap/f32/medium|fill/f32/tiny";
  const ops::SuiteReport report = ops::run_suite(options);
  REQUIRE(report.results.size() == 2);
  const auto &compact = report.results[0].name.starts_with("compact") ? report.results[0] : report.results[1];
  const auto &fill = report.results[0].name.starts_with("fill") ? report.results[0] : report.results[1];
  CHECK(compact.verdict == ops::Verdict::refused);
  CHECK(compact.error_name == "DeviceHeapExhaustedError");
  CHECK(fill.verdict == ops::Verdict::ok);
}

TEST_CASE("a fault at every allocation of a cpu run leaves the ledger at 0 after teardown",
          "[e2e][fault]") {
  ops::SuiteOptions options = mock_options(16_KiB);
  options.config.backend = Backend::cpu;
  options.filter = "/(f32|i64)/";
  const ops::SuiteReport clean = ops::run_suite(options);
  REQUIRE(clean.failed == 0);
  for (uint64_t k = 1; k <= clean.allocations; ++k) {
    options.fault_at = k;
    const ops::SuiteReport faulted = ops::run_suite(options);
    INFO("fault at allocation " << k);
    CHECK(faulted.failed == 0);
    CHECK(faulted.refused == 1);
    CHECK(faulted.ledger_after_teardown_bytes == 0);
    CHECK(faulted.device_after_teardown_bytes == 0);
  }
}

TEST_CASE("filters are RE2: deep nesting is matched without recursion, bad ones are invalid_usage",
          "[e2e][filter]") {
  const std::string deep = std::string(20000, '(') + "fill/f32/tiny" + std::string(20000, ')');
  REQUIRE(ops::check_filter(deep));
  ops::SuiteOptions options = mock_options(1_MiB);
  options.filter = deep;
  const std::vector<ops::Case> cases = ops::selected_cases(options);
  REQUIRE(cases.size() == 1);
  CHECK(cases[0].name == "fill/f32/tiny");
  for (const std::string bad : {"(", "a{2,1}", "[z-a]", "(?<name"}) {
    auto checked = ops::check_filter(bad);
    REQUIRE_FALSE(checked);
    CHECK(classify(checked.error()) == ErrorKind::invalid_usage);
    options.filter = bad;
    CHECK(ops::selected_cases(options).empty());
  }
}

TEST_CASE("--sweep over the tiny f32 cases fails each request once, naming the case it hit",
          "[e2e][sweep]") {
  ops::SuiteOptions options = mock_options(1_MiB);
  options.filter = "/f32/tiny$";
  const ops::SweepModeReport report = ops::run_sweep_mode(options);
  REQUIRE_FALSE(report.error.has_value());
  CHECK(report.clean.ok == 10);  // 8 built-in ops and 2 user kernels (elementwise, reduction)
  CHECK(report.allocations == report.clean.allocations);  // selected = all requests: no filter
  REQUIRE(report.runs.size() == report.allocations);
  CHECK(report.broken == 0);
  for (std::size_t i = 0; i < report.runs.size(); ++i) {
    const ops::SweepRunResult &r = report.runs[i];
    CHECK(r.run.at == i + 1);
    CHECK(r.ok);
    CHECK(r.verdict == "REFUSED DeviceOutOfMemoryError");
    CHECK_THAT(r.case_name, Catch::EndsWith("/f32/tiny"));
    CHECK(r.run.category.has_value());
  }
  CHECK(report.runs.front().case_name == "allocate/f32/tiny");
  CHECK(report.runs.back().case_name == "user_reduction/f32/tiny");
  CHECK(ops::exit_status_of(report) == ops::ExitStatus::passed);
}

TEST_CASE("a sweep's exit status: 1 when a run broke the contract, 3 for a named error",
          "[e2e][sweep]") {
  ops::SweepModeReport report;
  CHECK(ops::exit_status_of(report) == ops::ExitStatus::passed);
  report.broken = 1;
  CHECK(ops::exit_status_of(report) == ops::ExitStatus::failed);
  report.error = kiln::testing::WorkloadError{kiln::testing::WorkloadError::Kind::nondeterministic,
                                              "run 2 made 1", std::nullopt};
  CHECK(ops::exit_status_of(report) == ops::ExitStatus::no_answer);
  report.error->kind = kiln::testing::WorkloadError::Kind::setup_failed;
  report.error->cause = make_failure(RhiResult::not_supported, "cuda", "dlopen", "no driver");
  CHECK(ops::exit_status_of(report) == ops::ExitStatus::backend_unavailable);
  ops::MinBudgetModeReport budget;
  budget.error = kiln::testing::WorkloadError{
      kiln::testing::WorkloadError::Kind::fails_at_max_budget, "too small", std::nullopt};
  CHECK(ops::exit_status_of(budget) == ops::ExitStatus::no_answer);
  CHECK(ops::to_string(ops::ExitStatus::no_answer) == "no_answer");
}

TEST_CASE("--min-budget finds a budget that passes, the refusal just below it", "[e2e][min_budget]") {
  ops::SuiteOptions options = mock_options(16_MiB);
  options.config.device_heap_bytes = 1_MiB;
  options.config.budget.limit_bytes = 64_MiB;
  options.filter = "^allocate/f32/medium$";
  const ops::MinBudgetModeReport report = ops::run_min_budget_mode(options);
  REQUIRE(report.budget.has_value());
  CHECK(report.budget->max_budget_bytes == 64_MiB);
  CHECK(report.budget->budget_bytes > 4_MiB + 1_MiB);
  CHECK(report.budget->budget_bytes < 64_MiB);
  REQUIRE(report.budget->refused.has_value());
  CHECK(report.budget->refused->category == MemoryCategory::ndarray);
  CHECK(report.budget->refused->requested_bytes == 4_MiB);
  CHECK(ops::exit_status_of(report) == ops::ExitStatus::passed);
}
