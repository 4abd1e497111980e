// Process lifecycle in C++: thread pools and kiln's locks after fork(), and host memory
// exhaustion at the boundaries where kiln runs code it does not control (LLVM, thread creation).
// The risky parts run in a forked child with an alarm: a hang or an abort fails the test, never
// hangs or ends the test binary.
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <string>
#include <system_error>
#include <thread>

#include <catch2/catch.hpp>
#include <llvm/Support/ErrorHandling.h>

#include "kiln/executor/errors.h"
#include "kiln/executor/program.h"
#include "kiln/rhi/fork_hooks.h"
#include "kiln/runtime/host_memory_guard.h"
#include "kiln/runtime/memory/budget.h"
#include "kiln/runtime/thread_pool.h"

using namespace kiln;

namespace {

/// Runs `body` in a forked child (at most 60 s); returns its exit status, or -signal.
template <class Fn>
int in_child(Fn &&body) {
  const pid_t child = fork();
  if (child == 0) {
    alarm(60);  // a hang ends in SIGALRM
    _exit(body());
  }
  int status = 0;
  if (waitpid(child, &status, 0) != child) return -1000;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

/// This process's mapped address space (VmSize), in bytes.
uint64_t address_space_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmSize:", 0) == 0) return std::stoull(line.substr(7)) * 1024;
  return 0;
}

int64_t sum_over(runtime::ThreadPool &pool, int64_t n) {
  std::atomic<int64_t> sum{0};
  pool.parallel_for(n, [&](int64_t i) { sum += i; });
  return sum.load();
}

}  // namespace

// Tagged [fork], not [threads]: ThreadSanitizer (make test-tsan runs [threads]) cannot start
// threads in a child forked from a multi-threaded process ("die_after_fork").
TEST_CASE("a forked child runs parallel_for on a pool its parent started, and destroys it",
          "[fork]") {
  auto pool = std::make_unique<runtime::ThreadPool>(4);
  REQUIRE(sum_over(*pool, 1000) == 499500);
  CHECK(in_child([&] {
          if (sum_over(*pool, 1000) != 499500) return 1;  // the parent's workers are not here
          if (sum_over(runtime::default_thread_pool(), 100) != 4950) return 2;
          pool.reset();  // must not join the parent's workers
          return 0;
        }) == 0);
  CHECK(sum_over(*pool, 1000) == 499500);  // the parent's pool is untouched
}

TEST_CASE("a ForkSafeMutex another thread holds at fork() is usable in the child", "[fork]") {
  ForkSafeMutex reset(ForkSafeMutex::Policy::reset_in_child);
  ForkSafeMutex held(ForkSafeMutex::Policy::hold_across_fork);
  std::promise<void> locked, release;
  std::thread holder([&] {
    std::lock_guard lock(reset);  // held by a thread the child will not have
    locked.set_value();
    release.get_future().wait();
  });
  locked.get_future().wait();
  CHECK(in_child([&] {
          std::lock_guard a(reset);  // made anew in the child
          std::lock_guard b(held);   // released by the child hook
          return 0;
        }) == 0);
  release.set_value();
  holder.join();
}

TEST_CASE("a fork while another thread is inside the budget's lock leaves the child a usable budget",
          "[fork]") {
  runtime::MemoryBudget budget(1 << 20);
  static std::atomic<bool> inside{false};
  inside = false;
  // The other thread stays 300 ms inside the lock; the fork waits for it (hold_across_fork).
  budget.set_under_lock_hook_for_testing(
      [](void *) {
        inside = true;
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      },
      nullptr);
  std::thread reserving([&] {
    ignore_result(budget.reserve(MemoryCategory::ndarray, 1), "only holds the lock for the fork");
  });
  while (!inside) std::this_thread::yield();
  CHECK(in_child([&] {
          budget.set_under_lock_hook_for_testing(nullptr, nullptr);
          auto r = budget.reserve(MemoryCategory::staging, 64);  // hangs if the lock came locked
          return r && budget.in_use_bytes() >= 64 ? 0 : 1;
        }) == 0);
  reserving.join();
  budget.set_under_lock_hook_for_testing(nullptr, nullptr);
  CHECK(budget.reserve(MemoryCategory::staging, 64));
}

TEST_CASE("check_host_headroom refuses address space that cannot be mapped as host out-of-memory",
          "[host_oom]") {
  CHECK(runtime::check_host_headroom("cpu", "test", 1u << 20).has_value());
  auto refused = runtime::check_host_headroom("cpu", "test", uint64_t{1} << 62);
  REQUIRE_FALSE(refused);
  CHECK(classify(refused.error()) == ErrorKind::host_out_of_memory);
  CHECK(refused.error().requested_bytes == uint64_t{1} << 62);
}

TEST_CASE("an exception escaping a guarded boundary becomes a named failure", "[host_oom]") {
  auto bad_alloc = runtime::guard_host_exceptions("cpu", "test", []() -> RhiStatus {
    throw std::bad_alloc();
  });
  REQUIRE_FALSE(bad_alloc);
  CHECK(classify(bad_alloc.error()) == ErrorKind::host_out_of_memory);
  auto future = runtime::guard_host_exceptions("cpu", "test", []() -> RhiStatus {
    throw std::future_error(std::future_errc::no_state);
  });
  REQUIRE_FALSE(future);
  CHECK(classify(future.error()) == ErrorKind::runtime_error);
  auto thread = runtime::guard_host_exceptions("cpu", "test", []() -> RhiStatus {
    throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
  });
  REQUIRE_FALSE(thread);
  CHECK(classify(thread.error()) == ErrorKind::runtime_error);
}

TEST_CASE("LLVM's out-of-memory report is a host out-of-memory failure, not an abort", "[host_oom]") {
  // Without kiln's handler LLVM 19 (built without exceptions) prints "LLVM ERROR: out of
  // memory" and aborts: the child would end in SIGABRT.
  runtime::install_llvm_error_handlers();
  CHECK(in_child([] {
          auto reported = runtime::guard_host_exceptions("cpu", "test", []() -> RhiStatus {
            llvm::report_bad_alloc_error("test allocation");
            return {};
          });
          if (reported || classify(reported.error()) != ErrorKind::host_out_of_memory) return 1;
          auto fatal = runtime::guard_host_exceptions("cpu", "test", []() -> RhiStatus {
            llvm::report_fatal_error("test fatal error", false);
          });
          if (fatal || fatal.error().message().find("test fatal error") == std::string::npos) return 2;
          return 0;
        }) == 0);
}

TEST_CASE("Program::create under an address-space limit is host out-of-memory, never an abort",
          "[host_oom][codegen]") {
  // Limits just above what the process maps: each compile either works or fails by name.
  int refused = 0;
  for (const uint64_t extra_mib : {1, 4, 16, 64}) {
    const int status = in_child([extra_mib] {
      const rlim_t limit = address_space_bytes() + (extra_mib << 20);
      const rlimit as{limit, limit};
      if (setrlimit(RLIMIT_AS, &as) != 0) return 10;
      auto program = Program::create(CodegenArch::host);
      if (program) return (*program)->kernel("kiln_fill_f32") ? 0 : 3;
      return classify(program.error()) == ErrorKind::host_out_of_memory ? 4 : 5;
    });
    INFO("extra address space " << extra_mib << " MiB: child status " << status);
    CHECK((status == 0 || status == 4));
    refused += status == 4;
  }
  CHECK(refused >= 1);
}
