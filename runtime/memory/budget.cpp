#include "kiln/runtime/memory/budget.h"

#include <algorithm>

namespace kiln::runtime {

uint64_t LedgerStats::current_total_bytes() const {
  uint64_t total = 0;
  for (uint64_t b : current_bytes) total += b;
  return total;
}

Reservation::Reservation(Reservation &&other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)), bytes_(std::exchange(other.bytes_, {})) {}

Reservation &Reservation::operator=(Reservation &&other) noexcept {
  if (this != &other) {
    if (budget_ != nullptr) budget_->give_back(bytes_);
    budget_ = std::exchange(other.budget_, nullptr);
    bytes_ = std::exchange(other.bytes_, {});
  }
  return *this;
}

Reservation::~Reservation() {
  if (budget_ != nullptr) budget_->give_back(bytes_);
}

void Reservation::commit() {
  budget_ = nullptr;
  bytes_ = {};
}

void Reservation::release_part(MemoryCategory category, uint64_t size_bytes) {
  auto &held = bytes_[static_cast<std::size_t>(category)];
  const uint64_t n = std::min(held, size_bytes);
  if (budget_ == nullptr || n == 0) return;
  held -= n;
  budget_->release(category, n);
}

uint64_t Reservation::total_bytes() const {
  uint64_t total = 0;
  for (uint64_t b : bytes_) total += b;
  return total;
}

Failure MemoryBudget::refusal(uint64_t requested_bytes, MemoryCategory category) const {
  Failure f;
  f.result = RhiResult::out_of_memory;
  f.oom_source = OomSource::budget;
  f.category = category;
  f.requested_bytes = requested_bytes;
  f.site = "MemoryBudget::reserve";
  f.has_memory = true;
  f.memory.limit_bytes = limit_bytes_;
  f.memory.in_use_bytes = stats_.current_bytes;
  return f;
}

RhiExpected<Reservation> MemoryBudget::reserve(MemoryCategory category, uint64_t size_bytes) {
  const CategoryRequest request{category, size_bytes};
  return reserve(std::span<const CategoryRequest>(&request, 1));
}

RhiExpected<Reservation> MemoryBudget::reserve(std::span<const CategoryRequest> requests) {
  CategoryBytes bytes{};
  uint64_t total = 0;
  bool overflow = false;
  for (const CategoryRequest &r : requests) {
    bytes[static_cast<std::size_t>(r.category)] += r.size_bytes;
    overflow |= total + r.size_bytes < total;
    total += r.size_bytes;
  }
  const MemoryCategory first = requests.empty() ? MemoryCategory::ndarray : requests[0].category;
  std::lock_guard lock(mutex_);
  if (overflow || total > limit_bytes_ || in_use_total_ > limit_bytes_ - total) {
    ++stats_.refusals;
    return std::unexpected(refusal(overflow ? UINT64_MAX : total, first));
  }
  in_use_total_ += total;
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i) {
    stats_.current_bytes[i] += bytes[i];
    stats_.peak_bytes[i] = std::max(stats_.peak_bytes[i], stats_.current_bytes[i]);
  }
  stats_.peak_total_bytes = std::max(stats_.peak_total_bytes, in_use_total_);
  return Reservation(this, bytes);
}

void MemoryBudget::give_back(const CategoryBytes &bytes) {
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    if (bytes[i] != 0) release(static_cast<MemoryCategory>(i), bytes[i]);
}

void MemoryBudget::release(MemoryCategory category, uint64_t size_bytes) {
  std::lock_guard lock(mutex_);
  auto &current = stats_.current_bytes[static_cast<std::size_t>(category)];
  const uint64_t n = std::min(current, size_bytes);  // never below zero, even on a caller's bug
  current -= n;
  in_use_total_ -= n;
}

void MemoryBudget::transfer(MemoryCategory from, MemoryCategory to, uint64_t size_bytes) {
  std::lock_guard lock(mutex_);
  auto &src = stats_.current_bytes[static_cast<std::size_t>(from)];
  auto &dst = stats_.current_bytes[static_cast<std::size_t>(to)];
  const uint64_t n = std::min(src, size_bytes);
  src -= n;
  dst += n;
  auto &peak = stats_.peak_bytes[static_cast<std::size_t>(to)];
  peak = std::max(peak, dst);
}

uint64_t MemoryBudget::limit_bytes() const {
  std::lock_guard lock(mutex_);
  return limit_bytes_;
}

void MemoryBudget::set_limit_bytes(uint64_t limit_bytes) {
  std::lock_guard lock(mutex_);
  limit_bytes_ = limit_bytes;
}

uint64_t MemoryBudget::in_use_bytes() const {
  std::lock_guard lock(mutex_);
  return in_use_total_;
}

CategoryBytes MemoryBudget::in_use_by_category() const {
  std::lock_guard lock(mutex_);
  return stats_.current_bytes;
}

LedgerStats MemoryBudget::stats() const {
  std::lock_guard lock(mutex_);
  LedgerStats s = stats_;
  s.limit_bytes = limit_bytes_;
  return s;
}

void MemoryBudget::reset_peaks() {
  std::lock_guard lock(mutex_);
  stats_.peak_bytes = stats_.current_bytes;
  stats_.peak_total_bytes = in_use_total_;
}

}  // namespace kiln::runtime
