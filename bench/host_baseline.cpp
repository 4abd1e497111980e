// kiln-bench's host baseline (host_baseline.h): persistent threads, first-touched arrays, and the
// triad and memcpy loops.
#include "host_baseline.h"

#include <barrier>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

namespace kiln::bench {

unsigned host_thread_count() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : n;
}

namespace {

// ---------------------------------------------------------------------------------------------
// The baseline's threads: `num_threads - 1` persistent workers plus the calling thread, started
// once, so that (like kiln's worker pool) no thread is created inside a timed iteration.
class HostTeam {
 public:
  using Job = std::function<void(unsigned index, unsigned count)>;

  explicit HostTeam(unsigned num_threads)
      : num_threads_(num_threads), start_(num_threads), done_(num_threads) {
    for (unsigned i = 0; i + 1 < num_threads; ++i) workers_.emplace_back([this, i] { work(i); });
  }
  ~HostTeam() {
    stop_ = true;
    start_.arrive_and_wait();
    for (std::thread &worker : workers_) worker.join();
  }
  HostTeam(const HostTeam &) = delete;
  HostTeam &operator=(const HostTeam &) = delete;

  /// Runs job(index, count) on every thread of the team; returns when all have finished.
  void run(const Job &job) {
    job_ = &job;
    start_.arrive_and_wait();
    job(num_threads_ - 1, num_threads_);
    done_.arrive_and_wait();
  }
  [[nodiscard]] unsigned num_threads() const { return num_threads_; }

 private:
  void work(unsigned index) {
    for (;;) {
      start_.arrive_and_wait();
      if (stop_) return;
      (*job_)(index, num_threads_);
      done_.arrive_and_wait();
    }
  }

  unsigned num_threads_;
  std::barrier<> start_;
  std::barrier<> done_;
  const Job *job_ = nullptr;  // written before start_, read after it: the barrier orders them
  bool stop_ = false;
  std::vector<std::thread> workers_;
};

HostTeam &host_team() {
  static HostTeam team(host_thread_count());
  return team;
}

/// [begin, end) of thread `index` of `count` over `n` elements, cut on 64-element boundaries.
std::pair<uint64_t, uint64_t> slice(uint64_t n, unsigned index, unsigned count) {
  const uint64_t blocks = (n + 63) / 64;
  const uint64_t begin = std::min(n, blocks * index / count * 64);
  const uint64_t end = std::min(n, blocks * (index + 1) / count * 64);
  return {begin, end};
}

struct FreeDeleter {
  void operator()(void *p) const { std::free(p); }
};

/// Three page-aligned f64 host arrays of `size_bytes` each, first touched by the team that uses
/// them. Made once per size and kept for the run, so no timed iteration faults pages in.
struct HostArrays {
  uint64_t num_elements = 0;
  std::unique_ptr<double[], FreeDeleter> a, b, c;
};

HostArrays &host_arrays(uint64_t size_bytes) {
  static std::map<uint64_t, HostArrays> cache;
  auto it = cache.find(size_bytes);
  if (it != cache.end()) return it->second;
  HostArrays arrays;
  arrays.num_elements = size_bytes / sizeof(double);
  auto make = [&] {
    void *p = std::aligned_alloc(4096, (size_bytes + 4095) / 4096 * 4096);
    if (p == nullptr) {
      std::fprintf(stderr, "kiln-bench: could not allocate %llu bytes of host memory\n",
                   static_cast<unsigned long long>(size_bytes));
      std::exit(1);
    }
    return std::unique_ptr<double[], FreeDeleter>(static_cast<double *>(p));
  };
  arrays.a = make();
  arrays.b = make();
  arrays.c = make();
  const HostTeam::Job touch = [&](unsigned index, unsigned count) {
    const auto [begin, end] = slice(arrays.num_elements, index, count);
    for (uint64_t i = begin; i < end; ++i) {
      arrays.a[i] = 0.0;
      arrays.b[i] = 1.0;
      arrays.c[i] = 2.0;
    }
  };
  host_team().run(touch);
  return cache.emplace(size_bytes, std::move(arrays)).first->second;
}

// The read and axpy loops run at the widest vector ISA the CPU has, as kiln's JIT compiles for
// the host CPU: GCC emits one clone per target and picks one at load time (an ifunc).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KILN_BENCH_HOST_ISA_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KILN_BENCH_HOST_ISA_CLONES
#endif

/// Sum of x[begin, end) with 32 independent accumulators (four AVX-512 vectors in flight, so the
/// loop is bound by the read bandwidth, not by add latency), combined in a fixed order.
KILN_BENCH_HOST_ISA_CLONES double read_sum(const double *__restrict x, uint64_t begin,
                                           uint64_t end) {
  constexpr int kLanes = 32;
  double lanes[kLanes] = {};
  uint64_t i = begin;
  for (; i + kLanes <= end; i += kLanes)
    for (int lane = 0; lane < kLanes; ++lane) lanes[lane] += x[i + lane];
  double sum = 0.0;
  for (; i < end; ++i) sum += x[i];
  for (const double lane : lanes) sum += lane;
  return sum;
}

KILN_BENCH_HOST_ISA_CLONES void axpy(double alpha, const double *__restrict x, double *__restrict y,
                                     uint64_t begin, uint64_t end) {
  for (uint64_t i = begin; i < end; ++i) y[i] = alpha * x[i] + y[i];
}

}  // namespace

void bench_triad(benchmark::State &state, uint64_t size_bytes) {
  HostArrays &arrays = host_arrays(size_bytes);
  const HostTeam::Job triad = [&](unsigned index, unsigned count) {
    const auto [begin, end] = slice(arrays.num_elements, index, count);
    double *__restrict a = arrays.a.get();
    const double *__restrict b = arrays.b.get();
    const double *__restrict c = arrays.c.get();
    constexpr double kScalar = 3.0;
    for (uint64_t i = begin; i < end; ++i) a[i] = b[i] + kScalar * c[i];
  };
  for (auto _ : state) {
    host_team().run(triad);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 3 * size_bytes));
}

void bench_memcpy(benchmark::State &state, uint64_t size_bytes) {
  HostArrays &arrays = host_arrays(size_bytes);
  const HostTeam::Job copy = [&](unsigned index, unsigned count) {
    const auto [begin, end] = slice(arrays.num_elements, index, count);
    std::memcpy(arrays.a.get() + begin, arrays.b.get() + begin, (end - begin) * sizeof(double));
  };
  for (auto _ : state) {
    host_team().run(copy);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 2 * size_bytes));
}

namespace {

/// The read-sum job over `arrays` into `sums` (one slot per thread, read after the run).
HostTeam::Job read_sum_job(HostArrays &arrays, std::vector<double> &sums) {
  return [&arrays, &sums](unsigned index, unsigned count) {
    const auto [begin, end] = slice(arrays.num_elements, index, count);
    sums[index] = read_sum(arrays.b.get(), begin, end);
  };
}

}  // namespace

void bench_read_sum(benchmark::State &state, uint64_t size_bytes) {
  HostArrays &arrays = host_arrays(size_bytes);
  std::vector<double> sums(host_team().num_threads());
  const HostTeam::Job sum = read_sum_job(arrays, sums);
  for (auto _ : state) {
    host_team().run(sum);
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * size_bytes));
}

double read_sum_once(uint64_t size_bytes) {
  HostArrays &arrays = host_arrays(size_bytes);
  std::vector<double> sums(host_team().num_threads());
  host_team().run(read_sum_job(arrays, sums));
  double total = 0.0;
  for (const double s : sums) total += s;
  return total;
}

void bench_axpy(benchmark::State &state, uint64_t size_bytes) {
  HostArrays &arrays = host_arrays(size_bytes);
  // a grows by 1e-6 * 2 per iteration: far from overflow for any run length.
  const HostTeam::Job job = [&](unsigned index, unsigned count) {
    const auto [begin, end] = slice(arrays.num_elements, index, count);
    axpy(1e-6, arrays.c.get(), arrays.a.get(), begin, end);
  };
  for (auto _ : state) {
    host_team().run(job);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * 3 * size_bytes));
}

}  // namespace kiln::bench
