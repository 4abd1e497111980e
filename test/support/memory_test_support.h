// Helpers shared by the memory layer's tests: DeviceMemory over a MockDevice, with the caching
// pool on (cached()) or off (no_cache(), fixed_limit()).
#ifndef KILN_MEMORY_TEST_SUPPORT_H_
#define KILN_MEMORY_TEST_SUPPORT_H_

#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "byte_units.h"
#include "kiln/rhi/mock_device.h"
#include "kiln/runtime/memory/device_memory.h"

namespace kiln::test::memory {

using namespace kiln::test::units;

// The memory tests' vocabulary: `using namespace kiln::test::memory;` brings these names too.
using kiln::DeviceAllocation;
using kiln::Failure;
using kiln::FaultPlan;
using kiln::MemoryCategory;
using kiln::MockDevice;
using kiln::MockDeviceOptions;
using kiln::OomSource;
using kiln::RhiExpected;
using kiln::RhiResult;
using kiln::RhiStatus;
using kiln::runtime::AllocRequest;
using kiln::runtime::BudgetConfig;
using kiln::runtime::CategoryRequest;
using kiln::runtime::DeviceMemory;
using kiln::runtime::MemoryBudget;
using kiln::runtime::MemoryStats;
using kiln::runtime::Reservation;

/// A mock with `capacity_bytes` and, optionally, a script of other processes' usage.
inline MockDeviceOptions mock_options(uint64_t capacity_bytes, std::vector<uint64_t> script = {}) {
  MockDeviceOptions options;
  options.capacity_bytes = capacity_bytes;
  options.other_process_bytes_script = std::move(script);
  return options;
}

/// A fixed limit with caching on (the default, and what these tests are about).
inline runtime::BudgetConfig cached(uint64_t limit_bytes, uint64_t reserve_bytes = 0,
                                    bool live_check = true) {
  runtime::BudgetConfig config;
  config.limit_bytes = limit_bytes;
  config.reserve_bytes = reserve_bytes;
  config.live_check = live_check;
  return config;
}

/// The caching pool off: for tests about the budget, the ledger and the live check (the
/// caching-pool tests use cached()).
inline runtime::BudgetConfig no_cache() {
  runtime::BudgetConfig config;
  config.caching = false;
  return config;
}

/// A fixed limit of `limit_bytes` with the caching pool off, and `reserve_bytes` kept free for
/// other processes (the live check's reserve).
inline runtime::BudgetConfig fixed_limit(uint64_t limit_bytes, uint64_t reserve_bytes = 0) {
  runtime::BudgetConfig config = no_cache();
  config.limit_bytes = limit_bytes;
  config.reserve_bytes = reserve_bytes;
  return config;
}

/// A DeviceMemory over `mock` with caching on (cached()); fails the test if it cannot be made.
inline std::unique_ptr<runtime::DeviceMemory> make_memory(MockDevice &mock,
                                                          runtime::BudgetConfig config) {
  REQUIRE(config.caching);
  auto memory = runtime::DeviceMemory::create(mock, config);
  REQUIRE(memory);
  return std::move(*memory);
}

/// A DeviceMemory over `mock` with the caching pool off (no_cache(), fixed_limit()); fails the
/// test if it cannot be made.
inline std::unique_ptr<runtime::DeviceMemory> make_uncached_memory(MockDevice &mock,
                                                                   runtime::BudgetConfig config = no_cache()) {
  REQUIRE_FALSE(config.caching);
  auto memory = runtime::DeviceMemory::create(mock, config);
  REQUIRE(memory);
  return std::move(*memory);
}

/// Whether this build runs under AddressSanitizer or ThreadSanitizer: thread creation and every
/// memory access are many times slower there (AddressSanitizer also poisons the shadow of every
/// MiB-sized block the mock allocates), so stress tests do fewer rounds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

/// `full` rounds of a stress loop, or a two-hundredth of them under a sanitizer.
inline constexpr int stress_rounds(int full) { return kSanitized ? full / 200 : full; }

/// The bytes `memory` holds in `category` now.
inline uint64_t charged(runtime::DeviceMemory &memory, MemoryCategory category) {
  return memory.in_use_by_category()[static_cast<std::size_t>(category)];
}

/// Tallies one allocation of a stress loop: a block goes to `held` and counts as granted, a budget
/// refusal counts as refused, any other failure as wrong (a stress test expects none). Thread-safe
/// for the counters; `held` is the calling thread's.
inline void tally(const RhiExpected<DeviceAllocation> &a, std::vector<DeviceAllocation> &held,
                  std::atomic<uint64_t> &granted, std::atomic<uint64_t> &refused,
                  std::atomic<uint64_t> &wrong_failures) {
  if (a) {
    granted.fetch_add(1);
    held.push_back(*a);
  } else if (a.error().result == RhiResult::out_of_memory &&
             a.error().oom_source == OomSource::budget) {
    refused.fetch_add(1);
  } else {
    wrong_failures.fetch_add(1);
  }
}

/// The bytes `budget` holds in `category` now.
inline uint64_t in_use(const runtime::MemoryBudget &budget, MemoryCategory category) {
  return budget.in_use_by_category()[static_cast<std::size_t>(category)];
}

/// The bytes `memory`'s caching pool holds now (charged as pool_cache).
inline uint64_t cached_bytes(runtime::DeviceMemory &memory) {
  return charged(memory, MemoryCategory::pool_cache);
}

/// Allocates `count` ndarray blocks of `size_bytes` and frees them all, so the pool holds them.
inline void warm_pool(runtime::DeviceMemory &memory, uint64_t size_bytes, int count) {
  std::vector<DeviceAllocation> blocks;
  for (int i = 0; i < count; ++i) {
    auto a = memory.allocate(MemoryCategory::ndarray, size_bytes);
    REQUIRE(a);
    blocks.push_back(*a);
  }
  for (DeviceAllocation a : blocks) REQUIRE(memory.free(a));
}

/// Runs `action` once, in another thread, while an allocation of `memory` is between the
/// budget's lock-free check and its lock (MemoryBudget's before-lock hook): the window in which
/// another thread's allocation or free races it. The action's own reservation passes through;
/// the destructor takes the hook off. The action runs in its own thread: it records what it saw
/// for the test to check afterwards (a Catch2 REQUIRE there would end the process).
class InTheBudgetGap {
 public:
  InTheBudgetGap(runtime::DeviceMemory &memory, std::function<void()> action)
      : memory_(memory), action_(std::move(action)) {
    memory_.budget_for_testing().set_before_lock_hook_for_testing(&run, this);
  }
  ~InTheBudgetGap() {
    memory_.budget_for_testing().set_before_lock_hook_for_testing(nullptr, nullptr);
  }
  InTheBudgetGap(const InTheBudgetGap &) = delete;
  InTheBudgetGap &operator=(const InTheBudgetGap &) = delete;
  /// Whether the action has run.
  [[nodiscard]] bool fired() const { return fired_.load(); }

 private:
  static void run(void *self) {
    auto &gap = *static_cast<InTheBudgetGap *>(self);
    if (gap.fired_.exchange(true)) return;
    std::thread other(gap.action_);
    other.join();
  }
  runtime::DeviceMemory &memory_;
  std::function<void()> action_;
  std::atomic<bool> fired_{false};
};

}  // namespace kiln::test::memory

#endif  // KILN_MEMORY_TEST_SUPPORT_H_
