// DeviceMemory over a MockDevice: how the limit is set (config, KILN_POOL_LIMIT_MB, total -
// reserve), that every allocation is charged and every free released, that groups are
// all-or-nothing, and that growth checks the device's live free memory so other processes'
// growth is refused by kiln before the driver is asked.
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/device_memory.h"

using kiln::DeviceAllocation;
using kiln::MemoryCategory;
using kiln::MockDevice;
using kiln::MockDeviceOptions;
using kiln::OomSource;
using kiln::RhiResult;
using kiln::runtime::AllocRequest;
using kiln::runtime::BudgetConfig;
using kiln::runtime::DeviceMemory;

namespace {

constexpr uint64_t operator""_MiB(unsigned long long n) { return n << 20; }
constexpr uint64_t operator""_GiB(unsigned long long n) { return n << 30; }

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

MockDeviceOptions mock_options(uint64_t capacity_bytes, std::vector<uint64_t> script = {}) {
  MockDeviceOptions options;
  options.capacity_bytes = capacity_bytes;
  options.other_process_bytes_script = std::move(script);
  return options;
}

// These tests are about the budget, the ledger and the live check, so the caching pool is off
// unless a test turns it on (test_caching_pool.cpp covers the pool).
BudgetConfig no_cache() {
  BudgetConfig config;
  config.caching = false;
  return config;
}

std::unique_ptr<DeviceMemory> make_memory(MockDevice &mock, BudgetConfig config = no_cache()) {
  auto memory = DeviceMemory::create(mock, config);
  REQUIRE(memory);
  return std::move(*memory);
}

BudgetConfig fixed_limit(uint64_t limit_bytes) {
  BudgetConfig config = no_cache();
  config.limit_bytes = limit_bytes;
  return config;
}

uint64_t charged(DeviceMemory &memory, MemoryCategory category) {
  return memory.in_use_by_category()[static_cast<std::size_t>(category)];
}

}  // namespace

TEST_CASE("BudgetConfig::limit_bytes sets a fixed limit that refuses before the driver",
          "[device_memory]") {
  ScopedPoolLimitEnv env("32");  // the explicit config wins over the environment
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, fixed_limit(10_MiB));
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
  auto memory = make_memory(mock);
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
  auto memory = make_memory(mock);
  const uint64_t reserve = kiln::runtime::default_reserve_bytes(capacity);
  CHECK(memory->limit_bytes() == capacity - reserve);
  CHECK(memory->stats().reserve_bytes == reserve);

  SECTION("an explicit reserve replaces the default") {
    MockDevice other(mock_options(capacity));
    BudgetConfig config = no_cache();
    config.reserve_bytes = 1_MiB;
    auto m = make_memory(other, config);
    CHECK(m->limit_bytes() == capacity - 1_MiB);
  }
}

TEST_CASE("allocate charges its category and free releases it", "[device_memory]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, fixed_limit(100_MiB));
  auto a = memory->allocate(MemoryCategory::staging, 3_MiB);
  auto b = memory->allocate(MemoryCategory::argument_buffer, 1_MiB, /*zero_fill=*/true);
  REQUIRE(a);
  REQUIRE(b);
  CHECK(charged(*memory, MemoryCategory::staging) == 3_MiB);
  CHECK(charged(*memory, MemoryCategory::argument_buffer) == 1_MiB);
  CHECK(memory->in_use_bytes() == 4_MiB);
  CHECK(mock.held_bytes() == 4_MiB);
  CHECK(memory->stats().allocations == 2);

  REQUIRE(memory->free(*a));
  CHECK(charged(*memory, MemoryCategory::staging) == 0);
  CHECK(memory->in_use_bytes() == 1_MiB);
  CHECK(mock.held_bytes() == 1_MiB);
  REQUIRE(memory->free(*b));
  CHECK(memory->in_use_bytes() == 0);
  CHECK(mock.held_bytes() == 0);
  CHECK(mock.live_allocation_count() == 0);
  CHECK(memory->stats().frees == 2);
  CHECK(memory->stats().ledger.peak_total_bytes == 4_MiB);
}

TEST_CASE("allocating 0 bytes through DeviceMemory is invalid_usage and charges nothing",
          "[device_memory]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, fixed_limit(100_MiB));
  const uint64_t queries_before = mock.memory_info_count();
  auto zero = memory->allocate(MemoryCategory::ndarray, 0);
  REQUIRE_FALSE(zero);
  CHECK(zero.error().result == RhiResult::invalid_usage);
  CHECK(memory->in_use_bytes() == 0);
  CHECK(mock.driver_allocation_count() == 0);
  CHECK(mock.memory_info_count() == queries_before);  // refused before any live check
}

TEST_CASE("double free through DeviceMemory is invalid_usage and releases nothing twice",
          "[device_memory]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, fixed_limit(100_MiB));
  auto keep = memory->allocate(MemoryCategory::ndarray, 2_MiB);
  auto a = memory->allocate(MemoryCategory::ndarray, 2_MiB);
  REQUIRE(keep);
  REQUIRE(a);
  REQUIRE(memory->free(*a));
  auto again = memory->free(*a);
  REQUIRE_FALSE(again);
  CHECK(again.error().result == RhiResult::invalid_usage);
  CHECK(again.error().device == "mock");
  CHECK(charged(*memory, MemoryCategory::ndarray) == 2_MiB);
  CHECK(mock.held_bytes() == 2_MiB);

  // An allocation made on the device directly (not through DeviceMemory) is not freed here.
  kiln::LlvmRuntimeAllocParams params;
  params.size_bytes = 1_MiB;
  auto raw = mock.allocate_runtime(params);
  REQUIRE(raw);
  auto foreign = memory->free(*raw);
  REQUIRE_FALSE(foreign);
  CHECK(foreign.error().result == RhiResult::invalid_usage);
  CHECK(mock.live_allocation_count() == 2);
  CHECK(memory->in_use_bytes() == 2_MiB);
  REQUIRE(mock.dealloc_memory(*raw));
  REQUIRE(memory->free(*keep));
}

TEST_CASE("allocate_group is all-or-nothing when a member fails at the driver",
          "[device_memory]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, fixed_limit(100_MiB));
  auto existing = memory->allocate(MemoryCategory::ndarray, 5_MiB);
  REQUIRE(existing);
  const auto ledger_before = memory->in_use_by_category();
  const uint64_t held_before = mock.held_bytes();
  const uint64_t live_before = mock.live_allocation_count();

  const std::array<AllocRequest, 3> group{{{MemoryCategory::staging, 2_MiB},
                                           {MemoryCategory::argument_buffer, 1_MiB},
                                           {MemoryCategory::result_buffer, 1_MiB}}};
  mock.fault_plan().fail_nth_allocation(2);
  auto failed = memory->allocate_group(group);
  REQUIRE_FALSE(failed);
  CHECK(failed.error().result == RhiResult::out_of_memory);
  CHECK(failed.error().oom_source == OomSource::driver);
  CHECK(failed.error().category == MemoryCategory::argument_buffer);
  CHECK(failed.error().device == "mock");
  CHECK(failed.error().has_memory);
  CHECK(mock.fault_plan().allocation_count() == 2);  // the third member was never tried

  CHECK(memory->in_use_by_category() == ledger_before);
  CHECK(mock.held_bytes() == held_before);
  CHECK(mock.live_allocation_count() == live_before);
  CHECK(memory->stats().driver_ooms == 1);

  SECTION("the same group succeeds once the fault is gone and is freed member by member") {
    mock.fault_plan().clear();
    auto ok = memory->allocate_group(group);
    REQUIRE(ok);
    REQUIRE(ok->size() == 3);
    CHECK(charged(*memory, MemoryCategory::staging) == 2_MiB);
    CHECK(charged(*memory, MemoryCategory::argument_buffer) == 1_MiB);
    CHECK(charged(*memory, MemoryCategory::result_buffer) == 1_MiB);
    for (DeviceAllocation a : *ok) REQUIRE(memory->free(a));
    CHECK(memory->in_use_by_category() == ledger_before);
  }
  SECTION("a group over the budget is refused before any member is allocated") {
    const uint64_t calls = mock.driver_allocation_count();
    const std::array<AllocRequest, 2> big{{{MemoryCategory::staging, 50_MiB},
                                           {MemoryCategory::ndarray, 50_MiB}}};
    auto refused = memory->allocate_group(big);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().oom_source == OomSource::budget);
    CHECK(refused.error().requested_bytes == 100_MiB);
    CHECK(mock.driver_allocation_count() == calls);
    CHECK(memory->in_use_by_category() == ledger_before);
  }
  REQUIRE(memory->free(*existing));
}

TEST_CASE("live check: growth that no longer fits in free - reserve is refused by the budget",
          "[device_memory][live]") {
  constexpr uint64_t kSize = 128_MiB;
  constexpr uint64_t kReserve = 64_MiB;
  struct Step {
    uint64_t other_bytes;  // what other processes use when this allocation asks
    bool fits;
  };
  // held grows by 128 MiB per success; free = 1 GiB - held - other.
  const std::array<Step, 6> steps{{
      {0, true},          // free 1024 MiB
      {256_MiB, true},    // free 640 MiB
      {512_MiB, true},    // free 256 MiB
      {450_MiB, false},   // free 190 MiB: the driver would accept, the reserve would not be kept
      {768_MiB, false},   // free 0 (other processes outgrew us)
      {0, true},          // they went away again
  }};
  std::vector<uint64_t> script{0};  // consumed by create()
  for (const Step &s : steps) script.push_back(s.other_bytes);
  MockDevice mock(mock_options(1_GiB, script));
  BudgetConfig config = no_cache();
  config.limit_bytes = 1_GiB;  // the ledger alone would allow every step
  config.reserve_bytes = kReserve;
  auto memory = make_memory(mock, config);

  std::vector<DeviceAllocation> held;
  uint64_t refusals = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    CAPTURE(i, steps[i].other_bytes);
    const uint64_t ledger_before = memory->in_use_bytes();
    auto a = memory->allocate(MemoryCategory::ndarray, kSize);
    if (steps[i].fits) {
      REQUIRE(a);
      held.push_back(*a);
      continue;
    }
    REQUIRE_FALSE(a);
    ++refusals;
    const kiln::Failure &f = a.error();
    CHECK(f.result == RhiResult::out_of_memory);
    CHECK(f.oom_source == OomSource::budget);
    CHECK(f.requested_bytes == kSize);
    CHECK(f.device == "mock");
    CHECK(std::string_view(f.site) == "DeviceMemory::check_live_free");
    REQUIRE(f.has_memory);
    CHECK(f.memory.total_bytes == 1_GiB);
    CHECK(f.memory.free_bytes ==
          (1_GiB > held.size() * kSize + steps[i].other_bytes
               ? 1_GiB - held.size() * kSize - steps[i].other_bytes
               : 0));
    // The ledger still had room: only the live check could have refused.
    CHECK(ledger_before + kSize <= memory->limit_bytes());
    CHECK(memory->in_use_bytes() == ledger_before);
    CHECK(f.message().find(kiln::format_bytes(kSize)) != std::string::npos);
  }
  CHECK(refusals == 2);
  CHECK(held.size() == 4);
  CHECK(mock.driver_oom_count() == 0);
  CHECK(memory->stats().live_refusals == 2);
  CHECK(memory->stats().live_checks == steps.size());
  CHECK(mock.held_bytes() == 4 * kSize);
  for (DeviceAllocation a : held) REQUIRE(memory->free(a));
}

TEST_CASE("with live_check off the same growth reaches the driver and the driver refuses it",
          "[device_memory][live]") {
  constexpr uint64_t kSize = 128_MiB;
  MockDevice mock(mock_options(1_GiB));
  BudgetConfig config = no_cache();
  config.limit_bytes = 1_GiB;
  config.reserve_bytes = 64_MiB;
  config.live_check = false;
  auto memory = make_memory(mock, config);

  std::vector<DeviceAllocation> held;
  for (int i = 0; i < 3; ++i) {
    auto a = memory->allocate(MemoryCategory::ndarray, kSize);
    REQUIRE(a);
    held.push_back(*a);
  }
  mock.set_other_process_bytes(768_MiB);  // free is now 0
  const uint64_t calls = mock.driver_allocation_count();
  auto refused = memory->allocate(MemoryCategory::ndarray, kSize);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().result == RhiResult::out_of_memory);
  CHECK(refused.error().oom_source == OomSource::driver);
  CHECK(refused.error().driver_status == std::string_view("MOCK_ERROR_OUT_OF_MEMORY"));
  CHECK(mock.driver_allocation_count() == calls + 1);
  CHECK(mock.driver_oom_count() == 1);
  CHECK(memory->stats().driver_ooms == 1);
  CHECK(memory->stats().live_checks == 0);
  CHECK(memory->in_use_bytes() == 3 * kSize);  // the reservation was given back
  for (DeviceAllocation a : held) REQUIRE(memory->free(a));
  CHECK(memory->in_use_bytes() == 0);
}

TEST_CASE("an out-of-memory message names the requested bytes and the budget",
          "[device_memory]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, fixed_limit(10_MiB));
  auto a = memory->allocate(MemoryCategory::ndarray, 7_MiB);
  REQUIRE(a);
  auto refused = memory->allocate(MemoryCategory::staging, 5_MiB);
  REQUIRE_FALSE(refused);
  const std::string message = refused.error().message();
  CAPTURE(message);
  CHECK(message.find(kiln::format_bytes(5_MiB)) != std::string::npos);
  CHECK(message.find("budget " + kiln::format_bytes(10_MiB)) != std::string::npos);
  CHECK(message.find(kiln::format_bytes(3_MiB) + " left") != std::string::npos);
  CHECK(message.find("mock") != std::string::npos);
  // The memory layer names no knob: the interface layer's advice does (test_refusal_messages).
  CHECK(message.find("KILN_POOL_LIMIT_MB") == std::string::npos);
  REQUIRE(memory->free(*a));
}

TEST_CASE("charge and uncharge account bytes outside device allocations", "[device_memory]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, fixed_limit(10_MiB));
  REQUIRE(memory->charge(MemoryCategory::code_object, 6_MiB));
  CHECK(charged(*memory, MemoryCategory::code_object) == 6_MiB);
  CHECK(mock.held_bytes() == 0);  // nothing was allocated on the device

  // The charge takes room from allocations.
  auto refused = memory->allocate(MemoryCategory::ndarray, 5_MiB);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().oom_source == OomSource::budget);
  auto over = memory->charge(MemoryCategory::code_object, 5_MiB);
  REQUIRE_FALSE(over);
  CHECK(over.error().result == RhiResult::out_of_memory);
  CHECK(over.error().oom_source == OomSource::budget);
  CHECK(over.error().device == "mock");
  CHECK(charged(*memory, MemoryCategory::code_object) == 6_MiB);

  memory->uncharge(MemoryCategory::code_object, 6_MiB);
  CHECK(memory->in_use_bytes() == 0);
  auto fits = memory->allocate(MemoryCategory::ndarray, 5_MiB);
  REQUIRE(fits);
  REQUIRE(memory->free(*fits));
}

// A refusal's memory picture is taken after the refused request's reservation is given back.
TEST_CASE("a live refusal's memory picture does not count the refused request as held",
          "[device_memory][live]") {
  MockDevice mock(mock_options(1_GiB, {0, 900_MiB}));
  BudgetConfig config = no_cache();
  config.limit_bytes = 1_GiB;
  config.reserve_bytes = 64_MiB;
  auto memory = make_memory(mock, config);
  auto refused = memory->allocate(MemoryCategory::ndarray, 128_MiB);
  REQUIRE_FALSE(refused);
  REQUIRE(refused.error().oom_source == OomSource::budget);
  CAPTURE(refused.error().message());
  CHECK(memory->in_use_bytes() == 0);
  CHECK(refused.error().memory.in_use_total_bytes() == 0);
}

TEST_CASE("a driver refusal's memory picture does not count the refused request as held",
          "[device_memory]") {
  MockDevice mock(mock_options(1_GiB));
  BudgetConfig config = no_cache();
  config.limit_bytes = 1_GiB;
  config.live_check = false;
  auto memory = make_memory(mock, config);
  auto held = memory->allocate(MemoryCategory::ndarray, 256_MiB);
  REQUIRE(held);
  mock.set_other_process_bytes(768_MiB);
  auto refused = memory->allocate(MemoryCategory::staging, 128_MiB);
  REQUIRE_FALSE(refused);
  REQUIRE(refused.error().oom_source == OomSource::driver);
  CAPTURE(refused.error().message());
  CHECK(refused.error().memory.in_use_total_bytes() == 256_MiB);
  CHECK(refused.error().memory.in_use_bytes[static_cast<std::size_t>(MemoryCategory::staging)] ==
        0);
  REQUIRE(memory->free(*held));
}

// A budget refusal is the ledger's verdict; the device's free/total only complete its picture.
// They come from a reading at most one kernel tick old (DeviceMemory::kLiveReadingReuse), so
// refusing in a loop does not ask the device each time; anything older is read again.
TEST_CASE("budget refusals reuse a live reading of this tick and read again once it is older",
          "[device_memory][live]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, fixed_limit(10_MiB));
  const uint64_t queries_before = mock.memory_info_count();
  const uint64_t refusals_before = memory->stats().ledger.refusals;
  constexpr int kRefusals = 200;
  uint64_t fresh = 0;  // refusals whose reading was taken for them (age 0)
  for (int i = 0; i < kRefusals; ++i) {
    auto refused = memory->allocate(MemoryCategory::ndarray, 20_MiB);
    REQUIRE_FALSE(refused);
    REQUIRE(refused.error().oom_source == OomSource::budget);
    REQUIRE(refused.error().has_memory);
    // A reused reading says how old it may be: at least 1 ms, at most a tick (<= 10 ms).
    fresh += refused.error().memory.live_age_ms == 0;
    CHECK(refused.error().memory.live_age_ms <= 10);
    CHECK(refused.error().memory.total_bytes == 1_GiB);
    CHECK(refused.error().memory.free_bytes == 1_GiB);
    CHECK(refused.error().memory.limit_bytes == 10_MiB);
    CHECK(refused.error().device == "mock");
  }
  CHECK(memory->stats().ledger.refusals == refusals_before + kRefusals);
  // A few ticks may pass during the loop; every refusal asking would make it kRefusals.
  CHECK(mock.memory_info_count() - queries_before < 10);
  CHECK(fresh == mock.memory_info_count() - queries_before);

  // Other processes grow; once the reading is older than the reuse window the next refusal sees it.
  mock.set_other_process_bytes(512_MiB);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // past any kernel tick (HZ >= 100)
  auto refused = memory->allocate(MemoryCategory::ndarray, 20_MiB);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().memory.free_bytes == 512_MiB);
  CHECK(refused.error().memory.live_age_ms == 0);
}

TEST_CASE("a driver refusal reads the device now, not a budget refusal's reading",
          "[device_memory][live]") {
  MockDevice mock(mock_options(1_GiB));
  BudgetConfig config = fixed_limit(1_GiB);
  config.live_check = false;
  auto memory = make_memory(mock, config);
  REQUIRE_FALSE(memory->allocate(MemoryCategory::ndarray, 2_GiB));  // a reading: 1 GiB free
  mock.set_other_process_bytes(960_MiB);
  auto refused = memory->allocate(MemoryCategory::ndarray, 128_MiB);
  REQUIRE_FALSE(refused);
  REQUIRE(refused.error().oom_source == OomSource::driver);
  CHECK(refused.error().memory.free_bytes == 64_MiB);
  CHECK(refused.error().memory.live_age_ms == 0);
}

// When the device cannot say how much memory it has free, a refusal still names what kiln
// knows (limit, bytes held per category), and the live check refuses growth it cannot check.
TEST_CASE("a failing device query: the budget refusal keeps its picture, growth is refused",
          "[device_memory][live]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, fixed_limit(10_MiB));
  auto held = memory->allocate(MemoryCategory::ndarray, 4_MiB);
  REQUIRE(held);
  mock.fail_memory_info(true);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // no reading of this tick left

  auto refused = memory->allocate(MemoryCategory::ndarray, 20_MiB);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().oom_source == OomSource::budget);
  CHECK(refused.error().has_memory);
  CHECK(refused.error().memory.total_bytes == 0);  // unknown, not made up
  CHECK(refused.error().memory.limit_bytes == 10_MiB);
  CHECK(refused.error().memory.in_use_total_bytes() == 4_MiB);
  CHECK_THAT(refused.error().message(), Catch::Contains("budget"));

  auto grow = memory->allocate(MemoryCategory::ndarray, 2_MiB);  // fits the budget: asks
  REQUIRE_FALSE(grow);
  CHECK(grow.error().result == RhiResult::error);
  CHECK(std::string(grow.error().driver_status) == "MOCK_ERROR_UNKNOWN");
  CHECK(memory->in_use_bytes() == 4_MiB);  // nothing held for it

  mock.fail_memory_info(false);
  auto fine = memory->allocate(MemoryCategory::ndarray, 2_MiB);
  REQUIRE(fine);
  REQUIRE(memory->free(*fine));
  REQUIRE(memory->free(*held));
  CHECK(memory->in_use_bytes() == 0);
  CHECK(mock.held_bytes() == 0);
}

TEST_CASE("fail_at_count arms a count without resetting it, so nested plans count on",
          "[device_memory][fault]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, fixed_limit(100_MiB));
  memory->fault_plan().fail_nth_allocation(3);  // the outer plan: its 3rd request fails
  auto first = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  REQUIRE(first);
  memory->fault_plan().fail_at_count(memory->fault_plan().allocation_count() + 1);  // inner: next
  auto second = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  REQUIRE_FALSE(second);
  CHECK(memory->fault_plan().allocation_count() == 2);  // not reset by the inner plan
  memory->fault_plan().fail_at_count(3);                // the outer plan again
  auto third = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  REQUIRE_FALSE(third);
  CHECK(memory->fault_plan().allocation_count() == 3);
  auto fourth = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  CHECK(fourth);
  memory->fault_plan().clear();
}

namespace {

// Another thread allocates `size_bytes` when the first allocation has passed the budget's
// lock-free check and has not yet taken its lock (MemoryBudget's test hook; runs once).
struct AllocatorInTheGap {
  DeviceMemory *memory = nullptr;
  uint64_t size_bytes = 0;
  std::atomic<bool> fired{false};
  std::optional<DeviceAllocation> taken;

  static void run(void *self) {
    auto &gap = *static_cast<AllocatorInTheGap *>(self);
    if (gap.fired.exchange(true)) return;  // the other thread's own reservation passes through
    std::thread other([&gap] {
      auto alloc = gap.memory->allocate(MemoryCategory::ndarray, gap.size_bytes);
      if (alloc) gap.taken = *alloc;
    });
    other.join();
  }
};

}  // namespace

TEST_CASE("growth that another thread's allocation no longer leaves room for is refused",
          "[device_memory][threads][recheck]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, fixed_limit(10_MiB));
  AllocatorInTheGap gap;
  gap.memory = memory.get();
  gap.size_bytes = 8_MiB;
  memory->budget_for_testing().set_before_lock_hook_for_testing(&AllocatorInTheGap::run, &gap);

  auto first = memory->allocate(MemoryCategory::ndarray, 8_MiB);

  REQUIRE(gap.fired.load());
  REQUIRE(gap.taken.has_value());  // the other thread got in first
  REQUIRE_FALSE(first.has_value());
  CHECK(first.error().result == RhiResult::out_of_memory);
  CHECK(first.error().oom_source == OomSource::budget);
  CHECK(first.error().requested_bytes == 8_MiB);
  CHECK(memory->in_use_bytes() == 8_MiB);  // never past the 10 MiB limit
  CHECK(charged(*memory, MemoryCategory::ndarray) == 8_MiB);
  CHECK(mock.held_bytes() == 8_MiB);  // the driver was asked once
  memory->budget_for_testing().set_before_lock_hook_for_testing(nullptr, nullptr);
  CHECK(memory->free(*gap.taken));
  CHECK(memory->in_use_bytes() == 0);
}

TEST_CASE("a live refusal carries the reserve it keeps and is counted as a live refusal",
          "[device_memory][live]") {
  // 1 GiB device; other processes hold 924 MiB from the first allocation on: 100 MiB free.
  MockDevice mock(mock_options(1_GiB, {0, 924_MiB}));
  BudgetConfig config = no_cache();
  config.limit_bytes = 1_GiB;  // the limit alone would allow it
  config.reserve_bytes = 40_MiB;
  auto memory = make_memory(mock, config);
  auto refused = memory->allocate(MemoryCategory::ndarray, 80_MiB);  // 80 > 100 - 40
  REQUIRE_FALSE(refused);
  const kiln::Failure &f = refused.error();
  CHECK(f.oom_source == OomSource::budget);
  REQUIRE(f.has_memory);
  CHECK(f.memory.reserve_bytes == 40_MiB);
  CHECK(f.memory.free_bytes == 100_MiB);
  CHECK(f.requested_bytes + f.memory.reserve_bytes > f.memory.free_bytes);  // figures agree
  const auto stats = memory->stats();
  CHECK(stats.live_refusals == 1);
  CHECK(stats.ledger.refusals == 0);  // not a refusal by the limit
}

TEST_CASE("the summary has a line with the refusals by the limit and by live free memory",
          "[device_memory][live]") {
  MockDevice mock(mock_options(1_GiB, {0, 924_MiB}));
  BudgetConfig config = no_cache();
  config.limit_bytes = 16_MiB;
  config.reserve_bytes = 40_MiB;
  auto memory = make_memory(mock, config);
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

TEST_CASE("a refusal an OOM observer cures is retried, served and counted as one retry",
          "[device_memory][observer]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, fixed_limit(10_MiB));
  auto first = memory->allocate(MemoryCategory::ndarray, 6_MiB);
  REQUIRE(first);
  std::optional<DeviceAllocation> spare = *first;
  int calls = 0;
  (void)memory->add_oom_observer([&](const kiln::Failure &) {
    ++calls;
    if (spare) {
      REQUIRE(memory->free(*spare));
      spare.reset();
    }
  });

  SECTION("a budget refusal") {
    auto a = memory->allocate(MemoryCategory::ndarray, 8_MiB);  // 6 + 8 > 10, then 8 fits
    REQUIRE(a);
    CHECK(calls == 1);
    CHECK(memory->stats().retries == 1);
    CHECK(memory->stats().ledger.refusals == 0);  // cured: not a refusal
    CHECK(memory->free(*a));
  }
  SECTION("an injected fault") {
    memory->fault_plan().fail_nth_allocation(1);
    auto a = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    REQUIRE(a);
    CHECK(calls == 1);
    CHECK(memory->stats().retries == 1);
    CHECK(memory->free(*a));
  }
  SECTION("an observer that frees nothing: refused, no retry") {
    REQUIRE(memory->free(*spare));
    spare.reset();
    auto held = memory->allocate(MemoryCategory::ndarray, 6_MiB);
    REQUIRE(held);
    CHECK_FALSE(memory->allocate(MemoryCategory::ndarray, 8_MiB));
    CHECK(calls == 1);
    CHECK(memory->stats().retries == 0);
    CHECK(memory->stats().ledger.refusals == 1);
    CHECK(memory->free(*held));
  }
}
