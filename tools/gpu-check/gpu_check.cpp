// kiln-gpu-check: the checks that need a real GPU, run by scripts/gpu-check.sh on a machine with
// an NVIDIA driver. Writes "key: value" lines to stdout and to the results file argv[1]. One
// binary (LLVM is linked into it once) so the carried bundle stays under 64 MiB.
//
//  0. the kiln-ops suite on cuda, one verdict line per case and the summary;
//  1. the seed scenario: one ndarray larger than the device's memory is DeviceOutOfMemoryError
//     when the driver decides (budget above the device, live check off) and BudgetExceededError
//     under the default budget; a small ndarray works right after either;
//  2. 1 GiB ndarrays allocated until refused end in a typed out-of-memory error; after freeing
//     them all the device works and the ledger holds only the executor's own set-up;
//  3. a pool-hit alloc+free against cuMemAlloc_v2+cuMemFree_v2 (the device's own allocation),
//     and axpy's bandwidth on 256 MiB f32 arrays.
// Exit status: 0 when every check behaved as described, 1 otherwise, 2 on bad usage.
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "kiln/executor/errors.h"
#include "kiln/executor/executor.h"
#include "kiln/rhi/gpu_device.h"
#include "suite.h"

namespace {

using namespace kiln;
using Clock = std::chrono::steady_clock;

struct Report {
  std::FILE *file = nullptr;
  int failures = 0;
  template <class... A>
  void line(fmt::format_string<A...> f, A &&...args) {
    const std::string text = fmt::format(f, std::forward<A>(args)...);
    fmt::print("{}\n", text);
    if (file != nullptr) fmt::print(file, "{}\n", text);
    if (file != nullptr) std::fflush(file);
  }
  void expect(bool ok, const std::string &what) {
    line("check {}: {}", what, ok ? "OK" : "FAILED");
    failures += ok ? 0 : 1;
  }
};

ExecutorConfig cuda_config() {
  ExecutorConfig config;
  config.backend = Backend::cuda;
  return config;
}

bool small_array_works(LlvmRuntimeExecutor &ex) {
  const int64_t shape[1] = {1024};
  auto a = ex.ndarray(DataType::f32, shape);
  if (!a || !ex.fill(*a, Scalar::of(2.0))) return false;
  auto sum = ex.reduce_sum(*a);
  return sum && sum->f64 == 2048.0;
}

uint64_t held_bytes(LlvmRuntimeExecutor &ex) {
  const CategoryBytes in_use = ex.memory().in_use_by_category();
  uint64_t held = 0;
  for (std::size_t i = 0; i < in_use.size(); ++i)
    if (i != static_cast<std::size_t>(MemoryCategory::pool_cache)) held += in_use[i];
  return held;
}

void ops_suite(Report &r) {
  ops::SuiteOptions options;
  options.config = cuda_config();
  options.out = r.file;
  const ops::SuiteReport report = ops::run_suite(options);
  if (report.setup_failure) r.line("kiln-ops suite: {}", describe(*report.setup_failure));
  r.line("kiln-ops suite: {}/{} cases OK, {} refused, {} failed", report.ok, report.results.size(),
         report.refused, report.failed);
  r.expect(!report.setup_failure && report.failed == 0, "kiln-ops cases on cuda: none FAILed");
}

void seed_scenario(Report &r, uint64_t total_bytes) {
  const int64_t too_big[1] = {static_cast<int64_t>((total_bytes + (1ull << 30)) / 4)};
  {
    ExecutorConfig config = cuda_config();
    config.budget.limit_bytes = total_bytes * 2;  // let the driver decide
    config.budget.live_check = false;
    auto ex = value_or_throw(LlvmRuntimeExecutor::create(config));
    auto a = ex->ndarray(DataType::f32, too_big);
    r.line("seed driver: {}", a ? "allocated (unexpected)" : describe(a.error()));
    r.expect(!a && classify(a.error()) == ErrorKind::device_out_of_memory,
             "larger-than-device ndarray is DeviceOutOfMemoryError");
    r.expect(small_array_works(*ex), "a small ndarray works right after the driver's refusal");
  }
  auto ex = value_or_throw(LlvmRuntimeExecutor::create(cuda_config()));
  auto a = ex->ndarray(DataType::f32, too_big);
  r.line("seed budget: {}", a ? "allocated (unexpected)" : describe(a.error()));
  r.expect(!a && classify(a.error()) == ErrorKind::budget_exceeded,
           "under the default budget it is BudgetExceededError");
  r.expect(small_array_works(*ex), "a small ndarray works right after the budget's refusal");
}

void fill_until_refused(Report &r) {
  auto ex = value_or_throw(LlvmRuntimeExecutor::create(cuda_config()));
  const uint64_t baseline = held_bytes(*ex);
  const int64_t one_gib[1] = {int64_t{1} << 28};  // f32
  std::vector<Ndarray> arrays;
  std::optional<Failure> refusal;
  while (!refusal && arrays.size() < 4096) {
    auto a = ex->ndarray(DataType::f32, one_gib);
    if (!a) {
      refusal = a.error();
      break;
    }
    if (auto filled = ex->fill(*a, Scalar::of(1.0)); !filled) refusal = filled.error();
    arrays.push_back(*a);
  }
  r.line("1 GiB arrays held before the refusal: {}", arrays.size());
  r.line("refusal: {}", refusal ? describe(*refusal) : "none");
  r.expect(refusal && is_out_of_memory(classify(*refusal)), "1 GiB arrays end in a typed out-of-memory error");
  std::size_t refused_frees = 0;
  for (Ndarray &a : arrays) refused_frees += ex->free(a) ? 0 : 1;
  r.expect(refused_frees == 0, "every array held before the refusal frees");
  arrays.clear();
  ex->memory().release_cached();
  r.line("ledger after freeing: {} (set-up {})", held_bytes(*ex), baseline);
  r.expect(held_bytes(*ex) == baseline, "after freeing them all the ledger is back at the set-up");
  r.expect(small_array_works(*ex), "the device works after the refusal");
}

template <class F>
double nanoseconds_per(int iterations, F &&f) {
  const auto start = Clock::now();
  for (int i = 0; i < iterations; ++i) f();
  return std::chrono::duration<double, std::nano>(Clock::now() - start).count() / iterations;
}

void timings(Report &r) {
  auto ex = value_or_throw(LlvmRuntimeExecutor::create(cuda_config()));
  constexpr uint64_t kBytes = 1 << 20;
  value_or_throw(ex->memory().free(value_or_throw(ex->memory().allocate(MemoryCategory::ndarray, kBytes))));
  const double pool = nanoseconds_per(10000, [&] {
    value_or_throw(
        ex->memory().free(value_or_throw(ex->memory().allocate(MemoryCategory::ndarray, kBytes))));
  });
  LlvmRuntimeAllocParams params;
  params.size_bytes = kBytes;
  const double driver = nanoseconds_per(1000, [&] {
    value_or_throw(
        ex->device().dealloc_memory(value_or_throw(ex->device().allocate_runtime(params))));
  });
  r.line("pool-hit alloc+free 1 MiB: {:.0f} ns; cuMemAlloc_v2+cuMemFree_v2: {:.0f} ns; ratio {:.3f}",
         pool, driver, pool / driver);
  const int64_t shape[1] = {int64_t{1} << 26};  // 256 MiB of f32
  Ndarray x = value_or_throw(ex->ndarray(DataType::f32, shape));
  Ndarray y = value_or_throw(ex->ndarray(DataType::f32, shape));
  value_or_throw(ex->fill(x, Scalar::of(1.0)));
  value_or_throw(ex->fill(y, Scalar::of(0.0)));
  value_or_throw(ex->axpy(Scalar::of(2.0), x, y));  // warm
  constexpr int kIters = 20;
  const double ns = nanoseconds_per(kIters, [&] { value_or_throw(ex->axpy(Scalar::of(2.0), x, y)); });
  const double gbps = 3.0 * static_cast<double>(x.nbytes()) / ns;  // bytes per ns = GB/s
  r.line("axpy f32 256 MiB: {:.1f} GB/s ({:.3f} ms per launch)", gbps, ns / 1e6);
  auto sum = ex->reduce_sum(y);
  r.expect(sum && sum->f64 == 2.0 * (kIters + 1) * static_cast<double>(x.num_elements()),
           "axpy results are right");
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: kiln-gpu-check RESULTS_FILE\n");
    return 2;
  }
  Report r;
  r.file = std::fopen(argv[1], "a");
  try {
    auto probe = LlvmRuntimeExecutor::create(cuda_config());
    if (!probe) {
      r.line("cuda: {}", describe(probe.error()));
      return 1;
    }
    const auto info = value_or_throw((*probe)->device().memory_info());
    r.line("device: {} ({}, code for {}) total {} free {}", (*probe)->device().name(),
           static_cast<GpuDevice &>((*probe)->device()).code_target(), (*probe)->program().target(),
           format_bytes(info.total_bytes), format_bytes(info.free_bytes));
    probe->reset();
    ops_suite(r);
    seed_scenario(r, info.total_bytes);
    fill_until_refused(r);
    timings(r);
  } catch (const Error &e) {
    r.line("unexpected {}: {}", e.name(), e.what());
    r.failures += 1;
  }
  r.line("gpu-check: {} check(s) failed", r.failures);
  if (r.file != nullptr) std::fclose(r.file);
  return r.failures == 0 ? 0 : 1;
}
