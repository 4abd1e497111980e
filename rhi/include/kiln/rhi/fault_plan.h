// Deterministic fault injection for LLVM devices: make chosen allocations fail with
// out_of_memory, as if the driver had refused them. Used by tests, kiln-ops --fault-at and the
// Python kiln.testing helpers.
#ifndef KILN_RHI_FAULT_PLAN_H_
#define KILN_RHI_FAULT_PLAN_H_

#include <atomic>
#include <cstdint>
#include <limits>

namespace kiln {

/// Counts driver-level allocation calls and says which must fail. All members are thread-safe.
class FaultPlan {
 public:
  static constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();

  /// The `n`-th allocation from now (1-based) fails; kNever disarms. Resets the count.
  void fail_nth_allocation(uint64_t n) {
    allocations_.store(0, std::memory_order_relaxed);
    fail_at_.store(n, std::memory_order_relaxed);
  }
  /// The allocation that brings allocation_count() to `count` fails; the count goes on (no
  /// reset), so nested plans (kiln.testing.fail_allocation blocks) count consistently.
  void fail_at_count(uint64_t count) { fail_at_.store(count, std::memory_order_relaxed); }
  /// Every allocation of at least `size_bytes` fails; kNever disarms.
  void fail_sizes_at_least(uint64_t size_bytes) { fail_size_.store(size_bytes, std::memory_order_relaxed); }
  void clear() {
    fail_at_.store(kNever, std::memory_order_relaxed);
    fail_size_.store(kNever, std::memory_order_relaxed);
  }

  /// Counts one allocation attempt of `size_bytes`; true when the plan says it fails.
  [[nodiscard]] bool should_fail(uint64_t size_bytes) {
    const uint64_t n = allocations_.fetch_add(1, std::memory_order_relaxed) + 1;
    return n == fail_at_.load(std::memory_order_relaxed) ||
           size_bytes >= fail_size_.load(std::memory_order_relaxed);
  }
  /// Whether any fault is set (a count or a size).
  [[nodiscard]] bool armed() const {
    return fail_at_.load(std::memory_order_relaxed) != kNever ||
           fail_size_.load(std::memory_order_relaxed) != kNever;
  }
  /// Allocation attempts counted since the last fail_nth_allocation (or construction).
  [[nodiscard]] uint64_t allocation_count() const { return allocations_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> allocations_{0};
  std::atomic<uint64_t> fail_at_{kNever};
  std::atomic<uint64_t> fail_size_{kNever};
};

}  // namespace kiln

#endif  // KILN_RHI_FAULT_PLAN_H_
