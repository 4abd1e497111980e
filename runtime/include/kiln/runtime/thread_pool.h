// A persistent pool of worker threads that runs index-parallel loops for the CPU backend.
#ifndef KILN_RUNTIME_THREAD_POOL_H_
#define KILN_RUNTIME_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln::runtime {

class ThreadPool {
 public:
  /// Starts `num_threads - 1` persistent workers; the thread calling parallel_for is the last
  /// one. 0 (hardware_concurrency() may say so) is treated as 1: everything runs inline. When
  /// the OS refuses a thread, the pool keeps the workers it got (never throws for that).
  explicit ThreadPool(unsigned num_threads = std::thread::hardware_concurrency());
  /// Stops and joins the workers. Must not run while a parallel_for on this pool is in flight.
  ~ThreadPool();
  ThreadPool(const ThreadPool &) = delete;
  ThreadPool &operator=(const ThreadPool &) = delete;

  /// Calls fn(i) exactly once for every i in [0, num_tasks), spread over the workers and the
  /// calling thread, and returns when all calls have returned. num_tasks <= 1 runs inline.
  /// Thread-safe: concurrent calls from several threads are serialized. A call made from inside
  /// fn (nested) runs its tasks inline on that thread. If fn throws, the remaining tasks still
  /// run and the first exception is rethrown here.
  void parallel_for(int64_t num_tasks, const std::function<void(int64_t task_index)> &fn);

  /// Threads that run tasks, the caller included (>= 1).
  [[nodiscard]] unsigned num_threads() const { return static_cast<unsigned>(workers_.size()) + 1; }

 private:
  void worker_loop();
  void run_tasks();  // claims and runs tasks of the current job until none are left

  std::mutex submit_mutex_;  // serializes parallel_for callers
  std::mutex mutex_;         // guards everything below
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  uint64_t generation_ = 0;  // bumped once per job; workers wake on a change
  bool stop_ = false;
  unsigned workers_finished_ = 0;  // workers that are done with the current job
  const std::function<void(int64_t)> *fn_ = nullptr;
  int64_t num_tasks_ = 0;
  int64_t next_task_ = 0;  // next unclaimed task index
  std::exception_ptr first_exception_;
  std::vector<std::thread> workers_;
};

/// The process-wide pool (hardware_concurrency threads), created on first use. Thread-safe.
ThreadPool &default_thread_pool();

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_THREAD_POOL_H_
