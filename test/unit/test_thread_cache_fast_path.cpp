// What the lock-free path of the thread caches covers: after one warm-up round every reuse pattern
// of one thread is a lock-free hit (on two DeviceMemory objects in turn too), charge and allocate refuse what is no category, and after
// fork() the child's allocators work on the locked path and never wait.
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

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

// What the lock-free path covers: after one warm-up round, every reuse pattern of one thread is
// served lock-free (stats().lock_free_hits), not just one block of one category at a time.

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

TEST_CASE_METHOD(CachedMemoryOnMock<512_MiB>,
                 "charge and allocate refuse what is no category and change nothing", "[thread_cache]") {
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

TEST_CASE_METHOD(CachedMemoryOnMock<512_MiB>,
                 "after fork() the child's allocators work on the locked path and never wait",
                 "[thread_cache][fork]") {
  Worker worker;  // a cache owned by a thread the child will not have
  cache_twelve_mib(worker, *memory);
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
