// kiln-memory-bench: the cost of kiln's memory layer (runtime/memory: DeviceMemory, its budget,
// ledger and caching pool) beside baselines measured in the same run on the same machine.
//
// What is measured (one timed iteration each; no byte of the memory is ever touched):
//   baseline_malloc/<size>       glibc malloc(size) + free. The baseline for the pool.
//   pool_hit/<size>              DeviceMemory::allocate(size) + free with caching on and the block
//                                already cached (warmed before timing): no driver call, no live
//                                check. Up to 4 MiB the block comes from this thread's cache (no
//                                lock); 64 MiB comes from the shared pool (the locked path). Mock
//                                device. Each size has its own DeviceMemory.
//   budget_refusal               DeviceMemory::allocate of more than the limit, refused by the
//                                budget (out_of_memory, oom_source budget), failure detail built
//                                and annotated as a caller gets it. Mock device, empty pool. Its
//                                baseline is pool_hit/4KiB.
//   live_query/<device>          one LlvmDevice::memory_info() call: the device's own share of a live
//                                check (mock: a counter and its script; cpu: a reading reused within
//                                one kernel tick, dated by CLOCK_MONOTONIC_COARSE).
//   grow/<device>/live_<on|off>  DeviceMemory::allocate(4 KiB) + free with caching off, so every
//                                allocation grows: reserve, [live check], driver allocation, and
//                                the free gives it back. live_on asks the device's free memory on
//                                each growth; live_off does not.
// Sizes: 64 B, 4 KiB, 256 KiB, 4 MiB, 64 MiB (the pool rounds 64 B up to its 512 B class; the
// other sizes are whole classes).
//
// The summary printed after the table gives, from the real time per iteration (the median of the
// repetitions where a case has them: the growth cases run 5 times):
//   pool hit / malloc per size          target <= 1.0x
//   budget refusal / pool hit (4 KiB)   target <= 2.0x (and, for scale, against the 64 MiB hit,
//                                       which takes the locked path as every hit once did)
//   live on / live off throughput       target >= 0.97x, with the device's own query time beside it
//                                       (on cpu that alone is ~5% of a growth: a clock read per
//                                       query bounds the reading's age).
// Ratios are printed, never asserted: nothing here fails on a number.
//
// Usage: kiln-memory-bench [Google Benchmark flags]. Each case runs for --benchmark_min_time
// seconds (default here 0.2). --benchmark_filter, --benchmark_repetitions
// (the summary uses the median), --benchmark_out etc. pass through; with a --benchmark_format other
// than console the table is printed in that format and the summary is left out.
// Exit status: 0, 1 when a device or its memory cannot be set up, 2 on an unrecognized argument.
#include <benchmark/benchmark.h>

#include "bench_main.h"
#include "summary_reporter.h"
#include <fmt/core.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/rhi/cpu_device.h"
#include "kiln/rhi/mock_device.h"
#include "kiln/runtime/memory/device_memory.h"

namespace {

using kiln::bench::SummaryReporter;

using kiln::MemoryCategory;
using kiln::runtime::BudgetConfig;
using kiln::runtime::DeviceMemory;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
constexpr uint64_t kGiB = 1024 * kMiB;
constexpr uint64_t kSizesBytes[] = {64, 4 * kKiB, 256 * kKiB, 4 * kMiB, 64 * kMiB};
constexpr uint64_t kGrowBytes = 4 * kKiB;
constexpr uint64_t kRefusalBaselineBytes = 4 * kKiB;
constexpr uint64_t kLockedHitBytes = 64 * kMiB;  // above the thread caches' classes
constexpr uint64_t kThreadCacheMaxBytes = 4 * kMiB;  // DeviceMemory's per-thread caches keep up to this
constexpr const char *kDefaultMinTime = "--benchmark_min_time=0.2";
constexpr int kGrowRepetitions = 5;

std::string size_label(uint64_t size_bytes) {
  if (size_bytes >= kMiB && size_bytes % kMiB == 0) return std::to_string(size_bytes / kMiB) + "MiB";
  if (size_bytes >= kKiB && size_bytes % kKiB == 0) return std::to_string(size_bytes / kKiB) + "KiB";
  return std::to_string(size_bytes) + "B";
}

// The devices and allocators of the run, made in main before any case runs.
struct Fixture {
  // A mock with room for every case; its memory is host memory that nothing touches.
  std::unique_ptr<kiln::MockDevice> mock;
  std::unique_ptr<kiln::CpuDevice> cpu;
  std::map<uint64_t, std::unique_ptr<DeviceMemory>> pool;  // per size: caching on, warm
  std::unique_ptr<DeviceMemory> refusing;                  // limit 1 GiB, empty pool
  std::unique_ptr<DeviceMemory> grow_mock_on, grow_mock_off, grow_cpu_on, grow_cpu_off;
};
Fixture *g_fixture = nullptr;

kiln::RhiExpected<std::unique_ptr<DeviceMemory>> make_memory(kiln::LlvmDevice &device,
                                                              uint64_t limit_bytes, bool caching,
                                                              bool live_check) {
  BudgetConfig config;
  config.limit_bytes = limit_bytes;
  config.reserve_bytes = 0;
  config.caching = caching;
  config.live_check = live_check;
  return DeviceMemory::create(device, config);
}

kiln::RhiStatus set_up(Fixture &f) {
  kiln::MockDeviceOptions options;
  options.capacity_bytes = 1024 * kGiB;
  f.mock = std::make_unique<kiln::MockDevice>(options);
  f.cpu = std::make_unique<kiln::CpuDevice>();
  for (const uint64_t size : kSizesBytes) {
    KILN_ASSIGN_OR_RETURN(auto memory, make_memory(*f.mock, 512 * kGiB, true, true));
    // Warm: one miss puts the block in the pool; every timed allocation is then a hit.
    KILN_ASSIGN_OR_RETURN(auto block, memory->allocate(MemoryCategory::ndarray, size));
    KILN_RETURN_IF_ERROR(memory->free(block));
    f.pool.emplace(size, std::move(memory));
  }
  KILN_ASSIGN_OR_RETURN(f.refusing, make_memory(*f.mock, kGiB, true, true));
  KILN_ASSIGN_OR_RETURN(f.grow_mock_on, make_memory(*f.mock, 512 * kGiB, false, true));
  KILN_ASSIGN_OR_RETURN(f.grow_mock_off, make_memory(*f.mock, 512 * kGiB, false, false));
  KILN_ASSIGN_OR_RETURN(f.grow_cpu_on, make_memory(*f.cpu, 512 * kGiB, false, true));
  KILN_ASSIGN_OR_RETURN(f.grow_cpu_off, make_memory(*f.cpu, 512 * kGiB, false, false));
  return {};
}

// ---------------------------------------------------------------------------------------------

void bench_malloc(benchmark::State &state, uint64_t size_bytes) {
  for (auto _ : state) {
    void *p = std::malloc(size_bytes);
    benchmark::DoNotOptimize(p);
    if (p == nullptr) {
      state.SkipWithError("malloc returned null");
      break;
    }
    std::free(p);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

// allocate + free through `memory`; any failure stops the case with the failure's message.
void alloc_free_loop(benchmark::State &state, DeviceMemory &memory, uint64_t size_bytes) {
  for (auto _ : state) {
    auto a = memory.allocate(MemoryCategory::ndarray, size_bytes);
    if (!a) {
      state.SkipWithError(a.error().message().c_str());
      break;
    }
    benchmark::DoNotOptimize(a->alloc_id);
    if (auto freed = memory.free(*a); !freed) {
      state.SkipWithError(freed.error().message().c_str());
      break;
    }
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

void bench_pool_hit(benchmark::State &state, uint64_t size_bytes) {
  DeviceMemory &memory = *g_fixture->pool.at(size_bytes);
  // One untimed round trip binds this thread's cache of this DeviceMemory (the previous case
  // used another one) and takes the locked path once.
  if (auto a = memory.allocate(MemoryCategory::ndarray, size_bytes); !a || !memory.free(*a)) {
    state.SkipWithError("the warm-up round trip failed");
    return;
  }
  const kiln::runtime::MemoryStats before = memory.stats();
  alloc_free_loop(state, memory, size_bytes);
  // Every timed allocation must have been a hit (lock-free up to the thread caches' largest
  // class), else this measured something else.
  const kiln::runtime::MemoryStats after = memory.stats();
  const auto iterations = static_cast<uint64_t>(state.iterations());
  if (!state.error_occurred() && after.cache_hits - before.cache_hits != iterations)
    state.SkipWithError("an allocation was not a cache hit");
  else if (!state.error_occurred() && size_bytes <= kThreadCacheMaxBytes &&
           after.lock_free_hits - before.lock_free_hits != iterations)
    state.SkipWithError("a hit took the locked path");
}

void bench_budget_refusal(benchmark::State &state) {
  DeviceMemory &memory = *g_fixture->refusing;
  const uint64_t request = 2 * memory.limit_bytes();
  for (auto _ : state) {
    auto a = memory.allocate(MemoryCategory::ndarray, request);
    if (a || a.error().oom_source != kiln::OomSource::budget) {
      state.SkipWithError("the request was not refused by the budget");
      break;
    }
    benchmark::DoNotOptimize(a.error().requested_bytes);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

void bench_live_query(benchmark::State &state, kiln::LlvmDevice *device) {
  for (auto _ : state) {
    auto info = device->memory_info();
    if (!info) {
      state.SkipWithError(info.error().message().c_str());
      break;
    }
    benchmark::DoNotOptimize(info->free_bytes);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}

void bench_grow(benchmark::State &state, DeviceMemory *memory) {
  alloc_free_loop(state, *memory, kGrowBytes);
}

// ---------------------------------------------------------------------------------------------
std::string malloc_name(uint64_t size) { return "baseline_malloc/" + size_label(size); }
std::string pool_name(uint64_t size) { return "pool_hit/" + size_label(size); }
std::string grow_name(std::string_view device, bool live) {
  return fmt::format("grow/{}/live_{}", device, live ? "on" : "off");
}

std::string ns(double seconds) {
  return seconds < 0 ? std::string("n/a") : fmt::format("{:.1f} ns", seconds * 1e9);
}
// a / b with a verdict against the target; "n/a" when either case did not run.
std::string ratio(double a, double b, double target, bool at_most) {
  if (a <= 0 || b <= 0) return "n/a";
  const double r = a / b;
  const bool met = at_most ? r <= target : r >= target;
  return fmt::format("{:.2f}x (target {} {:.2f}x: {})", r, at_most ? "<=" : ">=", target,
                     met ? "met" : "MISSED");
}

void print_summary(const SummaryReporter &reporter) {
  fmt::print("\nSummary (real time per iteration, median of repetitions; ratios printed, never "
             "asserted):\n");
  fmt::print("  pool hit alloc+free vs glibc malloc+free (ratio = pool / malloc):\n");
  for (const uint64_t size : kSizesBytes) {
    const double pool = reporter.seconds(pool_name(size));
    const double base = reporter.seconds(malloc_name(size));
    fmt::print("    {:>6}: pool {:>10}, malloc {:>10}, ratio {}\n", size_label(size), ns(pool),
               ns(base), ratio(pool, base, 1.0, true));
  }
  const double refusal = reporter.seconds("budget_refusal");
  const double hit = reporter.seconds(pool_name(kRefusalBaselineBytes));
  fmt::print("  budget refusal vs pool hit {} (ratio = refusal / hit): refusal {}, hit {}, ratio {}\n",
             size_label(kRefusalBaselineBytes), ns(refusal), ns(hit), ratio(refusal, hit, 2.0, true));
  // For scale: the same target against a hit that takes the locked path (no thread-cache class).
  const double locked_hit = reporter.seconds(pool_name(kLockedHitBytes));
  fmt::print("    for scale, vs a locked-path pool hit ({}): hit {}, ratio {}\n",
             size_label(kLockedHitBytes), ns(locked_hit), ratio(refusal, locked_hit, 2.0, true));
  for (const std::string_view device : {"mock", "cpu"}) {
    const double on = reporter.seconds(grow_name(device, true));
    const double off = reporter.seconds(grow_name(device, false));
    // Throughput ratio on / off = time off / time on.
    fmt::print("  growth {} alloc+free, live check on vs off (throughput on / off): on {}, off {}, "
               "ratio {}; of the difference, the device's own query takes {}\n",
               device, ns(on), ns(off), ratio(off, on, 0.97, false),
               ns(reporter.seconds(fmt::format("live_query/{}", device))));
  }
  std::fflush(stdout);
}

void register_benchmarks() {
  for (const uint64_t size : kSizesBytes) {
    benchmark::RegisterBenchmark(malloc_name(size).c_str(), bench_malloc, size)->UseRealTime();
    benchmark::RegisterBenchmark(pool_name(size).c_str(), bench_pool_hit, size)->UseRealTime();
  }
  benchmark::RegisterBenchmark("budget_refusal", bench_budget_refusal)->UseRealTime();
  benchmark::RegisterBenchmark("live_query/mock", bench_live_query, g_fixture->mock.get())
      ->UseRealTime();
  benchmark::RegisterBenchmark("live_query/cpu", bench_live_query, g_fixture->cpu.get())
      ->UseRealTime();
  // Growth goes through glibc inside the host-memory devices (malloc_consolidate is a quarter of
  // it), which moves by +-5% from run to run: the on/off ratio compares medians of repetitions.
  for (const std::string_view device : {"mock", "cpu"})
    for (const bool live : {false, true}) {
      const bool mock = device == "mock";
      DeviceMemory *memory = mock ? (live ? g_fixture->grow_mock_on.get() : g_fixture->grow_mock_off.get())
                                  : (live ? g_fixture->grow_cpu_on.get() : g_fixture->grow_cpu_off.get());
      benchmark::RegisterBenchmark(grow_name(device, live).c_str(), bench_grow, memory)
          ->UseRealTime()
          ->Repetitions(kGrowRepetitions)
          ->ReportAggregatesOnly(true);
    }
}

}  // namespace

int main(int argc, char **argv) {
  const std::optional<bool> initialized = kiln::bench::initialize(argc, argv, kDefaultMinTime);
  if (!initialized) return 2;
  const bool console_format = *initialized;

  Fixture fixture;
  if (auto ready = set_up(fixture); !ready) {
    std::fprintf(stderr, "kiln-memory-bench: could not set up: %s\n", ready.error().message().c_str());
    return 1;
  }
  g_fixture = &fixture;

  register_benchmarks();
  kiln::bench::run_benchmarks(console_format, "median",
                              [](const SummaryReporter &reporter) { print_summary(reporter); });

  // The allocators go before their devices (they give everything back on destruction).
  fixture.pool.clear();
  fixture.refusing.reset();
  fixture.grow_mock_on.reset();
  fixture.grow_mock_off.reset();
  fixture.grow_cpu_on.reset();
  fixture.grow_cpu_off.reset();
  g_fixture = nullptr;
  return 0;
}
