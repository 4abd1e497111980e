// Per-category peaks with thread caches: exact on one thread (through cache hits, reset_peaks and
// overflow into the shared pool), never below the truth while threads hit their own caches, and
// within the bytes other threads' caches own.
#include <catch2/catch.hpp>

#include <array>
#include <cstdint>
#include <future>
#include <latch>
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

TEST_CASE_METHOD(CachedMemoryOnMock<100_MiB>,
                 "per-category peaks are exact on one thread, through cache hits and reset_peaks",
                 "[thread_cache]") {
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

TEST_CASE_METHOD(CachedMemoryOnMock<64_MiB>,
                 "per-category peaks are never below the truth while threads hit their own caches",
                 "[thread_cache][concurrency]") {
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

TEST_CASE_METHOD(CachedMemoryOnMock<256_MiB>,
                 "per-category peaks stay within the bytes other threads' caches own",
                 "[thread_cache][concurrency]") {
  // A producer allocates, a consumer frees (a pipeline). The consumer's frees must not pile up
  // headroom that lifts the producer's next peak: the bound is what the consumer's cache owns.
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

TEST_CASE_METHOD(CachedMemoryOnMock<64_MiB>,
                 "one thread whose frees overflow into the shared pool keeps exact peaks",
                 "[thread_cache]") {
  // 4 MiB blocks: a thread cache's bin holds one, the second freed goes to the shared pool. Each
  // round holds two blocks, then caches both: every peak stays at what one round holds.
  const Pattern two{"", {{MemoryCategory::ndarray, 4_MiB}, {MemoryCategory::ndarray, 4_MiB}}};
  (void)lock_free_hits_over(*memory, two, 20);
  const MemoryStats s = memory->stats();
  CHECK(peak(s, MemoryCategory::ndarray) == 8_MiB);
  CHECK(peak(s, MemoryCategory::pool_cache) == 8_MiB);
  CHECK(s.ledger.peak_total_bytes == 8_MiB);
  check_ledger(*memory, mock, 0);
}
