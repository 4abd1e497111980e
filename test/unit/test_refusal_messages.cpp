// Refusals that tell the truth: which check refused (the budget's limit or live free device
// memory) is a field and each is worded with its own figures; `site` names the function that
// refused; the memory layer names no knob, and the interface layer's advice names its own
// (C++, Python, kiln-ops); host memory and injected faults get no device-budget advice.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/executor/advice.h"
#include "kiln/executor/errors.h"
#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using namespace kiln;
using namespace kiln::test::memory;

namespace {

constexpr InterfaceKnobs kPythonLike{"kiln.init(budget_bytes=...)", "kiln.init(reserve_bytes=...)",
                                     "kiln.init(device_heap_bytes=...)"};
constexpr InterfaceKnobs kOpsLike{"--budget-mb", "", "--heap-mb"};

// No knob of any interface: what the memory layer's own messages must not name.
void check_names_no_knob(const std::string &message) {
  CAPTURE(message);
  for (std::string_view knob : {"KILN_POOL_LIMIT_MB", "--budget-mb", "--heap-mb", "kiln.init",
                                "BudgetConfig", "ExecutorConfig"})
    CHECK(message.find(knob) == std::string::npos);
}

Failure oom(OomSource source) {
  Failure f = make_failure(RhiResult::out_of_memory, "cuda:0", "cuMemAlloc_v2", "");
  f.oom_source = source;
  f.requested_bytes = 64_MiB;
  return f;
}

}  // namespace

TEST_CASE("a refusal by live free memory is worded as one, also with no reserve",
          "[refusal][live]") {
  // The case: reserve 0, a 1 GiB budget with 1007.97 MiB left, 64 MiB refused because
  // other processes hold the device.
  MockDevice mock(mock_options(1_GiB, {1000_MiB}));
  auto memory = make_memory(mock, cached(1_GiB, /*reserve_bytes=*/0));
  auto refused = memory->allocate(MemoryCategory::ndarray, 64_MiB);
  REQUIRE_FALSE(refused);
  const Failure &f = refused.error();
  CHECK(f.oom_source == OomSource::budget);
  CHECK(f.budget_check == BudgetCheck::live_free);
  CHECK(std::string_view(f.site) == "BudgetAdaptor::check_live_free");
  const std::string m = f.message();
  CAPTURE(m);
  CHECK(m.find("live free device memory 24.00 MiB minus the 0 B reserve leaves 24.00 MiB") !=
        std::string::npos);
  CHECK(m.find("left") == std::string::npos);  // "budget ... has ... left" is the limit's wording
  CHECK(memory->stats().live_refusals == 1);
  CHECK(memory->stats().ledger.refusals == 0);
  check_names_no_knob(m);
}

TEST_CASE("a refusal by the limit says the budget and what is left, not live memory",
          "[refusal]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(64_MiB, /*reserve_bytes=*/512_MiB));
  auto refused = memory->allocate(MemoryCategory::ndarray, 65_MiB);
  REQUIRE_FALSE(refused);
  const Failure &f = refused.error();
  CHECK(f.budget_check == BudgetCheck::limit);
  const std::string m = f.message();
  CAPTURE(m);
  CHECK(m.find("budget 64.00 MiB has 64.00 MiB left") != std::string::npos);
  CHECK(m.find("live free") == std::string::npos);
  CHECK(memory->stats().live_refusals == 0);
  CHECK(memory->stats().ledger.refusals == 1);
  check_names_no_knob(m);
}

TEST_CASE("site names the function that refused", "[refusal][site]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(64_MiB));
  SECTION("a refusal decided before any reservation (the README's 4 TiB array)") {
    auto refused = memory->allocate(MemoryCategory::ndarray, 4ull << 40);
    REQUIRE_FALSE(refused);
    CHECK(std::string_view(refused.error().site) == "BudgetAdaptor::refused_outright");
  }
  SECTION("a refusal by MemoryBudget::reserve (an observer makes the allocation reserve)") {
    (void)memory->add_oom_observer([](const Failure &) {});
    auto refused = memory->allocate(MemoryCategory::ndarray, 65_MiB);
    REQUIRE_FALSE(refused);
    CHECK(std::string_view(refused.error().site) == "MemoryBudget::reserve");
    CHECK(refused.error().budget_check == BudgetCheck::limit);
  }
  SECTION("an injected fault, single and group") {
    memory->fault_plan().fail_nth_allocation(1);
    auto refused = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    REQUIRE_FALSE(refused);
    CHECK(std::string_view(refused.error().site) == "DeviceMemory::check_fault_plan");
    CHECK(refused.error().injected);
    memory->fault_plan().fail_nth_allocation(1);
    const AllocRequest group[] = {{MemoryCategory::ndarray, 1_MiB}};
    auto group_refused = memory->allocate_group(group);
    REQUIRE_FALSE(group_refused);
    CHECK(std::string_view(group_refused.error().site) == "DeviceMemory::check_fault_plan");
  }
  SECTION("the device's own fault plan") {
    mock.fault_plan().fail_nth_allocation(1);
    auto refused = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    REQUIRE_FALSE(refused);
    CHECK(std::string_view(refused.error().site) == "LlvmDevice::allocate_runtime");
    CHECK(refused.error().injected);
  }
  SECTION("invalid usage, single and group") {
    auto refused = memory->allocate(MemoryCategory::ndarray, 0);
    REQUIRE_FALSE(refused);
    CHECK(std::string_view(refused.error().site) == "DeviceMemory::validate");
    const AllocRequest group[] = {{MemoryCategory::pool_cache, 1_MiB}};
    auto group_refused = memory->allocate_group(group);
    REQUIRE_FALSE(group_refused);
    CHECK(std::string_view(group_refused.error().site) == "DeviceMemory::validate");
  }
}

TEST_CASE("the advice names the caller's own knobs, and the memory layer none",
          "[refusal][advice]") {
  Failure limit = oom(OomSource::budget);
  limit.budget_check = BudgetCheck::limit;
  check_names_no_knob(limit.message());
  CHECK_THAT(advice_for(limit, kCppKnobs),
             Catch::Contains("BudgetConfig::limit_bytes or KILN_POOL_LIMIT_MB"));
  CHECK_THAT(advice_for(limit, kPythonLike),
             Catch::Contains("kiln.init(budget_bytes=...) or KILN_POOL_LIMIT_MB") &&
                 !Catch::Contains("--budget-mb"));
  CHECK_THAT(advice_for(limit, kOpsLike), Catch::Contains("--budget-mb or KILN_POOL_LIMIT_MB") &&
                                              !Catch::Contains("kiln.init"));
  // The named C++ error advises with the C++ API's knobs; describe() with the caller's.
  CHECK_THAT(std::string(BudgetExceededError(limit).what()),
             Catch::Contains("BudgetConfig::limit_bytes"));
  CHECK_THAT(describe(limit, kOpsLike), Catch::Contains("--budget-mb"));

  Failure heap_refused = limit;  // the executor's own device heap, refused by the budget
  heap_refused.category = MemoryCategory::runtime_heap;
  CHECK_THAT(advice_for(heap_refused, kPythonLike),
             Catch::Contains("kiln.init(budget_bytes=...)") && Catch::Contains("kiln.init(device_heap_bytes=...)"));
  CHECK_THAT(advice_for(limit, kPythonLike), !Catch::Contains("device_heap_bytes"));

  Failure live = oom(OomSource::budget);
  live.budget_check = BudgetCheck::live_free;
  CHECK_THAT(advice_for(live, kPythonLike), Catch::Contains("kiln.init(reserve_bytes=...)") &&
                                                !Catch::Contains("budget_bytes"));
  CHECK_THAT(advice_for(live, kOpsLike), !Catch::Contains("reserve"));

  Failure heap = oom(OomSource::device_heap);
  CHECK_THAT(advice_for(heap, kOpsLike), Catch::Contains("--heap-mb"));
  CHECK_THAT(advice_for(heap, kPythonLike), Catch::Contains("kiln.init(device_heap_bytes=...)"));
  check_names_no_knob(heap.message());

  Failure driver = oom(OomSource::driver);
  CHECK_THAT(advice_for(driver, kPythonLike), Catch::Contains("kiln.init(budget_bytes=...)"));
  check_names_no_knob(driver.message());
}

TEST_CASE("host out-of-memory and injected faults get no device-budget advice",
          "[refusal][advice]") {
  Failure host = oom(OomSource::host);
  for (const InterfaceKnobs &knobs : {kCppKnobs, kPythonLike, kOpsLike}) {
    const std::string advice = advice_for(host, knobs);
    CAPTURE(advice);
    CHECK(advice.find("KILN_POOL_LIMIT_MB") == std::string::npos);
    CHECK(advice.find("raise the budget") == std::string::npos);
    CHECK(advice.find("set a budget") == std::string::npos);
    CHECK(advice.find("host memory") != std::string::npos);
  }
  Failure injected = oom(OomSource::driver);
  injected.injected = true;
  injected.driver_status = "injected fault (FaultPlan)";
  for (const InterfaceKnobs &knobs : {kCppKnobs, kPythonLike, kOpsLike}) {
    const std::string advice = advice_for(injected, knobs);
    CAPTURE(advice);
    CHECK(advice.find("injected") != std::string::npos);
    CHECK(advice.find("KILN_POOL_LIMIT_MB") == std::string::npos);
    CHECK(advice.find("budget") == std::string::npos);
  }
  CHECK_THAT(injected.message(), Catch::Contains("could not allocate 64.00 MiB for ndarray: "
                                                 "injected fault (FaultPlan)"));
  CHECK(advice_for(make_failure(RhiResult::invalid_usage, "cpu", "x", "bad"), kCppKnobs).empty());
}

TEST_CASE("a driver out-of-memory answer to an operation that is no allocation names the call",
          "[refusal]") {
  Failure f = oom(OomSource::driver);
  f.site = "cuMemcpyHtoD_v2";
  f.requested_bytes = 0;
  f.allocating = false;
  f.driver_status = "CUDA_ERROR_OUT_OF_MEMORY";
  const std::string m = f.message();
  CAPTURE(m);
  CHECK_THAT(m, Catch::StartsWith("cuda:0 ran out of memory in cuMemcpyHtoD_v2: driver reported "
                                  "CUDA_ERROR_OUT_OF_MEMORY"));
  CHECK(m.find("0 B") == std::string::npos);
  CHECK(m.find("for ndarray") == std::string::npos);
}
