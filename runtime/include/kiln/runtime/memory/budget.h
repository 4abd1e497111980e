// The memory budget and its ledger: what kiln may hold on one device, and what it holds, per
// category. Pure bookkeeping (no device calls), so it is testable without memory.
#ifndef KILN_RUNTIME_MEMORY_BUDGET_H_
#define KILN_RUNTIME_MEMORY_BUDGET_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>

#include "kiln/rhi/fork_hooks.h"
#include "kiln/rhi/result.h"

namespace kiln::runtime {

class MemoryBudget;

/// Bytes held or promised, per category; the unit of a reservation.
struct CategoryRequest {
  MemoryCategory category = MemoryCategory::ndarray;
  uint64_t size_bytes = 0;
};

/// `a + b`, or UINT64_MAX where that wraps (a sum of sizes that wraps never fits).
[[nodiscard]] inline uint64_t saturating_add(uint64_t a, uint64_t b) {
  return b > UINT64_MAX - a ? UINT64_MAX : a + b;
}

/// How a refused reservation reports the allocation it was for, when that is not the reservation
/// itself (growth reserves size classes for a request of fewer bytes, or a group's misses only):
/// the allocation's figures and, for a group, its cache hits.
struct RefusalReport {
  AllocationFigures figures;
  GroupReuse group;
};

/// Bytes promised by the budget. What is not committed (commit() or commit_part()) the destructor
/// gives back, so every early return on a failure path releases what it reserved. Move-only; not
/// thread-safe (one owner), but the budget it refers to is.
class [[nodiscard]] Reservation {
 public:
  Reservation() = default;
  Reservation(Reservation &&other) noexcept;
  Reservation &operator=(Reservation &&other) noexcept;
  Reservation(const Reservation &) = delete;
  Reservation &operator=(const Reservation &) = delete;
  ~Reservation();

  /// The bytes stay charged to the ledger; the caller now owns the charge and releases it with
  /// MemoryBudget::release when the memory is freed.
  void commit();
  /// Gives `category` bytes of this reservation back now (a partial release, e.g. when one
  /// member of a group turned out to be a cache hit).
  void release_part(MemoryCategory category, uint64_t size_bytes);
  /// Commits `category` bytes of this reservation now (one block of a group is on the device:
  /// the peaks count it from here); the rest stays reserved.
  void commit_part(MemoryCategory category, uint64_t size_bytes);
  [[nodiscard]] uint64_t total_bytes() const;

 private:
  friend class MemoryBudget;
  Reservation(MemoryBudget *budget, CategoryBytes bytes) : budget_(budget), bytes_(bytes) {}
  /// Takes up to `size_bytes` of `category` out of this reservation; returns the bytes taken (0
  /// when there is no budget).
  uint64_t take_part(MemoryCategory category, uint64_t size_bytes);
  MemoryBudget *budget_ = nullptr;
  CategoryBytes bytes_{};
};

/// Current and peak bytes per category plus event counters. A plain value (a snapshot).
struct LedgerStats {
  CategoryBytes current_bytes{};  ///< charged now: held, or reserved by an allocation under way
  /// The most held (committed) since the last reset_peaks, per category and in all at once.
  /// (DeviceMemory::stats reports its own per-category peaks: see there.)
  CategoryBytes peak_bytes{};
  uint64_t peak_total_bytes = 0;
  uint64_t limit_bytes = 0;
  uint64_t refusals = 0;  ///< reservations the budget refused
  [[nodiscard]] uint64_t current_total_bytes() const {
    uint64_t total = 0;
    for (uint64_t b : current_bytes) total += b;
    return total;
  }
};

/// What a budget asks before it refuses for good (the reclaim hook: evict, then ask again): memory
/// held now that could be given back, such as a caching pool's blocks. DeviceMemory is one.
class ReclaimHook {
 public:
  /// Bytes held now that reclaim() cannot give back (every category but the reclaimable one).
  [[nodiscard]] virtual uint64_t unreclaimable_bytes() const = 0;
  /// Gives back what it can so that a refused reservation may be asked again: true when that
  /// may have made room (bytes released here or by another thread meanwhile).
  virtual bool reclaim() = 0;

 protected:
  ~ReclaimHook() = default;
};

/// A budget over one ledger: reservations succeed while in-use + request <= limit.
/// Thread-safe: every member may be called from any thread. A refusal takes no lock (the check
/// that refuses reads one atomic total), so refusing threads do not wait on each other; the
/// bytes themselves are charged under the lock, so in-use never passes the limit.
class MemoryBudget {
 public:
  explicit MemoryBudget(uint64_t limit_bytes) : limit_bytes_(limit_bytes) {}

  /// Reserves `size_bytes` in `category`. Errors: invalid_usage for a value that is no category;
  /// out_of_memory with oom_source budget (the
  /// failure carries the limit and the in-use bytes per category) when it does not fit.
  [[nodiscard]] RhiExpected<Reservation> reserve(MemoryCategory category, uint64_t size_bytes);
  /// Reserves every request in one step: all of them, or none. A refusal names the total and the
  /// first request's category, or what `report` says.
  [[nodiscard]] RhiExpected<Reservation> reserve(std::span<const CategoryRequest> requests,
                                                 const RefusalReport *report = nullptr);
  /// As reserve(requests), but a limit refusal that reclaiming would cure (the request fits
  /// beside `hook`'s unreclaimable bytes) reclaims and asks again, for at most kReclaimRounds
  /// rounds (other threads may take the room each round made). The only place a reserve becomes
  /// "evict, then ask again". Errors: as reserve.
  [[nodiscard]] RhiExpected<Reservation> reserve(std::span<const CategoryRequest> requests,
                                                 ReclaimHook &hook,
                                                 const RefusalReport *report = nullptr);
  static constexpr int kReclaimRounds = 8;
  /// Whether `size_bytes` would fit under the limit beside `unreclaimable_bytes` (what no
  /// reclaim can give back). No lock; a reservation decides for good.
  [[nodiscard]] bool fits_after_reclaim(uint64_t size_bytes, uint64_t unreclaimable_bytes) const;
  /// The limit refusal of the allocation `report` describes, with the limit and in-use bytes per
  /// category now (`in_use`, or the ledger's own when null). The only producer of limit
  /// refusals: reserve() (which counts its refusals in stats()) and callers that decided with
  /// fits() alike.
  [[nodiscard]] Failure refusal(const RefusalReport &report, const char *site,
                                const CategoryBytes *in_use = nullptr,
                                std::source_location where = std::source_location::current());
  /// Gives back committed bytes (the memory was freed): at most what `category` holds, so a
  /// caller's over-release never takes another allocation's reservation with it.
  void release(MemoryCategory category, uint64_t size_bytes);

  [[nodiscard]] uint64_t limit_bytes() const;
  /// Sets a new limit. Memory already held above it stays held; new reservations are refused.
  void set_limit_bytes(uint64_t limit_bytes);
  [[nodiscard]] uint64_t in_use_bytes() const;
  [[nodiscard]] CategoryBytes in_use_by_category() const;
  [[nodiscard]] LedgerStats stats() const;
  /// Forgets the peaks (sets them to the current values).
  void reset_peaks();
  /// Whether `total_bytes` more would fit now (no lock; a reservation decides for good).
  [[nodiscard]] bool fits(uint64_t total_bytes) const;

  /// Test hook: when set, reserve() calls `hook(context)` after its lock-free check let a request
  /// through and before it takes the lock, so a test can make another thread reserve in that gap
  /// and check that the re-check under the lock refuses what no longer fits (a race that threads
  /// alone hit only sometimes). nullptr (the default) removes it. Set it while no other thread
  /// reserves; the hook may call reserve() itself (from any thread).
  void set_before_lock_hook_for_testing(void (*hook)(void *context), void *context);
  /// Test hook: when set, reserve() calls `hook(context)` while it holds its lock (after the
  /// re-check), so a test can fork() while another thread is inside. nullptr removes it; set it
  /// while no other thread reserves.
  void set_under_lock_hook_for_testing(void (*hook)(void *context), void *context);

 private:
  friend class Reservation;
  /// Reservation::commit and commit_part: the bytes are held now; the peaks count only held
  /// bytes, so a reservation given back (a refusal after the limit check) never raises them.
  void commit(const CategoryBytes &bytes);
  /// Gives back reserved bytes that were never committed.
  void give_back(const CategoryBytes &bytes);
  void give_back(MemoryCategory category, uint64_t size_bytes);
  /// Lowers the charge of `category` by `size_bytes`, never below zero; returns the bytes lowered.
  uint64_t lower_charge_locked(MemoryCategory category, uint64_t size_bytes);

  // Serializes charges; the figures below are read without it. A leaf lock (arithmetic only),
  // held across fork() so that a child never inherits it locked.
  mutable ForkSafeMutex mutex_{ForkSafeMutex::Policy::hold_across_fork};
  std::atomic<uint64_t> limit_bytes_;
  std::atomic<uint64_t> in_use_total_{0};
  std::atomic<uint64_t> refusals_{0};
  std::array<std::atomic<uint64_t>, kNumMemoryCategories> current_bytes_{};
  void (*before_lock_hook_)(void *) = nullptr;  // tests only: set_before_lock_hook_for_testing
  void *before_lock_context_ = nullptr;
  void (*under_lock_hook_)(void *) = nullptr;  // tests only: set_under_lock_hook_for_testing
  void *under_lock_context_ = nullptr;
  CategoryBytes committed_bytes_{};  // mutex_: held, not only reserved
  CategoryBytes peak_bytes_{};  // mutex_: of committed_bytes_
  uint64_t peak_total_bytes_ = 0;  // mutex_: of their sum
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_BUDGET_H_
