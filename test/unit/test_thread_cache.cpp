// DeviceMemory's per-thread caches (runtime/memory/thread_cache.h): blocks freed on another thread,
// a cache handed to the shared pool when its thread exits, a live thread's cache evicted by another
// under budget, live-check and driver pressure, exact and never-low peaks, the request fault plan
// and the stats counters over lock-free hits, and an exact ledger after threads trade blocks.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using kiln::DeviceAllocation;
using kiln::FaultPlan;
using kiln::MemoryCategory;
using kiln::MockDevice;
using kiln::MockDeviceOptions;
using kiln::OomSource;
using kiln::RhiExpected;
using kiln::RhiResult;
using kiln::RhiStatus;
using kiln::runtime::BudgetConfig;
using kiln::runtime::CachingPool;
using kiln::runtime::DeviceMemory;
using kiln::runtime::MemoryStats;
using namespace kiln::test::memory;

namespace {

constexpr std::size_t idx(MemoryCategory category) { return static_cast<std::size_t>(category); }
constexpr std::size_t kPool = idx(MemoryCategory::pool_cache);

uint64_t peak(const MemoryStats &stats, MemoryCategory category) {
  return stats.ledger.peak_bytes[idx(category)];
}

// With no operation in flight: the categories add up to the total, the total is what the driver
// holds, pool_cache is what the pools hold, and the driver holds `live_blocks` + the cached ones.
void check_ledger(DeviceMemory &memory, MockDevice &mock, uint64_t live_blocks) {
  const auto by_category = memory.in_use_by_category();
  uint64_t sum = 0;
  for (const uint64_t bytes : by_category) sum += bytes;
  const MemoryStats s = memory.stats();
  CHECK(sum == memory.in_use_bytes());
  CHECK(memory.in_use_bytes() == mock.held_bytes());
  CHECK(s.cached_bytes == by_category[kPool]);
  CHECK(mock.live_allocation_count() == live_blocks + s.cached_blocks);
}

// A thread that runs the jobs it is given, in order, until stopped. Tests order their steps across
// threads with it (no sleeps), and keep a thread, and so its cache, alive between steps. Jobs run
// no Catch assertions: they hand their results back to the test's thread.
class Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() { stop(); }
  Worker(const Worker &) = delete;
  Worker &operator=(const Worker &) = delete;

  template <class F>
  auto post(F job) -> std::future<decltype(job())> {
    auto task = std::make_shared<std::packaged_task<decltype(job())()>>(std::move(job));
    auto result = task->get_future();
    {
      std::lock_guard lock(mutex_);
      jobs_.emplace_back([task] { (*task)(); });
    }
    wake_.notify_one();
    return result;
  }
  // Runs `job` on the worker and waits for its result.
  template <class F>
  auto run(F job) {
    return post(std::move(job)).get();
  }
  // Lets the thread finish its jobs and exit, and joins it (its thread-locals are gone after).
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock lock(mutex_);
        wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
        if (jobs_.empty()) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the rest is ready
};

struct Ask {
  MemoryCategory category;
  uint64_t size_bytes;
};

// Allocates every ask, then frees them all, `rounds` times over (the first round misses, later
// ones hit the calling thread's cache). Returns the number of calls that failed; the ids handed
// out in the last round go to `ids`. No Catch assertions: it runs on workers.
int fill_and_free(DeviceMemory &memory, std::span<const Ask> asks, int rounds,
                  std::vector<uint64_t> *ids = nullptr) {
  int failures = 0;
  for (int round = 0; round < rounds; ++round) {
    std::vector<DeviceAllocation> held;
    for (const Ask &ask : asks) {
      auto a = memory.allocate(ask.category, ask.size_bytes);
      if (a) held.push_back(*a);
      else ++failures;
    }
    if (ids != nullptr && round == rounds - 1) {
      ids->clear();
      for (const DeviceAllocation &a : held) ids->push_back(a.alloc_id);
    }
    for (const DeviceAllocation &a : held)
      if (!memory.free(a)) ++failures;
  }
  return failures;
}

bool contains(const std::vector<uint64_t> &ids, uint64_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// 12 MiB in 7 blocks, each class within a thread cache's bin depth (1 MiB: 4, 2 MiB: 2, 4 MiB: 1),
// so all of it stays in the freeing thread's own cache.
constexpr std::array<Ask, 7> kTwelveMiB{{{MemoryCategory::ndarray, 1_MiB},
                                         {MemoryCategory::ndarray, 1_MiB},
                                         {MemoryCategory::staging, 1_MiB},
                                         {MemoryCategory::staging, 1_MiB},
                                         {MemoryCategory::ndarray, 2_MiB},
                                         {MemoryCategory::argument_buffer, 2_MiB},
                                         {MemoryCategory::ndarray, 4_MiB}}};

// After another thread emptied its cache: the worker still allocates, frees into its cache and
// hits it again, and a second free of a freed block is refused.
void check_worker_cache_works(Worker &worker, DeviceMemory &memory, MockDevice &mock) {
  struct Outcome {
    int failures = 0;
    std::vector<uint64_t> first, second;
    uint64_t hits_before = 0, hits_after = 0, driver_before = 0, driver_after = 0;
    bool double_free_refused = false;
  };
  const Outcome o = worker.run([&] {
    Outcome out;
    const std::array<Ask, 2> asks{{{MemoryCategory::ndarray, 1_MiB}, {MemoryCategory::staging, 1_MiB}}};
    std::vector<DeviceAllocation> held;
    for (const Ask &ask : asks) {
      auto a = memory.allocate(ask.category, ask.size_bytes);
      if (!a) ++out.failures;
      else held.push_back(*a);
    }
    for (const DeviceAllocation &a : held) {
      out.first.push_back(a.alloc_id);
      if (!memory.free(a)) ++out.failures;
    }
    if (!held.empty()) {
      auto again = memory.free(held.front());
      out.double_free_refused = !again && again.error().result == RhiResult::invalid_usage;
    }
    out.hits_before = memory.stats().cache_hits;
    out.driver_before = mock.driver_allocation_count();
    for (int round = 0; round < 3; ++round) {
      held.clear();
      for (const Ask &ask : asks) {
        auto a = memory.allocate(ask.category, ask.size_bytes);
        if (!a) ++out.failures;
        else held.push_back(*a);
      }
      if (round == 2)
        for (const DeviceAllocation &a : held) out.second.push_back(a.alloc_id);
      for (const DeviceAllocation &a : held)
        if (!memory.free(a)) ++out.failures;
    }
    out.hits_after = memory.stats().cache_hits;
    out.driver_after = mock.driver_allocation_count();
    return out;
  });
  CHECK(o.failures == 0);
  CHECK(o.double_free_refused);
  REQUIRE(o.first.size() == 2);
  REQUIRE(o.second.size() == 2);
  CHECK(o.hits_after == o.hits_before + 6);  // every one of the 3 rounds hit the worker's cache
  CHECK(o.driver_after == o.driver_before);
  for (const uint64_t id : o.second) CHECK(contains(o.first, id));
  CHECK(o.second[0] != o.second[1]);
}

// The end of an eviction test: the evicted worker's cache still works, and once `big` is freed
// and the caches released the device holds nothing.
void after_eviction(Worker &worker, DeviceMemory &memory, MockDevice &mock, DeviceAllocation big) {
  check_worker_cache_works(worker, memory, mock);
  check_ledger(memory, mock, 1);
  REQUIRE(memory.free(big));
  memory.release_cached();
  CHECK(mock.held_bytes() == 0);
  CHECK(memory.in_use_bytes() == 0);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Cross-thread frees.

TEST_CASE("a block allocated on one thread and freed on another is cached, reusable, freed once",
          "[thread_cache][concurrency]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  Worker a;

  // On A: a miss, freed on A, then a hit from A's own cache (lock-free), and a second live block.
  struct Blocks {
    RhiExpected<DeviceAllocation> first, hit, other;
    RhiStatus freed;
  };
  Blocks on_a = a.run([&] {
    Blocks b;
    b.first = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    if (b.first) b.freed = memory->free(*b.first);
    b.hit = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    b.other = memory->allocate(MemoryCategory::staging, 64_KiB);
    return b;
  });
  REQUIRE(on_a.first);
  REQUIRE(on_a.freed);
  REQUIRE(on_a.hit);
  REQUIRE(on_a.other);
  REQUIRE(*on_a.hit == *on_a.first);
  const DeviceAllocation y = *on_a.hit;
  const DeviceAllocation z = *on_a.other;
  CHECK(memory->stats().cache_hits == 1);
  CHECK(charged(*memory, MemoryCategory::ndarray) == 1_MiB);
  CHECK(charged(*memory, MemoryCategory::staging) == 64_KiB);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == 0);
  check_ledger(*memory, mock, 2);

  // The main thread frees A's block: it is cached, charged as pool_cache, still held by the driver.
  REQUIRE(memory->free(y));
  CHECK(charged(*memory, MemoryCategory::ndarray) == 0);
  CHECK(charged(*memory, MemoryCategory::staging) == 64_KiB);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == 1_MiB);
  CHECK(memory->in_use_bytes() == 1_MiB + 64_KiB);
  CHECK(mock.held_bytes() == 1_MiB + 64_KiB);
  CHECK(mock.live_allocation_count() == 2);
  CHECK(memory->stats().cached_blocks == 1);
  CHECK(memory->stats().cached_bytes == 1_MiB);
  CHECK(memory->stats().frees == 2);
  check_ledger(*memory, mock, 1);

  // Freeing it again, on either thread, is invalid_usage and changes nothing.
  const auto ledger = memory->in_use_by_category();
  auto again_here = memory->free(y);
  REQUIRE_FALSE(again_here);
  CHECK(again_here.error().result == RhiResult::invalid_usage);
  auto again_on_a = a.run([&] { return memory->free(y); });
  REQUIRE_FALSE(again_on_a);
  CHECK(again_on_a.error().result == RhiResult::invalid_usage);
  CHECK(memory->in_use_by_category() == ledger);
  CHECK(memory->stats().cached_blocks == 1);
  CHECK(memory->stats().frees == 2);
  CHECK(mock.held_bytes() == 1_MiB + 64_KiB);

  // The main thread reuses it (another category, same class): a hit, no driver call.
  const uint64_t driver_calls = mock.driver_allocation_count();
  auto w = memory->allocate(MemoryCategory::staging, 1_MiB);
  REQUIRE(w);
  CHECK(*w == y);
  CHECK(mock.driver_allocation_count() == driver_calls);
  CHECK(memory->stats().cache_hits == 2);
  CHECK(charged(*memory, MemoryCategory::staging) == 1_MiB + 64_KiB);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == 0);
  check_ledger(*memory, mock, 2);

  // And the other way round: A frees its own block and the main thread's.
  auto freed_on_a = a.run([&] { return std::make_pair(memory->free(z), memory->free(*w)); });
  REQUIRE(freed_on_a.first);
  REQUIRE(freed_on_a.second);
  CHECK(charged(*memory, MemoryCategory::staging) == 0);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == 1_MiB + 64_KiB);
  CHECK(memory->stats().frees == 4);
  check_ledger(*memory, mock, 0);
  auto w_again_here = memory->free(*w);
  auto w_again_on_a = a.run([&] { return memory->free(*w); });
  REQUIRE_FALSE(w_again_here);
  REQUIRE_FALSE(w_again_on_a);
  CHECK(w_again_here.error().result == RhiResult::invalid_usage);
  CHECK(w_again_on_a.error().result == RhiResult::invalid_usage);
  CHECK(memory->stats().frees == 4);
  CHECK(memory->stats().cached_blocks == 2);

  // A's next 1 MiB request is served by the block it freed for the main thread.
  auto v = a.run([&] { return memory->allocate(MemoryCategory::ndarray, 1_MiB); });
  REQUIRE(v);
  CHECK(*v == y);
  CHECK(mock.driver_allocation_count() == driver_calls);
  CHECK(memory->stats().cache_hits == 3);
  REQUIRE(memory->free(*v));
  check_ledger(*memory, mock, 0);
  CHECK(memory->in_use_bytes() == charged(*memory, MemoryCategory::pool_cache));

  CHECK(memory->release_cached() == 1_MiB + 64_KiB);
  CHECK(mock.held_bytes() == 0);
  CHECK(mock.live_allocation_count() == 0);
  CHECK(memory->in_use_bytes() == 0);
}

TEST_CASE("a second free on the owning thread is refused even when its cache could take it lock-free",
          "[thread_cache]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  auto a = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  auto big = memory->allocate(MemoryCategory::ndarray, 2_MiB);
  REQUIRE(a);
  REQUIRE(big);
  REQUIRE(memory->free(*big));
  auto big_again = memory->allocate(MemoryCategory::ndarray, 2_MiB);  // a hit: its cache now has
  REQUIRE(big_again);                                                 // room to free 2 MiB lock-free
  REQUIRE(*big_again == *big);
  REQUIRE(memory->free(*a));  // cached, with room left for another 1 MiB
  const auto ledger = memory->in_use_by_category();
  const MemoryStats before = memory->stats();
  REQUIRE(before.cached_blocks == 1);

  auto again = memory->free(*a);
  REQUIRE_FALSE(again);
  CHECK(again.error().result == RhiResult::invalid_usage);
  CHECK(memory->in_use_by_category() == ledger);
  CHECK(memory->stats().cached_blocks == 1);  // not kept twice
  CHECK(memory->stats().frees == before.frees);

  // The block is handed out once, not twice.
  auto x = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  auto y = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  REQUIRE(x);
  REQUIRE(y);
  CHECK(*x != *y);
  CHECK(memory->stats().cache_hits == before.cache_hits + 1);
  REQUIRE(memory->free(*x));
  REQUIRE(memory->free(*y));
  REQUIRE(memory->free(*big_again));
  check_ledger(*memory, mock, 0);
}

TEST_CASE("a thread cache keeps its bins' depth, the rest and large classes go to the shared pool",
          "[thread_cache][concurrency]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(256_MiB));
  Worker a;
  // 6 x 1 MiB (bin depth 4), 8 x 64 KiB (depth 7), 6 MiB (above 4 MiB: no thread-cache bin).
  std::vector<Ask> asks;
  for (int i = 0; i < 6; ++i) asks.push_back({MemoryCategory::ndarray, 1_MiB});
  for (int i = 0; i < 8; ++i) asks.push_back({MemoryCategory::staging, 64_KiB});
  asks.push_back({MemoryCategory::ndarray, 6_MiB});
  REQUIRE(a.run([&] { return fill_and_free(*memory, asks, 1); }) == 0);
  CHECK(memory->stats().cached_blocks == 15);
  CHECK(memory->stats().cached_bytes == 12_MiB + 512_KiB);
  check_ledger(*memory, mock, 0);

  // The main thread hits only what overflowed into the shared pool: A's own cache is private.
  const uint64_t driver_calls = mock.driver_allocation_count();
  std::vector<DeviceAllocation> held;
  auto take = [&](MemoryCategory category, uint64_t size_bytes) {
    auto x = memory->allocate(category, size_bytes);
    REQUIRE(x);
    held.push_back(*x);
  };
  take(MemoryCategory::ndarray, 1_MiB);
  take(MemoryCategory::ndarray, 1_MiB);
  take(MemoryCategory::ndarray, 64_KiB);
  take(MemoryCategory::result_buffer, 6_MiB);
  CHECK(memory->stats().cache_hits == 4);
  CHECK(mock.driver_allocation_count() == driver_calls);
  take(MemoryCategory::ndarray, 1_MiB);   // A's four 1 MiB blocks stay A's
  take(MemoryCategory::ndarray, 64_KiB);  // and its seven 64 KiB blocks
  CHECK(memory->stats().cache_hits == 4);
  CHECK(mock.driver_allocation_count() == driver_calls + 2);
  CHECK(memory->stats().cached_blocks == 11);
  check_ledger(*memory, mock, held.size());

  // Once A exits they are the shared pool's: every one is a hit.
  a.stop();
  CHECK(memory->stats().cached_blocks == 11);
  for (int i = 0; i < 4; ++i) take(MemoryCategory::ndarray, 1_MiB);
  for (int i = 0; i < 7; ++i) take(MemoryCategory::staging, 64_KiB);
  CHECK(memory->stats().cache_hits == 15);
  CHECK(mock.driver_allocation_count() == driver_calls + 2);
  CHECK(memory->stats().cached_blocks == 0);
  check_ledger(*memory, mock, held.size());
  for (const DeviceAllocation &x : held) REQUIRE(memory->free(x));
  memory->release_cached();
  CHECK(mock.held_bytes() == 0);
  CHECK(memory->in_use_bytes() == 0);
}

// ---------------------------------------------------------------------------------------------
// Thread exit.

TEST_CASE("when a thread exits its cached blocks go to the shared pool: hits for others, released",
          "[thread_cache][concurrency]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  std::vector<Ask> asks;
  for (int i = 0; i < 4; ++i) asks.push_back({MemoryCategory::ndarray, 1_MiB});
  asks.push_back({MemoryCategory::staging, 64_KiB});
  asks.push_back({MemoryCategory::staging, 64_KiB});
  constexpr uint64_t kCached = 4_MiB + 128_KiB;

  Worker t;
  std::vector<uint64_t> ids;
  REQUIRE(t.run([&] { return fill_and_free(*memory, asks, 3, &ids); }) == 0);  // 6 misses, 12 hits
  REQUIRE(ids.size() == 6);
  const MemoryStats before = memory->stats();
  const auto ledger_before = memory->in_use_by_category();
  const uint64_t requests_before = memory->fault_plan().allocation_count();
  CHECK(before.allocations == 18);
  CHECK(before.frees == 18);
  CHECK(before.cache_hits == 12);
  CHECK(before.cached_blocks == 6);
  CHECK(before.cached_bytes == kCached);
  CHECK(requests_before == 18);
  CHECK(ledger_before[kPool] == kCached);
  check_ledger(*memory, mock, 0);

  t.stop();  // joined: the thread's cache has been handed back

  const MemoryStats after = memory->stats();
  CHECK(after.cached_blocks == before.cached_blocks);
  CHECK(after.cached_bytes == before.cached_bytes);
  CHECK(after.allocations == before.allocations);
  CHECK(after.frees == before.frees);
  CHECK(after.cache_hits == before.cache_hits);
  CHECK(after.evictions == 0);
  CHECK(memory->in_use_by_category() == ledger_before);
  CHECK(memory->fault_plan().allocation_count() == requests_before);
  CHECK(mock.held_bytes() == kCached);
  check_ledger(*memory, mock, 0);

  // The main thread allocates the same classes (other categories): all hits, no driver call.
  const uint64_t driver_calls = mock.driver_allocation_count();
  std::vector<DeviceAllocation> held;
  for (int i = 0; i < 4; ++i) {
    auto x = memory->allocate(MemoryCategory::staging, 1_MiB);
    REQUIRE(x);
    CHECK(contains(ids, x->alloc_id));
    held.push_back(*x);
  }
  for (int i = 0; i < 2; ++i) {
    auto x = memory->allocate(MemoryCategory::result_buffer, 64_KiB);
    REQUIRE(x);
    CHECK(contains(ids, x->alloc_id));
    held.push_back(*x);
  }
  CHECK(memory->stats().cache_hits == before.cache_hits + 6);
  CHECK(mock.driver_allocation_count() == driver_calls);
  CHECK(memory->stats().cached_blocks == 0);
  CHECK(charged(*memory, MemoryCategory::staging) == 4_MiB);
  CHECK(charged(*memory, MemoryCategory::result_buffer) == 128_KiB);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == 0);
  auto miss = memory->allocate(MemoryCategory::ndarray, 1_MiB);  // the pool is empty now
  REQUIRE(miss);
  held.push_back(*miss);
  CHECK(mock.driver_allocation_count() == driver_calls + 1);
  check_ledger(*memory, mock, held.size());

  for (const DeviceAllocation &x : held) REQUIRE(memory->free(x));
  CHECK(memory->stats().cached_bytes == kCached + 1_MiB);
  check_ledger(*memory, mock, 0);
  CHECK(memory->release_cached() == kCached + 1_MiB);
  CHECK(mock.held_bytes() == 0);
  CHECK(mock.live_allocation_count() == 0);
  CHECK(memory->in_use_bytes() == 0);
  CHECK(memory->stats().cached_bytes == 0);
  CHECK(memory->stats().evictions == 7);
  for (std::size_t k = 0; k < kiln::kNumMemoryCategories; ++k) CHECK(memory->in_use_by_category()[k] == 0);
}

TEST_CASE("a thread that exits holding live blocks: another thread frees them, the ledger is exact",
          "[thread_cache][concurrency]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  Worker t;
  struct Left {
    RhiExpected<DeviceAllocation> hit, grown;
    int failures = 0;
  };
  // The thread leaves a block it got from its own cache (lock-free), one it grew, and a cached one.
  Left left = t.run([&] {
    Left l;
    auto first = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    if (!first || !memory->free(*first)) ++l.failures;
    l.hit = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    l.grown = memory->allocate(MemoryCategory::staging, 2_MiB);
    auto spare = memory->allocate(MemoryCategory::argument_buffer, 64_KiB);
    if (!spare || !memory->free(*spare)) ++l.failures;
    return l;
  });
  REQUIRE(left.failures == 0);
  REQUIRE(left.hit);
  REQUIRE(left.grown);
  CHECK(memory->stats().cache_hits == 1);
  const auto ledger_before = memory->in_use_by_category();
  CHECK(ledger_before[idx(MemoryCategory::ndarray)] == 1_MiB);
  CHECK(ledger_before[idx(MemoryCategory::staging)] == 2_MiB);
  CHECK(ledger_before[kPool] == 64_KiB);
  check_ledger(*memory, mock, 2);

  t.stop();
  CHECK(memory->in_use_by_category() == ledger_before);
  check_ledger(*memory, mock, 2);

  REQUIRE(memory->free(*left.hit));
  REQUIRE(memory->free(*left.grown));
  CHECK(charged(*memory, MemoryCategory::ndarray) == 0);
  CHECK(charged(*memory, MemoryCategory::staging) == 0);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == 3_MiB + 64_KiB);
  check_ledger(*memory, mock, 0);
  auto again = memory->free(*left.hit);
  REQUIRE_FALSE(again);
  CHECK(again.error().result == RhiResult::invalid_usage);

  // Both are reusable from the main thread.
  const uint64_t driver_calls = mock.driver_allocation_count();
  auto x = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  auto y = memory->allocate(MemoryCategory::ndarray, 2_MiB);
  REQUIRE(x);
  REQUIRE(y);
  CHECK(*x == *left.hit);
  CHECK(*y == *left.grown);
  CHECK(mock.driver_allocation_count() == driver_calls);
  REQUIRE(memory->free(*x));
  REQUIRE(memory->free(*y));
  check_ledger(*memory, mock, 0);
  CHECK(memory->release_cached() == 3_MiB + 64_KiB);
  CHECK(mock.held_bytes() == 0);
  CHECK(memory->in_use_bytes() == 0);
}

// ---------------------------------------------------------------------------------------------
// Another live thread's cache is evicted under pressure.

TEST_CASE("another live thread's cached bytes never cause a budget refusal, its cache still works",
          "[thread_cache][concurrency]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(16_MiB));
  Worker a;  // stays alive, parked, until the end
  REQUIRE(a.run([&] { return fill_and_free(*memory, kTwelveMiB, 2); }) == 0);
  REQUIRE(memory->stats().cached_bytes == 12_MiB);
  REQUIRE(memory->stats().cached_blocks == 7);
  check_ledger(*memory, mock, 0);

  // 8 MiB fits in 16 MiB only once A's 12 MiB are gone.
  auto big = memory->allocate(MemoryCategory::ndarray, 8_MiB);
  REQUIRE(big);
  CHECK(memory->stats().evictions == 7);
  CHECK(memory->stats().retries == 1);
  CHECK(memory->stats().cached_bytes == 0);
  CHECK(charged(*memory, MemoryCategory::ndarray) == 8_MiB);
  CHECK(charged(*memory, MemoryCategory::pool_cache) == 0);
  CHECK(mock.held_bytes() == 8_MiB);
  CHECK(mock.high_water_bytes() <= 16_MiB);
  check_ledger(*memory, mock, 1);

  after_eviction(a, *memory, mock, *big);
}

TEST_CASE("another live thread's cached bytes never cause a live-check refusal",
          "[thread_cache][concurrency][live]") {
  // 64 MiB device, 8 MiB reserve, a limit that never binds: only the live check can refuse.
  MockDevice mock(mock_options(64_MiB));
  auto memory = make_memory(mock, cached(1_GiB, /*reserve_bytes=*/8_MiB));
  Worker a;
  REQUIRE(a.run([&] { return fill_and_free(*memory, kTwelveMiB, 2); }) == 0);
  REQUIRE(memory->stats().cached_bytes == 12_MiB);
  mock.set_other_process_bytes(36_MiB);  // free 16 MiB, usable 8 MiB
  const uint64_t live_checks = memory->stats().live_checks;

  auto big = memory->allocate(MemoryCategory::ndarray, 12_MiB);
  REQUIRE(big);
  CHECK(memory->stats().live_checks == live_checks + 2);  // refused, evicted, asked again
  CHECK(memory->stats().live_refusals == 0);
  CHECK(memory->stats().evictions == 7);
  CHECK(memory->stats().retries == 1);
  CHECK(memory->stats().cached_bytes == 0);
  CHECK(mock.driver_oom_count() == 0);
  CHECK(mock.held_bytes() == 12_MiB);
  check_ledger(*memory, mock, 1);

  after_eviction(a, *memory, mock, *big);
}

TEST_CASE("another live thread's cached bytes never cause a driver refusal",
          "[thread_cache][concurrency]") {
  // The driver's capacity is below the budget and the live check is off: only the driver refuses.
  MockDevice mock(mock_options(16_MiB));
  auto memory = make_memory(mock, cached(64_MiB, /*reserve_bytes=*/0, /*live_check=*/false));
  Worker a;
  REQUIRE(a.run([&] { return fill_and_free(*memory, kTwelveMiB, 2); }) == 0);
  REQUIRE(mock.held_bytes() == 12_MiB);

  auto big = memory->allocate(MemoryCategory::ndarray, 8_MiB);
  REQUIRE(big);
  CHECK(mock.driver_oom_count() == 1);
  CHECK(memory->stats().driver_ooms == 1);
  CHECK(memory->stats().retries == 1);
  CHECK(memory->stats().evictions == 7);
  CHECK(memory->stats().cached_bytes == 0);
  CHECK(mock.held_bytes() == 8_MiB);
  check_ledger(*memory, mock, 1);

  after_eviction(a, *memory, mock, *big);
}

TEST_CASE("a thread's cache emptied over and over while its owner allocates and frees stays exact",
          "[thread_cache][concurrency]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(256_MiB));
  constexpr int kDrains = 2000;
  // Relaxed on purpose: pacing only, no happens-before edge that would hide a race from TSan.
  std::atomic<int> drains{0};    // release_cached calls made so far
  std::atomic<int> progress{0};  // the owner's iterations so far
  struct Outcome {
    int iterations = 0, failures = 0, bad_frees = 0, dead_blocks = 0;
  };
  Worker owner;
  // The owner allocates and frees (mostly lock-free hits) until the main thread has drained its
  // cache kDrains times; between drains the main thread waits for a few owner iterations, so
  // every drain meets a refilled cache and an owner on its lock-free path.
  auto result = owner.post([&] {
    Outcome o;
    // One category, one block at a time, largest class first: after each drain's misses the
    // owner is back on its lock-free path within an iteration (a locked operation leaves the
    // cache headroom for one block of one category only).
    const std::array<Ask, 3> asks{{{MemoryCategory::ndarray, 1_MiB},
                                   {MemoryCategory::ndarray, 64_KiB},
                                   {MemoryCategory::ndarray, 700}}};
    while (drains.load(std::memory_order_relaxed) < kDrains) {
      for (const Ask &ask : asks) {
        auto a = memory->allocate(ask.category, ask.size_bytes);
        if (!a) {
          ++o.failures;
          continue;
        }
        // A block handed out must still be the device's: an eviction racing the hit would have
        // freed it.
        const uint64_t stamp = static_cast<uint64_t>(o.iterations);
        if (!mock.memcpy_host_to_device(*a, 0, &stamp, sizeof stamp)) ++o.dead_blocks;
        if (!memory->free(*a)) ++o.bad_frees;
      }
      progress.store(++o.iterations, std::memory_order_relaxed);
    }
    return o;
  });
  uint64_t released = 0;
  for (int d = 0; d < kDrains; ++d) {
    const int target = progress.load(std::memory_order_relaxed) + 4;
    while (progress.load(std::memory_order_relaxed) < target) std::this_thread::yield();
    released += memory->release_cached();
    drains.store(d + 1, std::memory_order_relaxed);
  }
  const Outcome o = result.get();
  CHECK(o.failures == 0);
  CHECK(o.bad_frees == 0);
  CHECK(o.dead_blocks == 0);
  CHECK(o.iterations >= 4 * kDrains);
  const MemoryStats s = memory->stats();
  CHECK(s.allocations == 3 * static_cast<uint64_t>(o.iterations));
  CHECK(s.frees == 3 * static_cast<uint64_t>(o.iterations));
  CHECK(mock.driver_allocation_count() == s.allocations - s.cache_hits);
  check_ledger(*memory, mock, 0);
  CHECK(memory->in_use_bytes() == charged(*memory, MemoryCategory::pool_cache));
  released += memory->release_cached();
  CHECK(mock.held_bytes() == 0);
  CHECK(memory->in_use_bytes() == 0);
  CHECK(mock.live_allocation_count() == 0);
  CHECK(released > 0);
  // Every block the driver gave went back by an eviction, none twice.
  CHECK(memory->stats().evictions == mock.driver_allocation_count());
  owner.stop();
}

// ---------------------------------------------------------------------------------------------
// Peaks.

TEST_CASE("per-category peaks are exact on one thread, through cache hits and reset_peaks",
          "[thread_cache]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  const uint64_t klass = CachingPool::size_class(1_MiB);
  REQUIRE(klass == 1_MiB);

  auto s = memory->allocate(MemoryCategory::staging, 1_MiB);  // a miss
  REQUIRE(s);
  REQUIRE(memory->free(*s));
  auto n = memory->allocate(MemoryCategory::ndarray, 1_MiB);  // a hit, the same block
  REQUIRE(n);
  REQUIRE(*n == *s);
  MemoryStats st = memory->stats();
  CHECK(st.cache_hits == 1);
  CHECK(peak(st, MemoryCategory::ndarray) == 1_MiB);
  CHECK(peak(st, MemoryCategory::staging) == 1_MiB);
  CHECK(peak(st, MemoryCategory::pool_cache) == 1_MiB);
  CHECK(peak(st, MemoryCategory::argument_buffer) == 0);
  CHECK(st.ledger.peak_total_bytes == 1_MiB);

  // Lock-free round trips of the same block change no peak.
  REQUIRE(memory->free(*n));
  for (int i = 0; i < 10; ++i) {
    auto again = memory->allocate(MemoryCategory::ndarray, 1_MiB);
    REQUIRE(again);
    CHECK(*again == *s);
    REQUIRE(memory->free(*again));
  }
  st = memory->stats();
  CHECK(st.cache_hits == 11);
  CHECK(peak(st, MemoryCategory::ndarray) == 1_MiB);
  CHECK(peak(st, MemoryCategory::staging) == 1_MiB);
  CHECK(peak(st, MemoryCategory::pool_cache) == 1_MiB);
  CHECK(st.ledger.peak_total_bytes == 1_MiB);

  // Two held at once: ndarray peaks at 2 MiB, then both are cached: pool_cache peaks at 2 MiB.
  auto x = memory->allocate(MemoryCategory::ndarray, 1_MiB);  // a hit
  auto y = memory->allocate(MemoryCategory::ndarray, 1_MiB);  // a miss
  REQUIRE(x);
  REQUIRE(y);
  st = memory->stats();
  CHECK(peak(st, MemoryCategory::ndarray) == 2_MiB);
  CHECK(peak(st, MemoryCategory::pool_cache) == 1_MiB);
  REQUIRE(memory->free(*x));
  REQUIRE(memory->free(*y));
  st = memory->stats();
  CHECK(peak(st, MemoryCategory::ndarray) == 2_MiB);
  CHECK(peak(st, MemoryCategory::staging) == 1_MiB);
  CHECK(peak(st, MemoryCategory::pool_cache) == 2_MiB);
  CHECK(st.ledger.peak_total_bytes == 2_MiB);

  // reset_peaks: every peak is the current figure.
  memory->reset_peaks();
  st = memory->stats();
  const auto current = memory->in_use_by_category();
  for (std::size_t k = 0; k < kiln::kNumMemoryCategories; ++k) {
    CAPTURE(k);
    CHECK(st.ledger.peak_bytes[k] == current[k]);
    CHECK(st.ledger.current_bytes[k] == current[k]);
  }
  CHECK(current[kPool] == 2_MiB);
  CHECK(st.ledger.peak_total_bytes == memory->in_use_bytes());

  // From there a hit raises its category's peak to exactly what is held.
  auto z = memory->allocate(MemoryCategory::result_buffer, 1_MiB);
  REQUIRE(z);
  REQUIRE(memory->free(*z));
  auto z2 = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  REQUIRE(z2);
  st = memory->stats();
  CHECK(peak(st, MemoryCategory::result_buffer) == 1_MiB);
  CHECK(peak(st, MemoryCategory::ndarray) == 1_MiB);
  CHECK(peak(st, MemoryCategory::staging) == 0);
  CHECK(peak(st, MemoryCategory::pool_cache) == 2_MiB);
  CHECK(st.cache_hits == 14);  // n, 10 round trips, x, z, z2
  CHECK(mock.driver_allocation_count() == 2);
  REQUIRE(memory->free(*z2));
}

TEST_CASE("per-category peaks are never below the truth while threads hit their own caches",
          "[thread_cache][concurrency]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(64_MiB));
  constexpr int kThreads = 4;
  constexpr uint64_t kX = 1_MiB;
  std::array<Worker, kThreads> workers;

  // One thread at a time: a staging block grown and freed, reused as ndarray and freed again.
  // Never more than kX of ndarray is held in this phase.
  for (Worker &w : workers) {
    const int failures = w.run([&] {
      int f = 0;
      auto s = memory->allocate(MemoryCategory::staging, kX);
      if (!s || !memory->free(*s)) ++f;
      auto n = memory->allocate(MemoryCategory::ndarray, kX);
      if (!n || !memory->free(*n)) ++f;
      return f;
    });
    REQUIRE(failures == 0);
  }
  REQUIRE(charged(*memory, MemoryCategory::ndarray) == 0);
  const uint64_t driver_calls = mock.driver_allocation_count();
  const uint64_t hits = memory->stats().cache_hits;
  REQUIRE(driver_calls == kThreads);

  // Now all four hit their own cache (lock-free) and hold kX of ndarray at the same time.
  std::latch holding(kThreads);
  std::latch go(1);
  std::vector<std::future<int>> results;
  for (Worker &w : workers)
    results.push_back(w.post([&] {
      int f = 0;
      auto n = memory->allocate(MemoryCategory::ndarray, kX);
      if (!n) ++f;
      holding.count_down();
      go.wait();
      if (n && !memory->free(*n)) ++f;
      return f;
    }));
  holding.wait();
  const MemoryStats during = memory->stats();
  CHECK(during.ledger.current_bytes[idx(MemoryCategory::ndarray)] == kThreads * kX);
  CHECK(peak(during, MemoryCategory::ndarray) >= kThreads * kX);
  check_ledger(*memory, mock, kThreads);
  go.count_down();
  for (auto &r : results) CHECK(r.get() == 0);

  const MemoryStats after = memory->stats();
  CHECK(after.cache_hits == hits + kThreads);
  CHECK(mock.driver_allocation_count() == driver_calls);
  CHECK(after.ledger.current_bytes[idx(MemoryCategory::ndarray)] == 0);
  CHECK(peak(after, MemoryCategory::ndarray) >= kThreads * kX);  // held together above
  CHECK(peak(after, MemoryCategory::staging) >= kX);
  CHECK(after.ledger.peak_total_bytes == kThreads * kX);  // the total peak is exact
  check_ledger(*memory, mock, 0);
  for (Worker &w : workers) w.stop();
  check_ledger(*memory, mock, 0);
  CHECK(memory->release_cached() == kThreads * kX);
}

// ---------------------------------------------------------------------------------------------
// The request fault plan and the stats counters count lock-free hits.

TEST_CASE("the request fault plan counts and fails requests that would be lock-free hits",
          "[thread_cache][fault]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  // Warm 1 MiB and 2 MiB: after a miss and a free, the next requests are lock-free hits.
  const std::array<Ask, 2> asks{{{MemoryCategory::ndarray, 1_MiB}, {MemoryCategory::ndarray, 2_MiB}}};
  REQUIRE(fill_and_free(*memory, asks, 2) == 0);
  const uint64_t driver_calls = mock.driver_allocation_count();
  REQUIRE(driver_calls == 2);
  auto round_trip = [&](uint64_t size_bytes) {
    auto a = memory->allocate(MemoryCategory::ndarray, size_bytes);
    REQUIRE(a);
    REQUIRE(memory->free(*a));
  };

  memory->fault_plan().fail_nth_allocation(FaultPlan::kNever);  // resets the count
  CHECK_FALSE(memory->fault_plan().armed());
  CHECK(memory->fault_plan().allocation_count() == 0);
  uint64_t hits = memory->stats().cache_hits;
  for (int i = 0; i < 5; ++i) round_trip(1_MiB);
  CHECK(memory->fault_plan().allocation_count() == 5);
  CHECK(memory->stats().cache_hits == hits + 5);
  CHECK(mock.driver_allocation_count() == driver_calls);

  SECTION("fail_nth_allocation fails the n-th request, a would-be hit, and nothing moves") {
    memory->fault_plan().fail_nth_allocation(2);
    CHECK(memory->fault_plan().allocation_count() == 0);
    round_trip(1_MiB);  // request 1
    hits = memory->stats().cache_hits;
    const auto ledger = memory->in_use_by_category();
    const uint64_t blocks = memory->stats().cached_blocks;
    auto faulted = memory->allocate(MemoryCategory::ndarray, 1_MiB);  // request 2
    REQUIRE_FALSE(faulted);
    CHECK(faulted.error().result == RhiResult::out_of_memory);
    CHECK(faulted.error().oom_source == OomSource::driver);
    CHECK(faulted.error().requested_bytes == 1_MiB);
    CHECK(memory->fault_plan().allocation_count() == 2);
    CHECK(memory->stats().cache_hits == hits);
    CHECK(memory->stats().cached_blocks == blocks);
    CHECK(memory->in_use_by_category() == ledger);
    round_trip(1_MiB);  // request 3 is served
    CHECK(memory->stats().cache_hits == hits + 1);
    CHECK(memory->fault_plan().allocation_count() == 3);

    // Cleared, the hits are lock-free again and still counted.
    memory->fault_plan().clear();
    for (int i = 0; i < 3; ++i) round_trip(1_MiB);
    CHECK(memory->fault_plan().allocation_count() == 6);
    CHECK(memory->stats().cache_hits == hits + 4);
  }
  SECTION("fail_sizes_at_least fails would-be hits from that size up only") {
    memory->fault_plan().fail_sizes_at_least(2_MiB);
    CHECK(memory->fault_plan().armed());
    round_trip(1_MiB);
    auto faulted = memory->allocate(MemoryCategory::ndarray, 2_MiB);
    REQUIRE_FALSE(faulted);
    CHECK(faulted.error().result == RhiResult::out_of_memory);
    CHECK(faulted.error().oom_source == OomSource::driver);
    CHECK(memory->fault_plan().allocation_count() == 7);
    memory->fault_plan().fail_sizes_at_least(FaultPlan::kNever);
    CHECK_FALSE(memory->fault_plan().armed());
    hits = memory->stats().cache_hits;
    round_trip(2_MiB);
    round_trip(2_MiB);
    CHECK(memory->stats().cache_hits == hits + 2);
    CHECK(memory->fault_plan().allocation_count() == 9);
  }
  CHECK(mock.driver_allocation_count() == driver_calls);
  check_ledger(*memory, mock, 0);
}

TEST_CASE("the request fault plan counts and fails another thread's lock-free hits",
          "[thread_cache][fault][concurrency]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  Worker w;
  const std::array<Ask, 1> asks{{{MemoryCategory::ndarray, 1_MiB}}};
  std::vector<uint64_t> ids;
  REQUIRE(w.run([&] { return fill_and_free(*memory, asks, 3, &ids); }) == 0);
  const uint64_t driver_calls = mock.driver_allocation_count();
  const uint64_t hits = memory->stats().cache_hits;
  REQUIRE(hits == 2);

  // The first request on the worker, a would-be hit, fails; the second is served.
  memory->fault_plan().fail_nth_allocation(1);
  auto faulted = w.run([&] { return memory->allocate(MemoryCategory::ndarray, 1_MiB); });
  REQUIRE_FALSE(faulted);
  CHECK(faulted.error().result == RhiResult::out_of_memory);
  CHECK(faulted.error().oom_source == OomSource::driver);
  CHECK(memory->stats().cached_blocks == 1);
  CHECK(memory->stats().cache_hits == hits);
  auto served = w.run([&] { return memory->allocate(MemoryCategory::ndarray, 1_MiB); });
  REQUIRE(served);
  CHECK(served->alloc_id == ids.front());
  CHECK(memory->stats().cache_hits == hits + 1);
  CHECK(memory->fault_plan().allocation_count() == 2);
  REQUIRE(w.run([&] { return memory->free(*served); }));

  // Disarmed: the worker's 5 lock-free hits are counted, also after the worker exits.
  memory->fault_plan().fail_nth_allocation(FaultPlan::kNever);
  REQUIRE(w.run([&] { return fill_and_free(*memory, asks, 5); }) == 0);
  CHECK(memory->fault_plan().allocation_count() == 5);
  CHECK(memory->stats().cache_hits == hits + 6);
  w.stop();
  CHECK(memory->fault_plan().allocation_count() == 5);
  CHECK(memory->stats().cache_hits == hits + 6);
  auto on_main = memory->allocate(MemoryCategory::ndarray, 1_MiB);  // now from the shared pool
  REQUIRE(on_main);
  CHECK(memory->fault_plan().allocation_count() == 6);
  CHECK(mock.driver_allocation_count() == driver_calls);
  REQUIRE(memory->free(*on_main));
  check_ledger(*memory, mock, 0);
}

TEST_CASE("stats count lock-free allocations, frees and hits, also after the thread exits",
          "[thread_cache][concurrency]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  // 1 MiB goes through thread caches; 8 MiB (no thread-cache bin) through the shared pool.
  const std::array<Ask, 2> asks{{{MemoryCategory::ndarray, 1_MiB}, {MemoryCategory::staging, 8_MiB}}};
  REQUIRE(fill_and_free(*memory, asks, 1) == 0);
  const uint64_t driver_calls = mock.driver_allocation_count();
  MemoryStats s0 = memory->stats();
  REQUIRE(s0.allocations == 2);
  REQUIRE(s0.frees == 2);
  REQUIRE(s0.cache_hits == 0);

  REQUIRE(fill_and_free(*memory, asks, 100) == 0);
  MemoryStats s1 = memory->stats();
  CHECK(s1.allocations == s0.allocations + 200);
  CHECK(s1.frees == s0.frees + 200);
  CHECK(s1.cache_hits == s0.cache_hits + 200);
  CHECK(s1.evictions == 0);
  CHECK(s1.cached_blocks == 2);
  CHECK(mock.driver_allocation_count() == driver_calls);

  // On another thread: its own 1 MiB misses once, then 99 hits; counted while it lives and after.
  Worker w;
  REQUIRE(w.run([&] { return fill_and_free(*memory, asks, 100); }) == 0);
  const MemoryStats s2 = memory->stats();
  CHECK(s2.allocations == s1.allocations + 200);
  CHECK(s2.frees == s1.frees + 200);
  CHECK(s2.cache_hits == s1.cache_hits + 199);
  CHECK(mock.driver_allocation_count() == driver_calls + 1);
  w.stop();
  const MemoryStats s3 = memory->stats();
  CHECK(s3.allocations == s2.allocations);
  CHECK(s3.frees == s2.frees);
  CHECK(s3.cache_hits == s2.cache_hits);
  CHECK(s3.cached_blocks == 3);
  check_ledger(*memory, mock, 0);
}

// ---------------------------------------------------------------------------------------------
// The ledger under threads that trade blocks.

TEST_CASE("threads allocating and freeing each other's blocks under a small budget leave an exact ledger",
          "[thread_cache][concurrency]") {
  constexpr uint64_t kLimit = 12_MiB;
  constexpr int kThreads = 6;
  constexpr int kIterations = 3000;
  constexpr std::size_t kMaxHeld = 12;
  const std::array<uint64_t, 9> sizes{300, 512, 4_KiB, 64_KiB, 200_KiB, 1_MiB, 1_MiB + 1, 3_MiB, 6_MiB};
  MockDevice mock(mock_options(256_MiB));
  auto memory = make_memory(mock, cached(kLimit, /*reserve_bytes=*/1_MiB));

  std::mutex shared_mutex;
  std::vector<DeviceAllocation> shared;  // blocks handed to whichever thread takes them
  std::atomic<uint64_t> granted{0}, refused{0}, wrong_failures{0}, freed{0}, bad_frees{0},
      cross_frees{0};
  std::latch start(kThreads);
  std::latch finished(kThreads + 1);  // the workers are done, and the main thread has looked
  std::latch leave(1);                // then the workers may exit

  auto worker = [&](unsigned seed) {
    std::mt19937 rng(seed);
    std::vector<DeviceAllocation> held;
    auto free_one = [&](DeviceAllocation a) {
      if (!memory->free(a)) bad_frees.fetch_add(1);
      freed.fetch_add(1);
    };
    start.arrive_and_wait();
    for (int i = 0; i < kIterations; ++i) {
      const unsigned op = rng() % 16;
      if (op < 7 && held.size() < kMaxHeld) {
        const auto category = static_cast<MemoryCategory>(rng() % 6);  // every one but pool_cache
        auto a = memory->allocate(category, sizes[rng() % sizes.size()], /*zero_fill=*/rng() % 8 == 0);
        if (a) {
          granted.fetch_add(1);
          held.push_back(*a);
        } else if (a.error().result == RhiResult::out_of_memory &&
                   a.error().oom_source == OomSource::budget) {
          refused.fetch_add(1);
        } else {
          wrong_failures.fetch_add(1);
        }
      } else if (op < 11 && !held.empty()) {
        const std::size_t k = rng() % held.size();
        free_one(held[k]);
        held[k] = held.back();
        held.pop_back();
      } else if (op < 13 && !held.empty()) {
        std::lock_guard lock(shared_mutex);
        shared.push_back(held.back());
        held.pop_back();
      } else if (op < 15) {
        std::optional<DeviceAllocation> theirs;
        {
          std::lock_guard lock(shared_mutex);
          if (!shared.empty()) {
            theirs = shared.back();
            shared.pop_back();
          }
        }
        if (theirs) {
          free_one(*theirs);
          cross_frees.fetch_add(1);
        }
      } else {
        switch (rng() % 8) {
          case 0: memory->release_cached(); break;
          case 1: memory->reset_peaks(); break;
          case 2: (void)memory->stats(); break;
          default: (void)memory->in_use_by_category(); break;
        }
      }
    }
    for (DeviceAllocation a : held) free_one(a);
    finished.arrive_and_wait();
    leave.wait();
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, 4321u + 17u * t);

  auto check_all_cached = [&] {
    CHECK(wrong_failures.load() == 0);
    CHECK(bad_frees.load() == 0);
    CHECK(mock.high_water_bytes() <= kLimit);
    const MemoryStats s = memory->stats();
    CHECK(s.allocations == granted.load());
    CHECK(s.frees == freed.load());
    CHECK(s.ledger.peak_total_bytes <= kLimit);
    const auto by_category = memory->in_use_by_category();
    for (std::size_t k = 0; k < kiln::kNumMemoryCategories; ++k) {
      CAPTURE(k);
      if (k != kPool) CHECK(by_category[k] == 0);
    }
    CHECK(by_category[kPool] == memory->in_use_bytes());
    CHECK(memory->in_use_bytes() == mock.held_bytes());
    CHECK(s.cached_bytes == memory->in_use_bytes());
    CHECK(mock.live_allocation_count() == s.cached_blocks);
  };

  // The workers are still alive (their caches bound) when the main thread first looks.
  finished.arrive_and_wait();
  {
    std::lock_guard lock(shared_mutex);  // what nobody took, the main thread frees
    for (DeviceAllocation a : shared) {
      CHECK(memory->free(a));
      freed.fetch_add(1);
    }
    shared.clear();
  }
  check_all_cached();
  leave.count_down();
  for (auto &t : threads) t.join();
  check_all_cached();  // and once their caches went to the shared pool
  CHECK(granted.load() > 0);
  CHECK(refused.load() > 0);      // the limit was reached
  CHECK(cross_frees.load() > 0);  // blocks did change threads

  const uint64_t held = memory->in_use_bytes();
  CHECK(memory->release_cached() == held);
  CHECK(mock.held_bytes() == 0);
  CHECK(mock.live_allocation_count() == 0);
  CHECK(memory->in_use_bytes() == 0);
  for (const uint64_t bytes : memory->in_use_by_category()) CHECK(bytes == 0);
}

// ---------------------------------------------------------------------------------------------
// What the lock-free path covers: after one warm-up round, every reuse pattern of one thread is
// served lock-free (stats().lock_free_hits), not just one block of one category at a time.

namespace {

struct Pattern {
  const char *name;
  std::vector<std::pair<MemoryCategory, uint64_t>> held_together;  // allocated, then all freed
};

// Runs `rounds` rounds of `pattern` (allocate every member, then free them all); returns the
// lock-free hits those rounds got.
uint64_t lock_free_hits_over(DeviceMemory &memory, const Pattern &pattern, int rounds) {
  const uint64_t before = memory.stats().lock_free_hits;
  for (int round = 0; round < rounds; ++round) {
    std::vector<DeviceAllocation> blocks;
    for (const auto &[category, size] : pattern.held_together) {
      auto a = memory.allocate(category, size);
      REQUIRE(a);
      blocks.push_back(*a);
    }
    for (DeviceAllocation a : blocks) REQUIRE(memory.free(a));
  }
  return memory.stats().lock_free_hits - before;
}

}  // namespace

TEST_CASE("after a warm-up every reuse pattern of one thread is served lock-free", "[thread_cache]") {
  const MemoryCategory nd = MemoryCategory::ndarray, st = MemoryCategory::staging,
                       arg = MemoryCategory::argument_buffer;
  const std::vector<Pattern> patterns = {
      {"one block", {{nd, 4_KiB}}},
      {"four blocks of one class held together", {{nd, 64_KiB}, {nd, 64_KiB}, {nd, 64_KiB}, {nd, 64_KiB}}},
      {"one block alternating categories", {{nd, 1_MiB}}},  // the category changes below
      {"mixed categories and classes held together", {{nd, 64}, {st, 4_KiB}, {arg, 256_KiB}, {nd, 4_MiB}}},
  };
  for (const Pattern &pattern : patterns) {
    SECTION(pattern.name) {
      MockDevice mock(mock_options(1_GiB));
      auto memory = make_memory(mock, cached(512_MiB));
      (void)lock_free_hits_over(*memory, pattern, 2);  // warm-up: growth, then the locked path
      const uint64_t calls = mock.driver_allocation_count();
      constexpr int kRounds = 200;
      const uint64_t requests = kRounds * pattern.held_together.size();
      if (std::string_view(pattern.name) == "one block alternating categories") {
        const Pattern staging{"", {{st, 1_MiB}}};
        (void)lock_free_hits_over(*memory, staging, 2);
        uint64_t hits = 0;
        for (int round = 0; round < kRounds / 2; ++round)
          hits += lock_free_hits_over(*memory, pattern, 1) + lock_free_hits_over(*memory, staging, 1);
        CHECK(hits == requests);
      } else {
        CHECK(lock_free_hits_over(*memory, pattern, kRounds) == requests);
      }
      CHECK(mock.driver_allocation_count() == calls);  // all reuse
      check_ledger(*memory, mock, 0);
    }
  }
}

TEST_CASE("two threads freeing the same block at the same moment: exactly one free succeeds",
          "[thread_cache][concurrency]") {
  // The owner's free is lock-free; the other thread's takes the locked path, which must stop the
  // owner's fast path before it decides. Without that, both succeed and the block is cached twice.
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(512_MiB));
  Worker owner;
  REQUIRE(owner.run([&] { return fill_and_free(*memory, std::array<Ask, 1>{{{MemoryCategory::ndarray, 4_KiB}}}, 2); }) == 0);
  constexpr int kRounds = 2000;
  int both = 0, neither = 0;
  for (int round = 0; round < kRounds; ++round) {
    const auto block = owner.run([&] { return memory->allocate(MemoryCategory::ndarray, 4_KiB); });
    REQUIRE(block);
    std::atomic<bool> go{false};
    auto owner_free = owner.post([&] {
      while (!go.load(std::memory_order_acquire)) {
      }
      return memory->free(*block).has_value();
    });
    go.store(true, std::memory_order_release);
    const bool main_freed = memory->free(*block).has_value();
    const bool owner_freed = owner_free.get();
    both += main_freed && owner_freed;
    neither += !main_freed && !owner_freed;
  }
  CHECK(both == 0);
  CHECK(neither == 0);
  check_ledger(*memory, mock, 0);
  const MemoryStats s = memory->stats();
  CHECK(s.cached_blocks == mock.live_allocation_count());
  CHECK(s.frees == s.allocations);
}

TEST_CASE("per-category peaks stay within the bytes other threads' caches own",
          "[thread_cache][concurrency]") {
  // A producer allocates, a consumer frees (a pipeline). The consumer's frees must not pile up
  // headroom that lifts the producer's next peak: the bound is what the consumer's cache owns.
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(256_MiB));
  Worker consumer;
  const uint64_t size = GENERATE(1_MiB, 8_MiB);  // cached in the consumer's bins / shared pool only
  constexpr int kRounds = 40;
  memory->reset_peaks();
  for (int round = 0; round < kRounds; ++round) {
    const auto block = memory->allocate(MemoryCategory::ndarray, size);
    REQUIRE(block);
    REQUIRE(consumer.run([&] { return memory->free(*block).has_value(); }));
  }
  const uint64_t ndarray_peak = peak(memory->stats(), MemoryCategory::ndarray);
  CHECK(ndarray_peak >= size);             // never below the truth
  CHECK(ndarray_peak <= size + 4_MiB);     // the consumer's cache owns at most 4 MiB of a class
  if (size > 4_MiB) CHECK(ndarray_peak == size);  // nothing in any thread cache: exact
  check_ledger(*memory, mock, 0);
}

TEST_CASE("a thread using two DeviceMemory objects in turn hits both caches lock-free",
          "[thread_cache]") {
  MockDevice mock_a(mock_options(1_GiB)), mock_b(mock_options(1_GiB));
  auto a = make_memory(mock_a, cached(512_MiB));
  auto b = make_memory(mock_b, cached(512_MiB));
  const Pattern one{"", {{MemoryCategory::ndarray, 4_KiB}}};
  (void)lock_free_hits_over(*a, one, 2);
  (void)lock_free_hits_over(*b, one, 2);
  uint64_t hits = 0;
  for (int round = 0; round < 100; ++round)
    hits += lock_free_hits_over(*a, one, 1) + lock_free_hits_over(*b, one, 1);
  CHECK(hits == 200);
}

TEST_CASE("after fork() the child's allocators work on the locked path and never wait",
          "[thread_cache][fork]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(512_MiB));
  Worker worker;  // a cache owned by a thread the child will not have
  REQUIRE(worker.run([&] { return fill_and_free(*memory, kTwelveMiB, 2); }) == 0);
  const Pattern one{"", {{MemoryCategory::ndarray, 4_KiB}}};
  (void)lock_free_hits_over(*memory, one, 2);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    // No Catch in the child: the exit status says what failed.
    const uint64_t hits_before = memory->stats().lock_free_hits;
    for (int i = 0; i < 10; ++i) {
      auto block = memory->allocate(MemoryCategory::ndarray, 4_KiB);
      if (!block || !memory->free(*block)) _exit(1);
    }
    if (memory->stats().lock_free_hits != hits_before) _exit(2);  // the fast path stayed closed
    if (memory->release_cached() < 12_MiB) _exit(3);  // the worker's cache too, without waiting
    if (memory->in_use_bytes() != mock.held_bytes()) _exit(4);
    _exit(0);
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // The parent goes on lock-free.
  CHECK(lock_free_hits_over(*memory, one, 10) == 10);
}

TEST_CASE("two threads that both need the cache evicted both get their memory",
          "[thread_cache][concurrency]") {
  // 15 MiB cached in the shared pool under a 16 MiB limit; two 8 MiB requests at once. The one
  // that finds the eviction already under way must wait for its bytes, not be refused by them.
  constexpr int kRounds = 60;
  int refused = 0;
  for (int round = 0; round < kRounds; ++round) {
    MockDevice mock(mock_options(1_GiB));
    auto memory = make_memory(mock, cached(16_MiB, 0, /*live_check=*/false));
    {
      Worker filler;  // exits: its cache goes to the shared pool
      std::vector<Ask> asks(240, Ask{MemoryCategory::ndarray, 64_KiB});
      REQUIRE(filler.run([&] { return fill_and_free(*memory, asks, 1); }) == 0);
    }
    REQUIRE(memory->stats().cached_bytes == 15_MiB);
    Worker other;
    std::atomic<bool> go{false};
    auto theirs = other.post([&] {
      while (!go.load(std::memory_order_acquire)) {
      }
      return memory->allocate(MemoryCategory::ndarray, 8_MiB);
    });
    go.store(true, std::memory_order_release);
    auto mine = memory->allocate(MemoryCategory::ndarray, 8_MiB);
    auto their_block = theirs.get();
    refused += !mine + !their_block;
    if (mine) REQUIRE(memory->free(*mine));
    if (their_block) REQUIRE(other.run([&] { return memory->free(*their_block).has_value(); }));
  }
  CHECK(refused == 0);
}

TEST_CASE("charge and allocate refuse what is no category and change nothing", "[thread_cache]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(512_MiB));
  (void)lock_free_hits_over(*memory, Pattern{"", {{MemoryCategory::ndarray, 4_KiB}}}, 3);
  const MemoryStats before = memory->stats();
  const uint64_t requests = memory->fault_plan().allocation_count();
  for (const auto category : {MemoryCategory::pool_cache, static_cast<MemoryCategory>(7),
                              static_cast<MemoryCategory>(255)}) {
    auto charged_bytes = memory->charge(category, 4096);
    REQUIRE_FALSE(charged_bytes);
    CHECK(charged_bytes.error().result == RhiResult::invalid_usage);
    memory->uncharge(category, 4096);  // ignored
  }
  for (const auto category : {MemoryCategory::pool_cache, static_cast<MemoryCategory>(7)}) {
    auto block = memory->allocate(category, 4096);  // the fast path must refuse it too
    REQUIRE_FALSE(block);
    CHECK(block.error().result == RhiResult::invalid_usage);
  }
  const MemoryStats after = memory->stats();
  CHECK(memory->in_use_bytes() == before.ledger.current_total_bytes());
  CHECK(after.ledger.current_bytes == before.ledger.current_bytes);
  CHECK(after.ledger.peak_bytes == before.ledger.peak_bytes);
  CHECK(after.lock_free_hits == before.lock_free_hits);
  CHECK(memory->fault_plan().allocation_count() == requests);
  check_ledger(*memory, mock, 0);
}

TEST_CASE("one thread whose frees overflow into the shared pool keeps exact peaks",
          "[thread_cache]") {
  // 4 MiB blocks: a thread cache's bin holds one, the second freed goes to the shared pool. Each
  // round holds two blocks, then caches both: every peak stays at what one round holds.
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(64_MiB));
  const Pattern two{"", {{MemoryCategory::ndarray, 4_MiB}, {MemoryCategory::ndarray, 4_MiB}}};
  (void)lock_free_hits_over(*memory, two, 20);
  const MemoryStats s = memory->stats();
  CHECK(peak(s, MemoryCategory::ndarray) == 8_MiB);
  CHECK(peak(s, MemoryCategory::pool_cache) == 8_MiB);
  CHECK(s.ledger.peak_total_bytes == 8_MiB);
  check_ledger(*memory, mock, 0);
}

// A thread's cache outlives the thread: it is emptied, its ledger share and counts are folded
// into the allocator's, and the next new thread takes it. Nothing may be counted twice.
TEST_CASE("threads that come and go take over retired caches with nothing counted twice",
          "[thread_cache][concurrency]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  const std::array<Ask, 3> asks{{{MemoryCategory::ndarray, 4_KiB},
                                 {MemoryCategory::staging, 4_KiB},
                                 {MemoryCategory::ndarray, 4_KiB}}};
  constexpr int kThreads = 20;
  for (int t = 0; t < kThreads; ++t) {
    // Round 1 grows (first thread) or takes the shared pool's blocks; round 2 hits lock-free.
    Worker w;
    REQUIRE(w.run([&] { return fill_and_free(*memory, asks, 2); }) == 0);
    w.stop();
    const MemoryStats s = memory->stats();
    CAPTURE(t);
    const uint64_t done = static_cast<uint64_t>(t + 1);
    CHECK(s.allocations == done * 2 * asks.size());
    CHECK(s.frees == done * 2 * asks.size());
    CHECK(s.cache_hits == done * 2 * asks.size() - asks.size());
    CHECK(s.lock_free_hits == done * asks.size());
    CHECK(s.cached_blocks == asks.size());
    CHECK(mock.driver_allocation_count() == asks.size());
    check_ledger(*memory, mock, 0);
  }
  const MemoryStats s = memory->stats();
  CHECK(s.ledger.peak_bytes[idx(MemoryCategory::ndarray)] == 8_KiB);
  CHECK(s.ledger.peak_bytes[idx(MemoryCategory::staging)] == 4_KiB);
  CHECK(s.ledger.peak_total_bytes == 12_KiB);
}

// in_use_by_category() reads the ledger view without the lock while threads allocate, free, exit
// and hand their caches on. Every reading must add up to what is held: no cache's share is read
// half-way through a move, and no locked operation is seen half done.
TEST_CASE("the ledger view read without a lock while threads come and go stays within the held bytes",
          "[thread_cache][concurrency]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(100_MiB));
  constexpr uint64_t kBlock = 4_KiB;
  constexpr int kChurners = 2;
  // Seven small blocks go through the thread caches (lock-free), the 8 MiB one through the
  // shared pool (the locked path, which moves a cache's share in two steps).
  const std::array<Ask, 8> asks{{{MemoryCategory::ndarray, kBlock}, {MemoryCategory::ndarray, kBlock},
                                 {MemoryCategory::staging, kBlock}, {MemoryCategory::ndarray, kBlock},
                                 {MemoryCategory::staging, kBlock}, {MemoryCategory::ndarray, kBlock},
                                 {MemoryCategory::ndarray, kBlock}, {MemoryCategory::staging, 8_MiB}}};
  // Every block the churners will ever hold at once is grown first, on a thread whose exit hands
  // them to the shared pool: afterwards nothing grows, so the held bytes stay put.
  {
    std::array<Ask, 2 * asks.size()> all{};
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = asks[i % asks.size()];
    Worker warm;
    REQUIRE(warm.run([&] { return fill_and_free(*memory, all, 1); }) == 0);
  }
  const uint64_t held = memory->in_use_bytes();
  const uint64_t driver_calls = mock.driver_allocation_count();
  std::atomic<int> finished{0}, failures{0};
  std::vector<std::thread> churners;
  for (int c = 0; c < kChurners; ++c)
    churners.emplace_back([&] {
      for (int generation = 0; generation < stress_rounds(1000); ++generation)
        std::thread([&] { failures += fill_and_free(*memory, asks, 20); }).join();
      ++finished;
    });
  uint64_t readings = 0, out_of_bounds = 0;
  while (finished.load() < kChurners) {
    const auto view = memory->in_use_by_category();
    uint64_t sum = 0;
    for (const uint64_t bytes : view) sum += bytes;
    // Every cache's share is read whole, and caches change only their own share between locked
    // operations: the categories add up to what is held.
    if (sum != held) ++out_of_bounds;
    ++readings;
  }
  for (std::thread &t : churners) t.join();
  CHECK(failures == 0);
  CHECK(mock.driver_allocation_count() == driver_calls);
  CHECK(readings > 0);
  CHECK(out_of_bounds == 0);
  check_ledger(*memory, mock, 0);
}

// Cached bytes never cause a refusal on their own, even while other threads keep growing and
// caching again right after an eviction made room: the refused thread evicts and retries for a
// few rounds (DeviceMemory::kEvictionRounds), not once. Live bytes here never pass the limit.
TEST_CASE("a refusal evicts again while other threads re-cache the room an eviction made",
          "[thread_cache]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(24_MiB, 0, /*live_check=*/false));
  std::atomic<bool> stop{false};
  std::atomic<int> refusals{0};
  std::vector<std::thread> threads;
  // Three chains of short-lived threads, at most 4 MiB live each; their caches keep what they free.
  for (int c = 0; c < 3; ++c)
    threads.emplace_back([&] {
      while (!stop.load())
        std::thread([&] {
          const std::array<Ask, 4> asks{{{MemoryCategory::ndarray, 1_MiB},
                                         {MemoryCategory::staging, 1_MiB},
                                         {MemoryCategory::ndarray, 1_MiB},
                                         {MemoryCategory::staging, 1_MiB}}};
          for (int round = 0; round < 200 && !stop.load(); ++round)
            refusals += fill_and_free(*memory, asks, 1);
        }).join();
    });
  threads.emplace_back([&] {  // and a poller of the ledger view
    while (!stop.load()) (void)memory->in_use_by_category();
  });
  // This thread: up to 12 MiB live, so live bytes stay within the 24 MiB limit.
  constexpr std::array<uint64_t, 3> kSizes{8_MiB, 10_MiB, 12_MiB};
  for (int i = 0; i < stress_rounds(100000); ++i) {
    auto a = memory->allocate(MemoryCategory::ndarray, kSizes[i % kSizes.size()]);
    if (!a) {
      ++refusals;
      continue;
    }
    REQUIRE(memory->free(*a));
  }
  stop = true;
  for (std::thread &t : threads) t.join();
  CHECK(refusals == 0);
  CHECK(memory->in_use_bytes() == mock.held_bytes());
  CHECK(mock.driver_oom_count() == 0);
}

// The live check and the driver call are one step per growing thread: two threads can no longer
// both fit in the same free memory and leave the driver to refuse one of them.
TEST_CASE("threads growing at once against live free memory never reach a driver refusal",
          "[thread_cache][concurrency]") {
  MockDevice mock(mock_options(64_MiB));
  BudgetConfig config = cached(1_GiB);  // the budget never refuses: free memory does
  config.caching = false;               // every allocation grows
  auto created = DeviceMemory::create(mock, config);
  REQUIRE(created);
  auto &memory = *created;
  std::atomic<int> driver_refusals{0}, other_failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&, t] {
      constexpr std::array<uint64_t, 3> kSizes{12_MiB, 16_MiB, 20_MiB};
      std::vector<DeviceAllocation> held;
      for (int i = 0; i < stress_rounds(100000); ++i) {
        auto a = memory->allocate(MemoryCategory::ndarray, kSizes[(i + t) % kSizes.size()]);
        if (a) held.push_back(*a);
        else if (a.error().oom_source == OomSource::driver) ++driver_refusals;
        else if (a.error().oom_source != OomSource::budget) ++other_failures;
        if (held.size() == 2 || !a) {
          for (const DeviceAllocation &b : held) other_failures += !memory->free(b);
          held.clear();
        }
      }
      for (const DeviceAllocation &b : held) other_failures += !memory->free(b);
    });
  for (std::thread &t : threads) t.join();
  CHECK(driver_refusals == 0);
  CHECK(other_failures == 0);
  CHECK(mock.driver_oom_count() == 0);
  memory->release_cached();
  CHECK(memory->in_use_bytes() == 0);
  CHECK(mock.held_bytes() == 0);
}

// stats() counts the refusals a caller gets, not the budget's answers that a retry cured.
TEST_CASE("refusals that eviction or an observer cured are not counted as refusals",
          "[thread_cache]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(16_MiB));
  // 12 MiB cached (8 MiB blocks have no thread-cache bin: the shared pool keeps them).
  auto a = memory->allocate(MemoryCategory::ndarray, 12_MiB);
  REQUIRE(a);
  REQUIRE(memory->free(*a));
  REQUIRE(memory->stats().cached_bytes == 12_MiB);

  // 8 MiB fits once the cache is evicted: one retry, no refusal.
  auto cured = memory->allocate(MemoryCategory::staging, 8_MiB);
  REQUIRE(cured);
  MemoryStats s = memory->stats();
  CHECK(s.retries == 1);
  CHECK(s.ledger.refusals == 0);

  // An observer that frees the 8 MiB: the 12 MiB request then fits on its retry.
  std::optional<DeviceAllocation> held = *cured;
  const uint64_t id = memory->add_oom_observer([&](const kiln::Failure &) {
    if (held) CHECK(memory->free(*std::exchange(held, std::nullopt)));
  });
  auto blocked = memory->charge(MemoryCategory::code_object, 4_MiB);  // 12 MiB held now
  REQUIRE(blocked);
  auto after_observer = memory->allocate(MemoryCategory::ndarray, 12_MiB);
  REQUIRE(after_observer);
  s = memory->stats();
  CHECK(s.ledger.refusals == 0);

  // A refusal the caller gets is counted once.
  REQUIRE(memory->remove_oom_observer(id));
  auto refused = memory->allocate(MemoryCategory::ndarray, 8_MiB);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().oom_source == OomSource::budget);
  CHECK(memory->stats().ledger.refusals == 1);
  CHECK(memory->stats().live_refusals == 0);
  REQUIRE(memory->free(*after_observer));
  memory->uncharge(MemoryCategory::code_object, 4_MiB);
}
