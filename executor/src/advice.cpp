#include "kiln/executor/advice.h"

#include <fmt/format.h>

namespace kiln {
namespace {

// "raise the budget (kiln.init(budget_bytes=...) or KILN_POOL_LIMIT_MB)".
std::string budget_knobs(const InterfaceKnobs &knobs) {
  return knobs.budget.empty() ? std::string("KILN_POOL_LIMIT_MB")
                              : fmt::format("{} or KILN_POOL_LIMIT_MB", knobs.budget);
}

std::string budget_advice(const Failure &failure, const InterfaceKnobs &knobs) {
  if (failure.budget_check == BudgetCheck::live_free) {
    if (knobs.reserve.empty()) return "free arrays or the device memory other processes hold";
    return fmt::format("free arrays or the device memory other processes hold, or lower the "
                       "reserve ({})", knobs.reserve);
  }
  if (failure.category == MemoryCategory::runtime_heap && !knobs.heap.empty())  // the executor's own heap
    return fmt::format("raise the budget ({}) or make the device heap smaller ({})", budget_knobs(knobs), knobs.heap);
  return fmt::format("free arrays or raise the budget ({})", budget_knobs(knobs));
}

std::string out_of_memory_advice(const Failure &failure, const InterfaceKnobs &knobs) {
  if (failure.injected) return "the fault was injected (FaultPlan): no memory setting cures it";
  switch (failure.oom_source) {
    case OomSource::budget: return budget_advice(failure, knobs);
    case OomSource::device_heap:
      return knobs.heap.empty() ? std::string("raise the device heap")
                                : fmt::format("raise the device heap ({})", knobs.heap);
    case OomSource::host:
      return "free host memory or use smaller arrays (a device budget does not limit host memory)";
    case OomSource::driver:
    case OomSource::none: break;
  }
  return fmt::format("free arrays, or set a budget below the device's free memory ({}) so that "
                     "kiln refuses before the driver does", budget_knobs(knobs));
}

}  // namespace

std::string advice_for(const Failure &failure, const InterfaceKnobs &knobs) {
  if (failure.result != RhiResult::out_of_memory) return {};
  return out_of_memory_advice(failure, knobs);
}

void advise(Failure &failure, const InterfaceKnobs &knobs) {
  if (failure.advice.empty()) failure.advice = advice_for(failure, knobs);
}

}  // namespace kiln
