// Budget refusals decided before any growth (refuses_outright: no eviction and no observer can
// help) and the count of refusals returned to callers. The failures themselves are built by the
// budget (MemoryBudget::refusal) and the live check (live_free_check.cpp).
#include "kiln/runtime/memory/device_memory.h"

#include "thread_cache.h"

namespace kiln::runtime {

uint64_t DeviceMemory::unreclaimable_bytes(const CategoryBytes &in_use) {
  uint64_t held = 0;  // what eviction cannot give back
  for (std::size_t i = 0; i < in_use.size(); ++i)
    if (i != static_cast<std::size_t>(MemoryCategory::pool_cache)) held += in_use[i];
  return held;
}

bool DeviceMemory::refuses_outright(uint64_t size_bytes, CategoryBytes &in_use) const {
  if (budget_.fits(size_bytes) || !observers_.empty()) return false;
  in_use = in_use_by_category();  // the refusal's picture, too
  return !budget_.fits_after_reclaim(size_bytes, unreclaimable_bytes(in_use));
}

Failure DeviceMemory::refused_outright(const Misses &misses, const CategoryBytes &in_use) {
  // Decided by refuses_outright, without MemoryBudget::reserve; built by the budget all the same.
  Failure f = budget_.refusal(misses.size_bytes, misses.category, "DeviceMemory::refused_outright",
                              &in_use);
  if (misses.class_bytes > misses.size_bytes) f.class_bytes = misses.class_bytes;
  fill_picture(f, in_use);  // the view refuses_outright took: not read twice
  count(kBudgetRefusals);
  return f;
}

void DeviceMemory::count_refusal(const Failure &failure) {
  if (failure.result != RhiResult::out_of_memory || failure.oom_source != OomSource::budget) return;
  if (failure.budget_check == BudgetCheck::live_free)
    live_refusals_.fetch_add(1, std::memory_order_relaxed);
  else
    count(kBudgetRefusals);
}

}  // namespace kiln::runtime
