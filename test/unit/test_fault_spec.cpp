// FaultSpec (runtime/memory/fault_spec.h): parsing every key and unit, each malformed case named,
// and RequestFaultPlan::arm deciding requests by it (nth overall, nth of a category, min_bytes,
// seeded probability), leaving nothing held after a faulted request.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/device_memory.h"
#include "kiln/runtime/memory/fault_spec.h"
#include "memory_test_support.h"

using kiln::runtime::FaultSpec;
using namespace kiln::test::memory;

namespace {

/// The parse error's detail for `text` (fails the test when it parses).
std::string parse_error(const std::string &text) {
  auto spec = FaultSpec::parse(text);
  REQUIRE_FALSE(spec);
  CHECK(spec.error().result == RhiResult::invalid_usage);
  CHECK(std::string(spec.error().site) == "FaultSpec::parse");
  return spec.error().detail;
}

/// Allocates `count` requests of `category` and `size_bytes`, freeing each; which ones (1-based)
/// were refused, each an injected driver out-of-memory.
std::vector<int> refused_indices(DeviceMemory &memory, int count,
                                 MemoryCategory category = MemoryCategory::ndarray,
                                 uint64_t size_bytes = 1_KiB) {
  std::vector<int> refused;
  for (int i = 1; i <= count; ++i) {
    auto a = memory.allocate(category, size_bytes);
    if (a) {
      REQUIRE(memory.free(*a));
      continue;
    }
    CHECK(a.error().result == RhiResult::out_of_memory);
    CHECK(a.error().oom_source == OomSource::driver);
    CHECK(a.error().injected);
    refused.push_back(i);
  }
  return refused;
}

FaultSpec parsed(const std::string &text) {
  auto spec = FaultSpec::parse(text);
  REQUIRE(spec);
  return *spec;
}

}  // namespace

TEST_CASE("FaultSpec::parse reads every key and size unit", "[fault_spec]") {
  CHECK(parsed("nth=3").nth == 3);
  const FaultSpec staging = parsed("nth=2,category=staging");
  CHECK(staging.nth == 2);
  CHECK(staging.category == MemoryCategory::staging);
  CHECK(parsed("category=argument_buffer").category == MemoryCategory::argument_buffer);
  CHECK(parsed("min_bytes=64MiB").min_bytes == 64_MiB);
  CHECK(parsed("min_bytes=3GiB").min_bytes == 3_GiB);
  CHECK(parsed("min_bytes=2KiB").min_bytes == 2_KiB);
  CHECK(parsed("min_bytes=17B").min_bytes == 17);
  CHECK(parsed("min_bytes=17").min_bytes == 17);
  const FaultSpec p = parsed("p=0.25,seed=7");
  CHECK(p.probability == 0.25);
  CHECK(p.seed == 7);
  CHECK(parsed("p=1").probability == 1.0);
  CHECK(parsed("kind=oom,nth=1").nth == 1);
  // The canonical text parses back to the same spec.
  const FaultSpec round = parsed(parsed("min_bytes=1MiB,category=ndarray,p=0.5,seed=9").to_text());
  CHECK(round.min_bytes == 1_MiB);
  CHECK(round.category == MemoryCategory::ndarray);
  CHECK(round.probability == 0.5);
  CHECK(round.seed == 9);
}

TEST_CASE("a malformed FaultSpec is invalid_usage naming the offending term and the grammar",
          "[fault_spec]") {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"", "is empty"},
      {"nth=1,", "term ''"},
      {"nth", "term 'nth' is not key=value"},
      {"when=3", "term 'when=3' has an unknown key"},
      {"nth=1,nth=2", "term 'nth=2' repeats its key"},
      {"nth=x", "term 'nth=x' needs a whole number"},
      {"nth=0", "term 'nth=0' needs a whole number >= 1"},
      {"nth=-1", "term 'nth=-1'"},
      {"min_bytes=64MB", "term 'min_bytes=64MB' needs a whole number with unit"},
      {"min_bytes=99999999999999GiB", "term 'min_bytes=99999999999999GiB'"},
      {"p=1.5", "term 'p=1.5' needs a number from 0 to 1"},
      {"p=-0.1", "term 'p=-0.1'"},
      {"p=nan", "term 'p=nan'"},
      {"seed=7", "term 'seed' is given without p"},
      {"nth=2,p=0.5", "term 'p' cannot be combined with nth"},
      {"category=gpu", "term 'category=gpu' names no memory category"},
      {"category=pool_cache", "term 'category=pool_cache' names no memory category"},
      {"kind=boom", "term 'kind=boom' names no failure kind"},
  };
  for (const auto &[text, expected] : cases) {
    INFO("spec: '" << text << "'");
    const std::string detail = parse_error(text);
    CHECK_THAT(detail, Catch::Contains(expected));
    CHECK_THAT(detail, Catch::Contains("grammar: comma-separated key=value terms"));
  }
}

TEST_CASE("the launch kinds refuse the allocation filters, naming the term", "[fault_spec]") {
  for (const std::string text : {"kind=launch,category=ndarray", "kind=heap,min_bytes=1KiB"}) {
    INFO("spec: '" << text << "'");
    CHECK_THAT(parse_error(text), Catch::Contains("filters allocation requests"));
  }
}

TEST_CASE("an armed nth spec fails the nth request from arming, once", "[fault_spec][fault]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(100_MiB));
  memory->fault_plan().arm(parsed("nth=3"));
  CHECK(memory->fault_plan().armed());
  CHECK(refused_indices(*memory, 6) == std::vector<int>{3});
  memory->fault_plan().clear();
  CHECK_FALSE(memory->fault_plan().armed());
}

TEST_CASE("nth of a category counts only that category; the others pass", "[fault_spec][fault]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(100_MiB));
  memory->fault_plan().arm(parsed("nth=2,category=staging"));
  CHECK(refused_indices(*memory, 5, MemoryCategory::ndarray).empty());
  CHECK(refused_indices(*memory, 3, MemoryCategory::argument_buffer).empty());
  CHECK(refused_indices(*memory, 3, MemoryCategory::staging) == std::vector<int>{2});
  CHECK(refused_indices(*memory, 3, MemoryCategory::staging).empty());  // once
}

TEST_CASE("min_bytes fails every request of at least that size", "[fault_spec][fault]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(100_MiB));
  memory->fault_plan().arm(parsed("min_bytes=1MiB"));
  CHECK(refused_indices(*memory, 3, MemoryCategory::ndarray, 1_MiB - 1).empty());
  CHECK(refused_indices(*memory, 3, MemoryCategory::ndarray, 1_MiB) == std::vector<int>{1, 2, 3});
  CHECK(refused_indices(*memory, 2, MemoryCategory::staging, 4_MiB) == std::vector<int>{1, 2});
}

TEST_CASE("a seeded probability spec is reproducible; p=0 never fails and p=1 always does",
          "[fault_spec][fault]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(100_MiB));
  const auto run = [&](const std::string &text) {
    memory->fault_plan().arm(parsed(text));
    return refused_indices(*memory, 200);
  };
  const std::vector<int> first = run("p=0.25,seed=7");
  CHECK(run("p=0.25,seed=7") == first);  // re-arming restarts the same draws
  CHECK(run("p=0.25,seed=8") != first);
  // About a quarter of 200 (a binomial's mean 50, sd ~6): the draws are not stuck.
  CHECK(first.size() > 20);
  CHECK(first.size() < 80);
  CHECK(run("p=0,seed=7").empty());
  CHECK(run("p=1").size() == 200);
}

TEST_CASE("a faulted request leaves nothing held: the ledger is back at its baseline",
          "[fault_spec][fault]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  const uint64_t baseline = memory->in_use_bytes();
  const uint64_t device_baseline = mock.live_allocation_bytes();
  memory->fault_plan().arm(parsed("nth=2,category=argument_buffer"));
  const std::vector<AllocRequest> group = {{MemoryCategory::ndarray, 1_MiB},
                                           {MemoryCategory::argument_buffer, 4_KiB},
                                           {MemoryCategory::argument_buffer, 4_KiB}};
  auto refused = memory->allocate_group(group);  // the group's second argument buffer faults
  REQUIRE_FALSE(refused);
  CHECK(refused.error().requested_bytes == 4_KiB);
  CHECK(refused.error().category == MemoryCategory::argument_buffer);
  CHECK(memory->in_use_bytes() == baseline);
  CHECK(mock.live_allocation_bytes() == device_baseline);
  memory->fault_plan().clear();
}

TEST_CASE("arming a spec replaces the count plan, a count setter replaces the spec, and "
          "restore() brings back a saved setting",
          "[fault_spec][fault]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(100_MiB));
  auto &plan = memory->fault_plan();
  plan.fail_nth_allocation(1);
  plan.arm(parsed("nth=2"));
  CHECK(refused_indices(*memory, 3) == std::vector<int>{2});  // not the 1st: replaced
  const uint64_t count = plan.allocation_count();
  CHECK(count == 3);  // arm did not reset the count

  plan.arm(parsed("nth=3"));
  CHECK(refused_indices(*memory, 1).empty());  // the spec has seen 1 of its 3
  const auto saved = plan.setting();
  plan.fail_at_count(plan.allocation_count() + 1);  // a count plan replaces the spec
  CHECK(refused_indices(*memory, 3) == std::vector<int>{1});
  plan.restore(saved);  // the spec again, going on from the 1 it had seen
  CHECK(refused_indices(*memory, 3) == std::vector<int>{2});
  plan.clear();
  CHECK_FALSE(plan.armed());
  CHECK(refused_indices(*memory, 3).empty());
}
