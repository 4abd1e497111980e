// kiln::testing::min_budget on the mock backend: agrees with a bisection done here, and names
// the workloads it cannot answer for.
#include <catch2/catch.hpp>

#include "kiln/executor/testing/min_budget.h"
#include "test_support.h"

using namespace kiln;
using namespace kiln::test;
using kiln::testing::MinBudgetOptions;
using kiln::testing::Workload;
using kiln::testing::WorkloadError;

namespace {

MinBudgetOptions mock_options() {
  MinBudgetOptions options;
  options.config.backend = Backend::mock;
  options.config.device_heap_bytes = 1_MiB;
  options.program = host_program();
  options.max_budget_bytes = 64_MiB;
  options.granularity_bytes = 64_KiB;
  return options;
}

/// Two arrays of 3 MiB and 1 MiB, a fill and a staged axpy.
RhiStatus two_arrays(LlvmRuntimeExecutor &ex) {
  const int64_t big[1] = {3 << 18}, small[1] = {1 << 18};
  KILN_ASSIGN_OR_RETURN(Ndarray a, ex.ndarray(DataType::f32, big));
  KILN_ASSIGN_OR_RETURN(Ndarray b, ex.ndarray(DataType::f32, small));
  KILN_RETURN_IF_ERROR(ex.fill(b, Scalar::of(1.0)));
  const std::vector<float> x(1 << 18, 2.0f);
  KILN_RETURN_IF_ERROR(ex.axpy_from_host(Scalar::of(1.0), std::as_bytes(std::span(x)), b));
  return {};
}

/// Whether `workload` succeeds on a fresh mock executor under `budget_bytes`.
bool fits(const Workload &workload, uint64_t budget_bytes) {
  ExecutorConfig config = mock_options().config;
  config.budget.limit_bytes = budget_bytes;
  auto ex = LlvmRuntimeExecutor::create(config, host_program());
  if (!ex) return false;
  return workload(**ex).has_value();
}

}  // namespace

TEST_CASE("min_budget agrees with a bisection done by hand", "[min_budget]") {
  const MinBudgetOptions options = mock_options();
  auto report = kiln::testing::min_budget(two_arrays, options);
  REQUIRE(report);
  uint64_t lo = 0, hi = 64_MiB;  // the same invariant: hi fits, lo does not (or is 0)
  while (hi - lo > 64_KiB) {
    const uint64_t mid = lo + (hi - lo) / 2;
    (fits(two_arrays, mid) ? hi : lo) = mid;
  }
  CHECK(report->budget_bytes == hi);
  CHECK(report->max_budget_bytes == 64_MiB);
  CHECK(fits(two_arrays, report->budget_bytes));
  CHECK_FALSE(fits(two_arrays, report->budget_bytes - 64_KiB));
  CHECK(report->runs == 1 + 10);  // the largest, then log2(64 MiB / 64 KiB)
  CHECK(report->peak_bytes[static_cast<std::size_t>(MemoryCategory::ndarray)] >= 4_MiB);
  CHECK(report->peak_bytes[static_cast<std::size_t>(MemoryCategory::staging)] >= 1_MiB);
  REQUIRE(report->refused.has_value());
  CHECK(is_out_of_memory(classify(*report->refused)));
  CHECK(report->refused_budget_bytes < report->budget_bytes);
  CHECK(report->refused_budget_bytes >= report->budget_bytes - 64_KiB);
}

TEST_CASE("min_budget of a workload that fails under the largest budget is MinBudgetError",
          "[min_budget][bad-input]") {
  MinBudgetOptions options = mock_options();
  options.max_budget_bytes = 2_MiB;  // the 3 MiB array never fits
  auto report = kiln::testing::min_budget(two_arrays, options);
  REQUIRE_FALSE(report);
  CHECK(report.error().kind == WorkloadError::Kind::fails_at_max_budget);
  CHECK(report.error().name() == "MinBudgetError");
  CHECK_THAT(report.error().message, Catch::Contains("2097152 bytes"));
}

TEST_CASE("min_budget under a largest budget the executor itself does not fit is its set-up "
          "failure, with the budget's figure",
          "[min_budget][bad-input]") {
  MinBudgetOptions options = mock_options();
  options.max_budget_bytes = std::nullopt;    // the config's own budget is the largest
  options.config.budget.limit_bytes = 512_KiB;  // below the 1 MiB device heap
  auto report = kiln::testing::min_budget(two_arrays, options);
  REQUIRE_FALSE(report);
  CHECK(report.error().kind == WorkloadError::Kind::setup_failed);
  REQUIRE(report.error().cause.has_value());
  CHECK(is_out_of_memory(classify(*report.error().cause)));
  CHECK_THAT(report.error().message, Catch::Contains("524288 bytes") &&
                                         Catch::Contains("the executor itself"));
}

TEST_CASE("min_budget of a workload that gives another error than OOM is MinBudgetError",
          "[min_budget][bad-input]") {
  const Workload wrapping = [](LlvmRuntimeExecutor &ex) -> RhiStatus {
    if (auto done = two_arrays(ex); !done)
      return std::unexpected(invalid_usage("mock", "wrapping", "the workload lost the OOM"));
    return {};
  };
  auto report = kiln::testing::min_budget(wrapping, mock_options());
  REQUIRE_FALSE(report);
  CHECK(report.error().kind == WorkloadError::Kind::not_out_of_memory);
  CHECK(report.error().name() == "MinBudgetError");
  REQUIRE(report.error().cause.has_value());
  CHECK(report.error().cause->result == RhiResult::invalid_usage);
}

TEST_CASE("min_budget refuses a granularity of 0", "[min_budget][bad-input]") {
  MinBudgetOptions options = mock_options();
  options.granularity_bytes = 0;
  auto report = kiln::testing::min_budget(two_arrays, options);
  REQUIRE_FALSE(report);
  CHECK(report.error().kind == WorkloadError::Kind::invalid_usage);
}

TEST_CASE("min_budget counts the executor's own set-up: a refused set-up is a failed try",
          "[min_budget]") {
  const Workload nothing = [](LlvmRuntimeExecutor &) -> RhiStatus { return {}; };
  auto report = kiln::testing::min_budget(nothing, mock_options());
  REQUIRE(report);
  CHECK(report->budget_bytes >= 1_MiB);  // the heap chunk at least
  CHECK(report->budget_bytes <= 1_MiB + 2 * 64_KiB + host_program()->code_size_bytes());
  REQUIRE(report->refused.has_value());  // refused by create(), below the answer
  CHECK(is_out_of_memory(classify(*report->refused)));
}
