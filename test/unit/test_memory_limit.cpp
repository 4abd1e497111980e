// How DeviceMemory's limit is set: BudgetConfig::limit_bytes, KILN_POOL_LIMIT_MB (in MiB; a bad or
// too large value is invalid_usage), or total - default_reserve_bytes(total) without either.
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

namespace {

// Sets (or unsets) KILN_POOL_LIMIT_MB for one scope and restores what was there before.
class ScopedPoolLimitEnv {
 public:
  explicit ScopedPoolLimitEnv(const char *value) {
    if (const char *old = std::getenv(kName)) old_ = old;
    if (value != nullptr)
      ::setenv(kName, value, 1);
    else
      ::unsetenv(kName);
  }
  ~ScopedPoolLimitEnv() {
    if (old_)
      ::setenv(kName, old_->c_str(), 1);
    else
      ::unsetenv(kName);
  }
  ScopedPoolLimitEnv(const ScopedPoolLimitEnv &) = delete;
  ScopedPoolLimitEnv &operator=(const ScopedPoolLimitEnv &) = delete;

 private:
  static constexpr const char *kName = "KILN_POOL_LIMIT_MB";
  std::optional<std::string> old_;
};

}  // namespace

TEST_CASE("BudgetConfig::limit_bytes sets a fixed limit that refuses before the driver",
          "[device_memory]") {
  ScopedPoolLimitEnv env("32");  // the explicit config wins over the environment
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock, fixed_limit(10_MiB));
  CHECK(memory->limit_bytes() == 10_MiB);

  auto a = memory->allocate(MemoryCategory::ndarray, 8_MiB);
  REQUIRE(a);
  const uint64_t driver_calls = mock.driver_allocation_count();
  auto refused = memory->allocate(MemoryCategory::ndarray, 4_MiB);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().result == RhiResult::out_of_memory);
  CHECK(refused.error().oom_source == OomSource::budget);
  CHECK(refused.error().requested_bytes == 4_MiB);
  CHECK(refused.error().device == "mock");
  REQUIRE(refused.error().has_memory);
  CHECK(refused.error().memory.limit_bytes == 10_MiB);
  CHECK(refused.error().memory.total_bytes == 1_GiB);
  CHECK(mock.driver_allocation_count() == driver_calls);  // the driver was never asked
  CHECK(memory->in_use_bytes() == 8_MiB);
  CHECK(memory->stats().ledger.refusals == 1);
  REQUIRE(memory->free(*a));
}

TEST_CASE("KILN_POOL_LIMIT_MB sets the limit in MiB", "[device_memory][env]") {
  ScopedPoolLimitEnv env("32");
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_uncached_memory(mock);
  CHECK(memory->limit_bytes() == 32_MiB);
  auto over = memory->allocate(MemoryCategory::ndarray, 33_MiB);
  REQUIRE_FALSE(over);
  CHECK(over.error().oom_source == OomSource::budget);

  auto from_env = kiln::runtime::pool_limit_from_env();
  REQUIRE(from_env);
  CHECK(*from_env == std::optional<uint64_t>(32_MiB));
}

TEST_CASE("a bad KILN_POOL_LIMIT_MB is invalid_usage", "[device_memory][env]") {
  const char *bad = GENERATE("abc", "-1", "12x", "1.5", " 8", "99999999999999999999");
  CAPTURE(bad);
  ScopedPoolLimitEnv env(bad);
  MockDevice mock(mock_options(1_GiB));
  auto memory = DeviceMemory::create(mock);
  REQUIRE_FALSE(memory);
  CHECK(memory.error().result == RhiResult::invalid_usage);
  auto parsed = kiln::runtime::pool_limit_from_env();
  REQUIRE_FALSE(parsed);
  CHECK(parsed.error().result == RhiResult::invalid_usage);
  // A whole number too large is said to be too large, not "not a whole number".
  const bool too_large = std::string_view(bad) == "99999999999999999999";
  CHECK((parsed.error().detail.find("too large") != std::string::npos) == too_large);
  CHECK((parsed.error().detail.find("not a whole number") != std::string::npos) == !too_large);
}

TEST_CASE("KILN_POOL_LIMIT_MB beyond 2**64 bytes is too large", "[device_memory][env]") {
  ScopedPoolLimitEnv env("17592186044416");  // 2**44 MiB
  auto parsed = kiln::runtime::pool_limit_from_env();
  REQUIRE_FALSE(parsed);
  CHECK_THAT(parsed.error().detail, Catch::Contains("too large: at most 17592186044415 MiB"));
}

TEST_CASE("without a limit the budget is total - default_reserve_bytes(total)",
          "[device_memory][env]") {
  ScopedPoolLimitEnv env(nullptr);
  // The floor applies on small devices, 5 % on large ones.
  CHECK(kiln::runtime::default_reserve_bytes(1_GiB) == 64_MiB);
  CHECK(kiln::runtime::default_reserve_bytes(4_GiB) == 4_GiB / 20);
  CHECK(kiln::runtime::default_reserve_bytes(80_GiB) == 4_GiB);

  const uint64_t capacity = GENERATE(1_GiB, 4_GiB, 80_GiB);
  CAPTURE(capacity);
  MockDevice mock(mock_options(capacity));
  auto memory = make_uncached_memory(mock);
  const uint64_t reserve = kiln::runtime::default_reserve_bytes(capacity);
  CHECK(memory->limit_bytes() == capacity - reserve);
  CHECK(memory->stats().reserve_bytes == reserve);

  SECTION("an explicit reserve replaces the default") {
    MockDevice other(mock_options(capacity));
    BudgetConfig config = no_cache();
    config.reserve_bytes = 1_MiB;
    auto m = make_uncached_memory(other, config);
    CHECK(m->limit_bytes() == capacity - 1_MiB);
  }
}
