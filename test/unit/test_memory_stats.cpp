// DeviceMemory's summary and stats: every category and the limit named, allocations, frees and hits
// counted, and a line with the refusals by the limit and by live free memory.
#include <catch2/catch.hpp>

#include <string>
#include <string_view>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

TEST_CASE("summary names every category and the limit, stats count allocations, frees and hits",
          "[caching_pool]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(24_MiB));
  auto a = memory->allocate(MemoryCategory::ndarray, 1_MiB);  // miss
  REQUIRE(a);
  REQUIRE(memory->free(*a));
  auto b = memory->allocate(MemoryCategory::staging, 1_MiB);  // hit
  auto c = memory->allocate(MemoryCategory::argument_buffer, 3_MiB);  // miss
  REQUIRE(b);
  REQUIRE(c);
  REQUIRE(memory->free(*c));

  const auto s = memory->stats();
  CHECK(s.allocations == 3);
  CHECK(s.frees == 2);
  CHECK(s.cache_hits == 1);
  CHECK(s.cached_blocks == 1);
  CHECK(s.cached_bytes == 3_MiB);
  CHECK(s.ledger.limit_bytes == 24_MiB);
  CHECK(s.ledger.peak_bytes[static_cast<std::size_t>(MemoryCategory::argument_buffer)] == 3_MiB);

  const std::string text = memory->summary();
  CAPTURE(text);
  CHECK(text.find(kiln::format_bytes(24_MiB)) != std::string::npos);
  CHECK(text.find("mock") != std::string::npos);
  for (std::size_t i = 0; i < kiln::kNumMemoryCategories; ++i) {
    const std::string_view name = kiln::to_string(static_cast<MemoryCategory>(i));
    CAPTURE(name);
    CHECK(text.find(name) != std::string::npos);
  }
  REQUIRE(memory->free(*b));
}

TEST_CASE("the summary has a line with the refusals by the limit and by live free memory",
          "[device_memory][live]") {
  MockDevice mock(mock_options(1_GiB, {0, 924_MiB}));
  auto memory = make_uncached_memory(mock, fixed_limit(16_MiB, /*reserve_bytes=*/40_MiB));
  for (int i = 0; i < 3; ++i) CHECK_FALSE(memory->allocate(MemoryCategory::ndarray, 32_MiB));
  memory->set_limit_bytes(1_GiB);
  for (int i = 0; i < 2; ++i) CHECK_FALSE(memory->allocate(MemoryCategory::ndarray, 80_MiB));
  const auto stats = memory->stats();
  REQUIRE(stats.ledger.refusals == 3);
  REQUIRE(stats.live_refusals == 2);
  const std::string text = memory->summary();
  CAPTURE(text);
  std::string line;
  for (std::size_t start = 0, end; start < text.size(); start = end + 1) {
    end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    if (text.substr(start, end - start).find("refus") != std::string::npos)
      line = text.substr(start, end - start);
  }
  REQUIRE_FALSE(line.empty());
  CHECK(line.find('3') != std::string::npos);
  CHECK(line.find('2') != std::string::npos);
}
