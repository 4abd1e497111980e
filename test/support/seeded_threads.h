// Stress tests' threads: started together, each with its own reproducible random sequence.
#ifndef KILN_TEST_SEEDED_THREADS_H_
#define KILN_TEST_SEEDED_THREADS_H_

#include <latch>
#include <random>
#include <thread>
#include <vector>

namespace kiln::test {

/// Runs `worker(rng)` on `num_threads` threads, thread t with a std::mt19937 seeded
/// `first_seed + t`; a latch lets them all start at once. Returns when every thread has finished.
template <class Worker>
void run_seeded_threads(int num_threads, unsigned first_seed, Worker worker) {
  std::latch start(num_threads);
  std::vector<std::thread> threads;
  for (int t = 0; t < num_threads; ++t) {
    threads.emplace_back([&start, &worker, seed = first_seed + static_cast<unsigned>(t)] {
      std::mt19937 rng(seed);
      start.arrive_and_wait();
      worker(rng);
    });
  }
  for (std::thread &thread : threads) thread.join();
}

}  // namespace kiln::test

#endif  // KILN_TEST_SEEDED_THREADS_H_
