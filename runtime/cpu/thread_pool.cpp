// ThreadPool: one job at a time. Every worker takes part in every job and reports when it is done
// with it, so when parallel_for returns no worker can still touch the caller's function.
#include "kiln/runtime/thread_pool.h"

#include <system_error>
#include <utility>

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

}  // namespace

ThreadPool::ThreadPool(unsigned num_threads) {
  const unsigned num_workers = num_threads > 1 ? num_threads - 1 : 0;
  workers_.reserve(num_workers);
  for (unsigned i = 0; i < num_workers; ++i) {
    try {
      workers_.emplace_back([this] { worker_loop(); });
    } catch (const std::system_error &) {
      break;  // the OS refused another thread: work with the ones it gave (num_threads() says)
    }
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  for (std::thread &worker : workers_) worker.join();
}

void ThreadPool::run_tasks() {
  const ThreadPool *outer = t_running_pool;
  t_running_pool = this;
  std::unique_lock lock(mutex_);
  while (next_task_ < num_tasks_) {
    const int64_t task = next_task_++;
    lock.unlock();
    try {
      (*fn_)(task);
    } catch (...) {
      lock.lock();
      if (!first_exception_) first_exception_ = std::current_exception();
      lock.unlock();
    }
    lock.lock();
  }
  t_running_pool = outer;
}

void ThreadPool::worker_loop() {
  uint64_t seen_generation = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    work_cv_.wait(lock, [&] { return stop_ || generation_ != seen_generation; });
    if (stop_) return;
    seen_generation = generation_;
    lock.unlock();
    run_tasks();
    lock.lock();
    if (++workers_finished_ == workers_.size()) done_cv_.notify_one();
  }
}

void ThreadPool::parallel_for(int64_t num_tasks, const std::function<void(int64_t)> &fn) {
  if (num_tasks <= 0) return;
  if (num_tasks == 1 || workers_.empty() || t_running_pool == this) {
    run_inline(num_tasks, fn);
    return;
  }
  std::lock_guard submit(submit_mutex_);
  {
    std::lock_guard lock(mutex_);
    fn_ = &fn;
    num_tasks_ = num_tasks;
    next_task_ = 0;
    workers_finished_ = 0;
    first_exception_ = nullptr;
    ++generation_;
  }
  work_cv_.notify_all();
  run_tasks();
  std::exception_ptr failure;
  {
    std::unique_lock lock(mutex_);
    done_cv_.wait(lock, [&] { return workers_finished_ == workers_.size(); });
    fn_ = nullptr;
    failure = std::exchange(first_exception_, nullptr);
  }
  if (failure) std::rethrow_exception(failure);
}

ThreadPool &default_thread_pool() {
  static ThreadPool pool;
  return pool;
}

}  // namespace kiln::runtime
