// Harnesses of the thread-cache tests (test_thread_cache_*.cpp): the mock and caching memory most
// begin with (CachedMemoryOnMock), a Worker thread that runs jobs in
// order (steps ordered across threads without sleeps), allocate-and-free rounds, and the checks
// that the ledger is exact and that a cache still works after another thread evicted it.
#ifndef KILN_THREAD_CACHE_TEST_SUPPORT_H_
#define KILN_THREAD_CACHE_TEST_SUPPORT_H_

#include <catch2/catch.hpp>

#include <algorithm>
#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <utility>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

namespace kiln::test::memory {

inline constexpr std::size_t idx(MemoryCategory category) { return static_cast<std::size_t>(category); }
inline constexpr std::size_t kPool = idx(MemoryCategory::pool_cache);

inline uint64_t peak(const runtime::MemoryStats &stats, MemoryCategory category) {
  return stats.ledger.peak_bytes[idx(category)];
}

// How most thread-cache tests begin (TEST_CASE_METHOD): a 1 GiB mock and a DeviceMemory over it
// with caching on and a limit of `kLimitBytes`. Members `mock` and `memory`, as a test names them.
template <uint64_t kLimitBytes>
struct CachedMemoryOnMock {
  MockDevice mock{mock_options(1_GiB)};
  std::unique_ptr<runtime::DeviceMemory> memory = make_memory(mock, cached(kLimitBytes));
};

// With no operation in flight: the categories add up to the total, the total is what the driver
// holds, pool_cache is what the pools hold, and the driver holds `live_blocks` + the cached ones.
inline void check_ledger(runtime::DeviceMemory &memory, MockDevice &mock, uint64_t live_blocks) {
  const auto by_category = memory.in_use_by_category();
  uint64_t sum = 0;
  for (const uint64_t bytes : by_category) sum += bytes;
  const runtime::MemoryStats s = memory.stats();
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
inline int fill_and_free(runtime::DeviceMemory &memory, std::span<const Ask> asks, int rounds,
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

inline bool contains(const std::vector<uint64_t> &ids, uint64_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// 12 MiB in 7 blocks, each class within a thread cache's bin depth (1 MiB: 4, 2 MiB: 2, 4 MiB: 1),
// so all of it stays in the freeing thread's own cache.
inline constexpr std::array<Ask, 7> kTwelveMiB{{{MemoryCategory::ndarray, 1_MiB},
                                         {MemoryCategory::ndarray, 1_MiB},
                                         {MemoryCategory::staging, 1_MiB},
                                         {MemoryCategory::staging, 1_MiB},
                                         {MemoryCategory::ndarray, 2_MiB},
                                         {MemoryCategory::argument_buffer, 2_MiB},
                                         {MemoryCategory::ndarray, 4_MiB}}};

// After another thread emptied its cache: the worker still allocates, frees into its cache and
// hits it again, and a second free of a freed block is refused.
inline void check_worker_cache_works(Worker &worker, runtime::DeviceMemory &memory, MockDevice &mock) {
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

// The start of an eviction test: kTwelveMiB allocated and freed twice on `worker`, so its 7 blocks
// stay in the worker's cache.
inline void cache_twelve_mib(Worker &worker, runtime::DeviceMemory &memory) {
  REQUIRE(worker.run([&] { return fill_and_free(memory, kTwelveMiB, 2); }) == 0);
}

// After the request that needed the memory: the worker's 7 cached blocks were evicted, in one retry.
inline void check_worker_cache_evicted(runtime::DeviceMemory &memory) {
  CHECK(memory.stats().evictions == 7);
  CHECK(memory.stats().retries == 1);
  CHECK(memory.stats().cached_bytes == 0);
}

// The end of an eviction test: the evicted worker's cache still works, and once `big` is freed
// and the caches released the device holds nothing.
inline void after_eviction(Worker &worker, runtime::DeviceMemory &memory, MockDevice &mock, DeviceAllocation big) {
  check_worker_cache_works(worker, memory, mock);
  check_ledger(memory, mock, 1);
  REQUIRE(memory.free(big));
  memory.release_cached();
  CHECK(mock.held_bytes() == 0);
  CHECK(memory.in_use_bytes() == 0);
}


struct Pattern {
  const char *name;
  std::vector<std::pair<MemoryCategory, uint64_t>> held_together;  // allocated, then all freed
};

// Runs `rounds` rounds of `pattern` (allocate every member, then free them all); returns the
// lock-free hits those rounds got.
inline uint64_t lock_free_hits_over(runtime::DeviceMemory &memory, const Pattern &pattern, int rounds) {
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

}  // namespace kiln::test::memory

#endif  // KILN_THREAD_CACHE_TEST_SUPPORT_H_
