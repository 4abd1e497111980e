#include "kiln/runtime/memory/budget.h"

#include <algorithm>

namespace kiln::runtime {

namespace {
std::size_t index(MemoryCategory category) { return static_cast<std::size_t>(category); }
constexpr auto kRelaxed = std::memory_order_relaxed;

/// The requests' total bytes, saturated at UINT64_MAX, and whether the sum wrapped past 2^64
/// (no limit holds such a total).
struct Total {
  uint64_t bytes = 0;
  bool wraps = false;
};
Total total_of(std::span<const CategoryRequest> requests) {
  Total t;
  for (const CategoryRequest &r : requests) {
    t.wraps |= r.size_bytes > UINT64_MAX - t.bytes;
    t.bytes = saturating_add(t.bytes, r.size_bytes);
  }
  return t;
}
}  // namespace

Failure MemoryBudget::refusal(const RefusalReport &report, const char *site,
                              const CategoryBytes *in_use, std::source_location where) {
  MemorySnapshot memory;
  memory.limit_bytes = limit_bytes_.load(kRelaxed);
  memory.in_use_bytes = in_use != nullptr ? *in_use : in_use_by_category();
  return budget_refusal(BudgetCheck::limit, site, report.figures, memory, report.group, where);
}

bool MemoryBudget::fits_after_reclaim(uint64_t size_bytes, uint64_t unreclaimable_bytes) const {
  const uint64_t limit = limit_bytes_.load(kRelaxed);
  return size_bytes <= limit && unreclaimable_bytes <= limit &&
         size_bytes <= limit - unreclaimable_bytes;
}

RhiExpected<Reservation> MemoryBudget::reserve(std::span<const CategoryRequest> requests,
                                               ReclaimHook &hook, const RefusalReport *report) {
  auto reservation = reserve(requests, report);
  if (reservation || reservation.error().result != RhiResult::out_of_memory) return reservation;
  const Total total = total_of(requests);  // what must fit
  if (total.wraps) return reservation;     // nothing to reclaim for what no limit holds
  // Reclaimable bytes never cause a refusal on their own: while reclaiming would make room,
  // reclaim and ask again. The retry happens even when this call reclaimed nothing itself
  // (another thread's reclaim may have finished meanwhile; the hook says whether to go on).
  for (int round = 0; round < kReclaimRounds && !reservation &&
                      reservation.error().result == RhiResult::out_of_memory &&
                      fits_after_reclaim(total.bytes, hook.unreclaimable_bytes());
       ++round) {
    ignore_result(hook.reclaim(), "asked again whatever it says: the budget decides");
    reservation = reserve(requests, report);
  }
  return reservation;
}

bool MemoryBudget::fits(uint64_t total_bytes) const {
  const uint64_t limit = limit_bytes_.load(kRelaxed);
  return total_bytes <= limit && in_use_total_.load(kRelaxed) <= limit - total_bytes;
}

RhiExpected<Reservation> MemoryBudget::reserve(MemoryCategory category, uint64_t size_bytes) {
  const CategoryRequest request{category, size_bytes};
  return reserve(std::span<const CategoryRequest>(&request, 1));
}

RhiExpected<Reservation> MemoryBudget::reserve(std::span<const CategoryRequest> requests,
                                               const RefusalReport *report) {
  constexpr const char *kSite = "MemoryBudget::reserve";
  CategoryBytes bytes{};
  uint64_t total = 0;
  bool overflow = false;
  for (const CategoryRequest &r : requests) {
    if (index(r.category) >= kNumMemoryCategories)
      return std::unexpected(invalid_usage("kiln", kSite, "no such memory category"));
    bytes[index(r.category)] += r.size_bytes;
    overflow |= total + r.size_bytes < total;
    total += r.size_bytes;
  }
  const MemoryCategory first = requests.empty() ? MemoryCategory::ndarray : requests[0].category;
  const auto refused = [&](uint64_t total_bytes) {
    refusals_.fetch_add(1, kRelaxed);
    const RefusalReport own{AllocationFigures{first, total_bytes, 0}, {}};
    return std::unexpected(refusal(report != nullptr ? *report : own, kSite));
  };
  // A refusal is decided without the lock: the total only changes under it, and a request that
  // does not fit now did not fit at the moment of that load.
  if (overflow || !fits(total)) return refused(overflow ? UINT64_MAX : total);
  if (before_lock_hook_ != nullptr) before_lock_hook_(before_lock_context_);
  std::lock_guard lock(mutex_);
  if (!fits(total)) return refused(total);
  if (under_lock_hook_ != nullptr) under_lock_hook_(under_lock_context_);
  in_use_total_.store(in_use_total_.load(kRelaxed) + total, kRelaxed);
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    if (bytes[i] != 0) current_bytes_[i].store(current_bytes_[i].load(kRelaxed) + bytes[i], kRelaxed);
  return Reservation(this, bytes);
}

void MemoryBudget::commit(const CategoryBytes &bytes) {
  std::lock_guard lock(mutex_);
  uint64_t held_total = 0;
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i) {
    committed_bytes_[i] += bytes[i];
    held_total += committed_bytes_[i];
    peak_bytes_[i] = std::max(peak_bytes_[i], committed_bytes_[i]);
  }
  peak_total_bytes_ = std::max(peak_total_bytes_, held_total);
}

void MemoryBudget::give_back(const CategoryBytes &bytes) {
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    if (bytes[i] != 0) give_back(static_cast<MemoryCategory>(i), bytes[i]);
}

void MemoryBudget::give_back(MemoryCategory category, uint64_t size_bytes) {
  if (index(category) >= kNumMemoryCategories) return;  // nothing was ever charged there
  std::lock_guard lock(mutex_);
  (void)lower_charge_locked(category, size_bytes);
}

void MemoryBudget::release(MemoryCategory category, uint64_t size_bytes) {
  if (index(category) >= kNumMemoryCategories) return;
  std::lock_guard lock(mutex_);
  auto &held = committed_bytes_[index(category)];
  held -= lower_charge_locked(category, std::min(held, size_bytes));
}

uint64_t MemoryBudget::lower_charge_locked(MemoryCategory category, uint64_t size_bytes) {
  auto &current = current_bytes_[index(category)];
  const uint64_t n =
      std::min(current.load(kRelaxed), size_bytes);  // never below zero, even on a caller's bug
  current.store(current.load(kRelaxed) - n, kRelaxed);
  in_use_total_.store(in_use_total_.load(kRelaxed) - n, kRelaxed);
  return n;
}

void MemoryBudget::set_before_lock_hook_for_testing(void (*hook)(void *context), void *context) {
  before_lock_hook_ = hook;
  before_lock_context_ = context;
}

void MemoryBudget::set_under_lock_hook_for_testing(void (*hook)(void *context), void *context) {
  under_lock_hook_ = hook;
  under_lock_context_ = context;
}

uint64_t MemoryBudget::limit_bytes() const { return limit_bytes_.load(kRelaxed); }

void MemoryBudget::set_limit_bytes(uint64_t limit_bytes) {
  std::lock_guard lock(mutex_);
  limit_bytes_.store(limit_bytes, kRelaxed);
}

uint64_t MemoryBudget::in_use_bytes() const { return in_use_total_.load(kRelaxed); }

CategoryBytes MemoryBudget::in_use_by_category() const {
  CategoryBytes out{};
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i) out[i] = current_bytes_[i].load(kRelaxed);
  return out;
}

LedgerStats MemoryBudget::stats() const {
  std::lock_guard lock(mutex_);
  LedgerStats s;
  s.current_bytes = in_use_by_category();
  s.peak_bytes = peak_bytes_;
  s.peak_total_bytes = peak_total_bytes_;
  s.limit_bytes = limit_bytes_.load(kRelaxed);
  s.refusals = refusals_.load(kRelaxed);
  return s;
}

void MemoryBudget::reset_peaks() {
  std::lock_guard lock(mutex_);
  peak_bytes_ = committed_bytes_;
  peak_total_bytes_ = 0;
  for (uint64_t b : committed_bytes_) peak_total_bytes_ += b;
}

}  // namespace kiln::runtime
