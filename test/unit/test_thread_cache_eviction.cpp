// Another live thread's cache is evicted under pressure: its cached bytes never cause a budget,
// live-check or driver refusal, the evicted cache still works, two threads that both need an
// eviction both get their memory, and a refusal evicts again while other threads re-cache.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/caching_pool.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"
#include "thread_cache_test_support.h"

using kiln::runtime::CachingPool;
using namespace kiln::test::memory;

TEST_CASE_METHOD(CachedMemoryOnMock<16_MiB>,
                 "another live thread's cached bytes never cause a budget refusal, its cache still works",
                 "[thread_cache][concurrency]") {
  Worker a;  // stays alive, parked, until the end
  cache_twelve_mib(a, *memory);
  REQUIRE(memory->stats().cached_bytes == 12_MiB);
  REQUIRE(memory->stats().cached_blocks == 7);
  check_ledger(*memory, mock, 0);

  // 8 MiB fits in 16 MiB only once A's 12 MiB are gone.
  auto big = memory->allocate(MemoryCategory::ndarray, 8_MiB);
  REQUIRE(big);
  check_worker_cache_evicted(*memory);
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
  cache_twelve_mib(a, *memory);
  REQUIRE(memory->stats().cached_bytes == 12_MiB);
  mock.set_other_process_bytes(36_MiB);  // free 16 MiB, usable 8 MiB
  const uint64_t live_checks = memory->stats().live_checks;

  auto big = memory->allocate(MemoryCategory::ndarray, 12_MiB);
  REQUIRE(big);
  CHECK(memory->stats().live_checks == live_checks + 2);  // refused, evicted, asked again
  CHECK(memory->stats().live_refusals == 0);
  check_worker_cache_evicted(*memory);
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
  cache_twelve_mib(a, *memory);
  REQUIRE(mock.held_bytes() == 12_MiB);

  auto big = memory->allocate(MemoryCategory::ndarray, 8_MiB);
  REQUIRE(big);
  CHECK(mock.driver_oom_count() == 1);
  CHECK(memory->stats().driver_ooms == 1);
  check_worker_cache_evicted(*memory);
  CHECK(mock.held_bytes() == 8_MiB);
  check_ledger(*memory, mock, 1);

  after_eviction(a, *memory, mock, *big);
}

TEST_CASE_METHOD(CachedMemoryOnMock<256_MiB>,
                 "a thread's cache emptied over and over while its owner allocates and frees stays exact",
                 "[thread_cache][concurrency]") {
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
