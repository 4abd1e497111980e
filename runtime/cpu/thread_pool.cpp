// ThreadPool: one job at a time. Every worker takes part in every job and reports when it is done
// with it, so when parallel_for returns no worker can still touch the caller's function.
#include "kiln/runtime/thread_pool.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <system_error>
#include <utility>
#include <vector>

namespace kiln::runtime {
namespace {

/// The pool whose task the current thread is running (to run nested parallel_for inline).
thread_local const ThreadPool *t_running_pool = nullptr;

/// Runs fn on [0, num_tasks) on this thread; the first exception is rethrown after all tasks.
void run_inline(int64_t num_tasks, const std::function<void(int64_t)> &fn) {
  std::exception_ptr first;
  for (int64_t i = 0; i < num_tasks; ++i) {
    try {
      fn(i);
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

/// How long a worker spins for the next job, and parallel_for for its workers to finish, before
/// sleeping on a condition variable: a loop of launches brings the next job (and a job's last
/// task ends) within microseconds, where waking a sleeping thread can take far longer on a VM
/// (kiln-bench's paired reduce_sum ran near one core's bandwidth). OpenMP runtimes spin the same
/// way before blocking (libgomp's GOMP_SPINCOUNT, LLVM's KMP_BLOCKTIME), for longer.
constexpr std::chrono::microseconds kSpinTime{200};

/// Spins until `ready()` or kSpinTime passed, with the CPU's spin-wait hint.
template <class Ready>
void spin_briefly(Ready ready) {
  const auto until = std::chrono::steady_clock::now() + kSpinTime;
  for (unsigned i = 1;; ++i) {
    if (ready()) return;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
    if (i % 64 == 0 && std::chrono::steady_clock::now() >= until) return;
  }
}

}  // namespace

// The workers and everything they share with parallel_for. In a forked child a crew is
// abandoned whole (its threads, mutex and condition variables belong to the parent).
struct ThreadPool::Crew {
  std::mutex mutex;  // guards everything below
  std::condition_variable work_cv;
  std::condition_variable done_cv;
  // Written under the mutex; atomic so that a spinning thread may read them without it.
  std::atomic<uint64_t> generation{0};  // bumped once per job; workers wake on a change
  std::atomic<bool> stop{false};
  std::atomic<unsigned> workers_finished{0};  // workers that are done with the current job
  const std::function<void(int64_t)> *fn = nullptr;
  int64_t num_tasks = 0;
  int64_t next_task = 0;  // next unclaimed task index
  std::exception_ptr first_exception;
  std::vector<std::thread> workers;

  const ThreadPool *pool;

  Crew(const ThreadPool *owner, unsigned num_threads) : pool(owner) {
    const unsigned num_workers = num_threads > 1 ? num_threads - 1 : 0;
    workers.reserve(num_workers);
    for (unsigned i = 0; i < num_workers; ++i) {
      try {
        workers.emplace_back([this] { worker_loop(); });
      } catch (const std::system_error &) {
        break;  // the OS refused another thread: work with the ones it gave (num_threads() says)
      }
    }
  }

  ~Crew() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    work_cv.notify_all();
    for (std::thread &worker : workers) worker.join();
  }

  /// Claims and runs tasks of the current job until none are left.
  void run_tasks(const ThreadPool *pool) {
    const ThreadPool *outer = t_running_pool;
    t_running_pool = pool;
    std::unique_lock lock(mutex);
    while (next_task < num_tasks) {
      const int64_t task = next_task++;
      lock.unlock();
      try {
        (*fn)(task);
      } catch (...) {
        lock.lock();
        if (!first_exception) first_exception = std::current_exception();
        lock.unlock();
      }
      lock.lock();
    }
    t_running_pool = outer;
  }

  void worker_loop() {
    uint64_t seen_generation = 0;
    std::unique_lock lock(mutex);
    for (;;) {
      if (!stop && generation == seen_generation) {
        lock.unlock();
        spin_briefly([&] { return stop.load(std::memory_order_relaxed) ||
                                  generation.load(std::memory_order_relaxed) != seen_generation; });
        lock.lock();
      }
      work_cv.wait(lock, [&] { return stop || generation != seen_generation; });
      if (stop) return;
      seen_generation = generation;
      lock.unlock();
      run_tasks(pool);
      lock.lock();
      if (++workers_finished == workers.size()) done_cv.notify_one();
    }
  }

  void run_job(int64_t n, const std::function<void(int64_t)> &job) {
    {
      std::lock_guard lock(mutex);
      fn = &job;
      num_tasks = n;
      next_task = 0;
      workers_finished = 0;
      first_exception = nullptr;
      ++generation;
    }
    work_cv.notify_all();
    run_tasks(pool);
    std::exception_ptr failure;
    spin_briefly([&] { return workers_finished.load(std::memory_order_relaxed) == workers.size(); });
    {
      std::unique_lock lock(mutex);
      done_cv.wait(lock, [&] { return workers_finished == workers.size(); });
      fn = nullptr;
      failure = std::exchange(first_exception, nullptr);
    }
    if (failure) std::rethrow_exception(failure);
  }
};

ThreadPool::ThreadPool(unsigned num_threads)
    : requested_threads_(num_threads),
      crew_(std::make_unique<Crew>(this, num_threads)),
      fork_registration_(ForkHooks{
          // No job is in flight while the process is copied.
          [this] { submit_mutex_.lock(); },
          [this] { submit_mutex_.unlock(); },
          [this] {
            // The workers do not exist in the child: never join them, never touch the crew's
            // mutex or condition variables (the parent's threads were waiting on them). The
            // crew is left allocated; a new one starts on the next parallel_for.
            (void)crew_.release();
            submit_mutex_.unlock();
          }}) {
  num_threads_.store(static_cast<unsigned>(crew_->workers.size()) + 1, std::memory_order_relaxed);
}

ThreadPool::~ThreadPool() = default;

unsigned ThreadPool::num_threads() const { return num_threads_.load(std::memory_order_relaxed); }

void ThreadPool::parallel_for(int64_t num_tasks, const std::function<void(int64_t)> &fn) {
  if (num_tasks <= 0) return;
  if (num_tasks == 1 || requested_threads_ <= 1 || t_running_pool == this) {
    run_inline(num_tasks, fn);
    return;
  }
  std::lock_guard submit(submit_mutex_);
  if (!crew_) {  // the first job in a forked child
    crew_ = std::make_unique<Crew>(this, requested_threads_);
    num_threads_.store(static_cast<unsigned>(crew_->workers.size()) + 1, std::memory_order_relaxed);
  }
  if (crew_->workers.empty()) {
    run_inline(num_tasks, fn);
    return;
  }
  crew_->run_job(num_tasks, fn);
}

ThreadPool &default_thread_pool() {
  static auto *pool = new ThreadPool;
  return *pool;
}

}  // namespace kiln::runtime
