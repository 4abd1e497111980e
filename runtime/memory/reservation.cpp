// Reservation: bytes the budget promised, given back unless committed (budget.h).
#include "kiln/runtime/memory/budget.h"

#include <algorithm>
#include <utility>

namespace kiln::runtime {

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
  if (budget_ != nullptr) budget_->commit(bytes_);
  budget_ = nullptr;
  bytes_ = {};
}

uint64_t Reservation::take_part(MemoryCategory category, uint64_t size_bytes) {
  auto &held = bytes_[static_cast<std::size_t>(category)];
  const uint64_t n = budget_ != nullptr ? std::min(held, size_bytes) : 0;
  held -= n;
  return n;
}

void Reservation::release_part(MemoryCategory category, uint64_t size_bytes) {
  if (const uint64_t n = take_part(category, size_bytes); n != 0) budget_->give_back(category, n);
}

void Reservation::commit_part(MemoryCategory category, uint64_t size_bytes) {
  CategoryBytes part{};
  part[static_cast<std::size_t>(category)] = take_part(category, size_bytes);
  if (part[static_cast<std::size_t>(category)] != 0) budget_->commit(part);
}

uint64_t Reservation::total_bytes() const {
  uint64_t total = 0;
  for (uint64_t b : bytes_) total += b;
  return total;
}

}  // namespace kiln::runtime
