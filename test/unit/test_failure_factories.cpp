// One factory per failure kind (rhi/failures.h): each sets its kind's fields and records where it
// was called, so `site` can be checked against the function that built the failure; the context
// macros add "while ..." lines on failure only.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using namespace kiln;
using kiln::runtime::AllocRequest;
using kiln::runtime::DeviceMemory;
using namespace kiln::test::memory;

namespace {

// Whether the function that built `f` (its factory's caller) is the one its site names: the site
// "Class::function" appears in the recorded function's signature followed by "(".
bool site_is_builder(const Failure &f) {
  const std::string site = std::string(f.site) + "(";
  return std::string_view(f.where.function_name()).find(site) != std::string_view::npos;
}

RhiStatus fails_with(Failure f) { return std::unexpected(std::move(f)); }

RhiStatus adds_context(int n) {
  KILN_RETURN_IF_ERROR_CONTEXT(n < 0 ? fails_with(invalid_usage("cpu", "t", "negative")) : RhiStatus{},
                               "while checking n = {}", n);
  return {};
}

RhiExpected<int> assigns_with_context(RhiExpected<int> in) {
  KILN_ASSIGN_OR_RETURN_CONTEXT(const int v, in, "while reading {}", "the value");
  return v + 1;
}

}  // namespace

TEST_CASE("each failure factory sets its kind's fields", "[errors][factories]") {
  const int line = __LINE__ + 1;
  const Failure driver = driver_out_of_memory("cuda:0", "cuMemAlloc_v2", "CUDA_ERROR_OUT_OF_MEMORY",
                                              AllocationFigures{MemoryCategory::staging, 4_MiB, 0});
  CHECK(driver.result == RhiResult::out_of_memory);
  CHECK(driver.oom_source == OomSource::driver);
  CHECK((driver.category == MemoryCategory::staging && driver.requested_bytes == 4_MiB));
  CHECK((driver.allocating && !driver.injected));
  CHECK(std::string_view(driver.driver_status) == "CUDA_ERROR_OUT_OF_MEMORY");
  CHECK(driver.where.line() == static_cast<uint32_t>(line));
  CHECK(std::string_view(driver.where.file_name()).ends_with("test_failure_factories.cpp"));

  const Failure injected =
      injected_fault("mock", "s", AllocationFigures{MemoryCategory::ndarray, 1_MiB, 0});
  CHECK((injected.oom_source == OomSource::driver && injected.injected));

  const Failure call = driver_call_failure(RhiResult::out_of_memory, "cuda:0", "cuMemcpyHtoD_v2",
                                           "CUDA_ERROR_OUT_OF_MEMORY", 2);
  CHECK((call.oom_source == OomSource::driver && !call.allocating && call.detail.empty()));
  const Failure error_call =
      driver_call_failure(RhiResult::error, "cuda:0", "cuLaunchKernel", "CUDA_ERROR_UNKNOWN", 999);
  CHECK((error_call.oom_source == OomSource::none && error_call.detail == "cuLaunchKernel failed with code 999"));

  MemorySnapshot live;
  live.free_bytes = 3_MiB;
  live.device_read = true;
  live.reserve_bytes = 1_MiB;
  const Failure refusal =
      budget_refusal(BudgetCheck::live_free, "s",
                     AllocationFigures{MemoryCategory::ndarray, 8_MiB, 0}, live);
  CHECK((refusal.oom_source == OomSource::budget && refusal.budget_check == BudgetCheck::live_free));
  CHECK((refusal.has_memory && refusal.memory.free_bytes == 3_MiB && refusal.memory.reserve_bytes == 1_MiB));

  // A driver's answer to an allocation call is about that allocation, whatever the answer.
  const AllocationFigures asked{MemoryCategory::staging, 5_MiB + 1, 0};
  const Failure alloc_oom = driver_call_failure(RhiResult::out_of_memory, "cuda:0", "cuMemAlloc_v2",
                                                "CUDA_ERROR_OUT_OF_MEMORY", 2, &asked);
  CHECK((alloc_oom.allocating && alloc_oom.oom_source == OomSource::driver));
  CHECK((alloc_oom.category == MemoryCategory::staging && alloc_oom.requested_bytes == 5_MiB + 1));
  const Failure alloc_lost = driver_call_failure(RhiResult::device_lost, "cuda:0", "cuMemAlloc_v2",
                                                 "CUDA_ERROR_ILLEGAL_ADDRESS", 700, &asked);
  CHECK((alloc_lost.result == RhiResult::device_lost && alloc_lost.allocating));
  CHECK((alloc_lost.oom_source == OomSource::none && alloc_lost.requested_bytes == 5_MiB + 1));
  CHECK(alloc_lost.detail == "cuMemAlloc_v2 failed with code 700");

  // A group's budget refusal names the whole group; a single request's has no such detail.
  const Failure group = budget_refusal(BudgetCheck::limit, "s",
                                       AllocationFigures{MemoryCategory::ndarray, 12_MiB, 0}, live,
                                       GroupReuse{3, 1, 4_MiB});
  CHECK(group.detail == "ndarray (3 buffers granted together, 1 of them, " + format_bytes(4_MiB) +
                            ", reusable from the pool's cache)");
  CHECK(refusal.detail.empty());

  const Failure heap = device_heap_exhausted("cpu", "KernelLauncher::launch", 64, "kernel k");
  CHECK((heap.oom_source == OomSource::device_heap && heap.category == MemoryCategory::runtime_heap));
  CHECK((heap.requested_bytes == 64 && heap.detail == "kernel k"));

  const Failure host = host_out_of_memory("host", "s", 5, "arrays", "std::bad_alloc");
  CHECK((host.oom_source == OomSource::host && host.requested_bytes == 5));
  CHECK(std::string_view(host.driver_status) == "std::bad_alloc");

  const Failure usage = invalid_usage("cpu", "s", "bad");
  CHECK((usage.result == RhiResult::invalid_usage && usage.oom_source == OomSource::none));
}

TEST_CASE("the context macros add one line on failure only", "[errors][factories]") {
  CHECK(adds_context(1));
  const RhiStatus failed = adds_context(-2);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().context == std::vector<std::string>{"while checking n = -2"});
  CHECK(failed.error().message().find("while checking n = -2") != std::string::npos);

  const RhiExpected<int> ok = assigns_with_context(41);
  REQUIRE(ok);
  CHECK(*ok == 42);
  const RhiExpected<int> bad = assigns_with_context(std::unexpected(invalid_usage("cpu", "t", "x")));
  REQUIRE_FALSE(bad);
  CHECK(bad.error().context == std::vector<std::string>{"while reading the value"});
}

TEST_CASE("a memory failure's site is the function that built it", "[errors][factories][site]") {
  MockDevice mock(mock_options(1_GiB, {1_GiB - 8_MiB}));  // the live check leaves 8 MiB
  auto memory = make_memory(mock, cached(64_MiB));
  const auto check = [](const RhiExpected<DeviceAllocation> &refused, std::string_view site) {
    REQUIRE_FALSE(refused);
    CAPTURE(refused.error().where.function_name());
    CHECK(std::string_view(refused.error().site) == site);
    CHECK(site_is_builder(refused.error()));
  };
  check(memory->allocate(MemoryCategory::ndarray, 4ull << 40), "BudgetAdaptor::refused_outright");
  check(memory->allocate(MemoryCategory::ndarray, 16_MiB), "BudgetAdaptor::check_live_free");
  check(memory->allocate(MemoryCategory::ndarray, 0), "DeviceMemory::validate");
  memory->fault_plan().fail_nth_allocation(1);
  check(memory->allocate(MemoryCategory::ndarray, 1_MiB), "DeviceMemory::check_fault_plan");
  mock.fault_plan().fail_nth_allocation(1);
  check(memory->allocate(MemoryCategory::ndarray, 1_MiB), "LlvmDevice::allocate_runtime");
  const uint64_t id = memory->add_oom_observer([](const Failure &) {});
  check(memory->allocate(MemoryCategory::ndarray, 65_MiB), "MemoryBudget::reserve");
  CHECK(memory->remove_oom_observer(id));
}
