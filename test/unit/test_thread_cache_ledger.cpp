// The ledger under threads with caches: threads trading blocks under a small budget leave it exact,
// and the lock-free ledger view read while threads come and go stays within the held bytes.
#include <catch2/catch.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
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
        tally(a, held, granted, refused, wrong_failures);
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

// in_use_by_category() reads the ledger view without the lock while threads allocate, free, exit
// and hand their caches on. Every reading must add up to what is held: no cache's share is read
// half-way through a move, and no locked operation is seen half done.
TEST_CASE_METHOD(CachedMemoryOnMock<100_MiB>,
                 "the ledger view read without a lock while threads come and go stays within the held bytes",
                 "[thread_cache][concurrency]") {
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
