// kiln::testing::sweep on the mock backend: every request failed once, leaks and wrong catches
// found, the named errors for a workload that cannot be swept.
#include <catch2/catch.hpp>

#include <memory>
#include <set>
#include <stdexcept>

#include "kiln/executor/testing/sweep.h"
#include "test_support.h"

using namespace kiln;
using namespace kiln::test;
using kiln::testing::SweepOptions;
using kiln::testing::Workload;
using kiln::testing::WorkloadError;

namespace {

SweepOptions mock_options() {
  SweepOptions options;
  options.config.backend = Backend::mock;
  options.config.device_heap_bytes = 1_MiB;
  options.program = host_program();
  return options;
}

/// An ndarray f32[1024], filled, then y += 2 * x with x staged from the host: ndarray, argument
/// buffer and staging requests.
RhiStatus tiny_workload(LlvmRuntimeExecutor &ex) {
  const int64_t shape[1] = {1024};
  KILN_ASSIGN_OR_RETURN(Ndarray y, ex.ndarray(DataType::f32, shape));
  KILN_RETURN_IF_ERROR(ex.fill(y, Scalar::of(1.0)));
  const std::vector<float> x(1024, 3.0f);
  KILN_RETURN_IF_ERROR(ex.axpy_from_host(Scalar::of(2.0), std::as_bytes(std::span(x)), y));
  return {};
}

/// The requests `workload` makes on a fresh mock executor, counted by the fault plan, and
/// the count of those of `category` (counted through an armed spec selecting it).
uint64_t requests_of(const Workload &workload, std::optional<MemoryCategory> category = {}) {
  auto ex = make_mock_executor();
  runtime::RequestFaultPlan &plan = ex->memory().fault_plan();
  runtime::FaultSpec spec;
  spec.category = category;
  spec.nth = UINT64_MAX;
  plan.arm(spec);
  REQUIRE(workload(*ex));
  return plan.setting().spec->selected_count;
}

}  // namespace

TEST_CASE("sweep fails every request of the workload once, and each run keeps the contract",
          "[sweep]") {
  const uint64_t requests = requests_of(tiny_workload);
  REQUIRE(requests == 2);  // the ndarray and axpy's staging: launches bring their own buffers
  auto report = kiln::testing::sweep(tiny_workload, mock_options());
  REQUIRE(report);
  CHECK(report->allocations == requests);
  REQUIRE(report->runs.size() == requests);
  std::set<MemoryCategory> categories;
  for (std::size_t i = 0; i < report->runs.size(); ++i) {
    const kiln::testing::SweepRun &run = report->runs[i];
    CHECK(run.at == i + 1);
    REQUIRE(run.category.has_value());  // the fault fired, and the observer saw which request
    categories.insert(*run.category);
    CHECK(run.outcome.error_name == "DeviceOutOfMemoryError");
    CHECK(run.outcome.failure->injected);
    CHECK(run.outcome.failure->category == *run.category);
    CHECK(run.ok());
  }
  CHECK(categories.contains(MemoryCategory::ndarray));
  CHECK(categories.contains(MemoryCategory::staging));
  CHECK(report->broken().empty());
}

TEST_CASE("sweep with a category filter fails only that category's requests", "[sweep]") {
  const uint64_t staging = requests_of(tiny_workload, MemoryCategory::staging);
  REQUIRE(staging >= 1);
  SweepOptions options = mock_options();
  options.filter = value_or_throw(runtime::FaultSpec::parse("category=staging"));
  std::vector<uint64_t> told;
  options.on_run = [&told](const kiln::testing::SweepRun &run) { told.push_back(run.at); };
  auto report = kiln::testing::sweep(tiny_workload, options);
  REQUIRE(report);
  CHECK(report->allocations == staging);
  CHECK(told.size() == staging);
  for (const auto &run : report->runs) CHECK(run.category == MemoryCategory::staging);
  CHECK(report->broken().empty());
}

TEST_CASE("sweep reports a workload that keeps an allocation, with its category", "[sweep]") {
  std::optional<Ndarray> kept;  // outlives each run: memory not back at the baseline
  const Workload leaking = [&kept](LlvmRuntimeExecutor &ex) -> RhiStatus {
    const int64_t shape[1] = {4096};
    KILN_ASSIGN_OR_RETURN(Ndarray a, ex.ndarray(DataType::f32, shape));
    kept = a;
    return tiny_workload(ex);
  };
  auto report = kiln::testing::sweep(leaking, mock_options());
  REQUIRE(report);
  const std::vector<kiln::testing::SweepRun> broken = report->broken();
  REQUIRE(!broken.empty());
  CHECK(broken.size() == report->allocations - 1);  // all but the run that refused `kept`
  CHECK(report->runs[0].ok());
  for (const auto &run : broken) {
    CHECK(run.outcome.ok_or_out_of_memory());
    CHECK(run.leaked_bytes[static_cast<std::size_t>(MemoryCategory::ndarray)] >= 4096 * 4);
    CHECK(run.leaked_bytes[static_cast<std::size_t>(MemoryCategory::staging)] == 0);
  }
  kept.reset();
}

TEST_CASE("sweep reports a workload that turns the out-of-memory error into another error",
          "[sweep]") {
  const Workload wrapping = [](LlvmRuntimeExecutor &ex) -> RhiStatus {
    if (auto done = tiny_workload(ex); !done)
      return std::unexpected(invalid_usage("mock", "wrapping", "the workload lost the OOM"));
    return {};
  };
  auto report = kiln::testing::sweep(wrapping, mock_options());
  REQUIRE(report);
  REQUIRE(report->broken().size() == report->allocations);
  for (const auto &run : report->broken()) {
    CHECK(run.outcome.error_name == "InvalidUsageError");
    CHECK_FALSE(run.leaked());
  }
  const Workload throwing = [](LlvmRuntimeExecutor &ex) -> RhiStatus {
    if (auto done = tiny_workload(ex); !done) throw std::runtime_error("not a kiln error");
    return {};
  };
  auto thrown = kiln::testing::sweep(throwing, mock_options());
  REQUIRE(thrown);
  REQUIRE(thrown->broken().size() == thrown->allocations);
  CHECK(thrown->runs[0].outcome.error_name == "C++ exception");
  CHECK(thrown->runs[0].outcome.detail == "not a kiln error");
}

TEST_CASE("sweep accepts the named errors thrown by value_or_throw", "[sweep]") {
  const Workload throwing = [](LlvmRuntimeExecutor &ex) -> RhiStatus {
    value_or_throw(tiny_workload(ex));
    return {};
  };
  auto report = kiln::testing::sweep(throwing, mock_options());
  REQUIRE(report);
  CHECK(report->runs.size() == report->allocations);
  CHECK(report->broken().empty());
}

TEST_CASE("sweep of a non-deterministic workload is NondeterministicWorkloadError, nothing armed "
          "after", "[sweep][bad-input]") {
  int calls = 0;
  std::shared_ptr<DeviceContext> last;  // the last run's device and memory, kept to check them
  const Workload shrinking = [&](LlvmRuntimeExecutor &ex) -> RhiStatus {
    last = ex.context();
    const int64_t shape[1] = {256};
    const int arrays = ++calls == 1 ? 3 : 1;  // the counting run allocates more than the others
    for (int i = 0; i < arrays; ++i) KILN_RETURN_IF_ERROR(ex.ndarray(DataType::f32, shape));
    return {};
  };
  auto report = kiln::testing::sweep(shrinking, mock_options());
  REQUIRE_FALSE(report);
  CHECK(report.error().kind == WorkloadError::Kind::nondeterministic);
  CHECK(report.error().name() == "NondeterministicWorkloadError");
  CHECK_THAT(report.error().message, Catch::Contains("run 2 made 1"));
  REQUIRE(last);
  CHECK_FALSE(last->memory->fault_plan().armed());
  auto next = last->memory->allocate(MemoryCategory::ndarray, 1024);  // nth=2 would refuse this
  REQUIRE(next);
  CHECK(last->memory->free(*next));
}

TEST_CASE("sweep of a workload that fails with no fault is SweepError", "[sweep][bad-input]") {
  const Workload failing = [](LlvmRuntimeExecutor &ex) -> RhiStatus {
    const int64_t shape[1] = {int64_t{1} << 40};  // 4 TiB: more than the mock holds
    KILN_RETURN_IF_ERROR(ex.ndarray(DataType::f32, shape));
    return {};
  };
  auto report = kiln::testing::sweep(failing, mock_options());
  REQUIRE_FALSE(report);
  CHECK(report.error().kind == WorkloadError::Kind::fails_without_fault);
  CHECK(report.error().name() == "SweepError");
  REQUIRE(report.error().cause.has_value());
  CHECK(report.error().cause->result == RhiResult::out_of_memory);
}

TEST_CASE("sweep refuses a filter with its own trigger", "[sweep][bad-input]") {
  SweepOptions options = mock_options();
  options.filter = value_or_throw(runtime::FaultSpec::parse("nth=2,category=ndarray"));
  auto report = kiln::testing::sweep(tiny_workload, options);
  REQUIRE_FALSE(report);
  CHECK(report.error().kind == WorkloadError::Kind::invalid_usage);
  CHECK_THAT(report.error().describe(), Catch::StartsWith("InvalidUsageError: sweep:"));
}

TEST_CASE("sweep refuses a filter of another failure kind than oom", "[sweep][bad-input]") {
  SweepOptions options = mock_options();
  options.filter = value_or_throw(runtime::FaultSpec::parse("kind=lost,category=ndarray"));
  auto report = kiln::testing::sweep(tiny_workload, options);
  REQUIRE_FALSE(report);
  CHECK(report.error().kind == WorkloadError::Kind::invalid_usage);
  CHECK_THAT(report.error().describe(), Catch::Contains("kind=oom"));
}

TEST_CASE("sweep refuses a filter whose kernel= names no kernel", "[sweep][bad-input]") {
  SweepOptions options = mock_options();
  options.filter = value_or_throw(runtime::FaultSpec::parse("kernel=axpyy"));
  auto report = kiln::testing::sweep(tiny_workload, options);
  REQUIRE_FALSE(report);  // not a sweep of 0 requests that passes having tested nothing
  CHECK(report.error().kind == WorkloadError::Kind::invalid_usage);
  CHECK_THAT(report.error().describe(), Catch::Contains("kernel=axpyy names no kernel"));
}

TEST_CASE("sweep of a workload whose counting run selects no request is SweepError, not a pass",
          "[sweep][bad-input]") {
  // A workload that asks for no memory (a launch on device arrays requests none), and a filter
  // selecting none of a workload's requests: both would "pass" having failed nothing.
  const Workload no_requests = [](LlvmRuntimeExecutor &) -> RhiStatus { return {}; };
  auto none = kiln::testing::sweep(no_requests, mock_options());
  REQUIRE_FALSE(none);
  CHECK(none.error().kind == WorkloadError::Kind::selects_nothing);
  CHECK(none.error().name() == "SweepError");
  CHECK_THAT(none.error().message, Catch::Contains("made no allocation request, so"));

  SweepOptions options = mock_options();
  options.filter = value_or_throw(runtime::FaultSpec::parse("category=argument_buffer"));
  auto filtered = kiln::testing::sweep(tiny_workload, options);  // its requests: ndarray, staging
  REQUIRE_FALSE(filtered);
  CHECK(filtered.error().kind == WorkloadError::Kind::selects_nothing);
  CHECK_THAT(filtered.error().message,
             Catch::Contains("no allocation request selected by 'category=argument_buffer'"));
}
