// A persistent pool of worker threads that runs index-parallel loops for the CPU backend.
#ifndef KILN_RUNTIME_THREAD_POOL_H_
#define KILN_RUNTIME_THREAD_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

#include "kiln/rhi/fork_hooks.h"

namespace kiln::runtime {

class ThreadPool {
 public:
  /// Starts `num_threads - 1` persistent workers; the thread calling parallel_for is the last
  /// one. 0 (hardware_concurrency() may say so) is treated as 1: everything runs inline. When
  /// the OS refuses a thread, the pool keeps the workers it got (never throws for that).
  ///
  /// fork(): the fork waits for a parallel_for in flight to end. In the child the parent's
  /// workers do not exist: the pool forgets them (never joins them) and starts new ones on the
  /// next parallel_for.
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

  /// Threads that run tasks, the caller included (>= 1): the workers started the last time.
  [[nodiscard]] unsigned num_threads() const;

 private:
  struct Crew;  // the workers and the state they share with parallel_for

  const unsigned requested_threads_;
  std::atomic<unsigned> num_threads_{1};
  std::mutex submit_mutex_;      // serializes parallel_for callers; held across fork()
  std::unique_ptr<Crew> crew_;   // submit_mutex_; null in a forked child until the next job
  ForkRegistration fork_registration_;  // last: unregistered first
};

/// The process-wide pool (hardware_concurrency threads), created on first use and never
/// destroyed (threads may still use it while the process exits). Thread-safe.
ThreadPool &default_thread_pool();

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_THREAD_POOL_H_
