// The live free-memory check of BudgetAdaptor's growth: the device's free memory less the reserve
// must hold the growth (the producer of BudgetCheck::live_free refusals), one growing thread at a
// time from the device's answer to the driver's allocation.
#include "kiln/runtime/memory/budget_adaptor.h"

#include <string>

namespace kiln::runtime {

namespace {

// What a growth is for, as a context line names it: "ndarray", or "a group of 3 buffers".
std::string growth_of(const RefusalReport &report) {
  if (report.group.buffers > 1) return fmt::format("a group of {} buffers", report.group.buffers);
  return std::string(to_string(report.figures.category));
}

}  // namespace

RhiStatus BudgetAdaptor::check_live_free(uint64_t growth_bytes, const RefusalReport &report) {
  if (!live_check_) return {};
  const auto ask = [&]() -> RhiStatus {
    counters_.live_checks.fetch_add(1, std::memory_order_relaxed);
    KILN_ASSIGN_OR_RETURN_CONTEXT(const LlvmDevice::MemoryInfo info, device_.memory_info(),
                                  "reading free device memory before growing {} for {}",
                                  format_bytes(growth_bytes), growth_of(report));
    const uint64_t usable = info.free_bytes > reserve_bytes_ ? info.free_bytes - reserve_bytes_ : 0;
    if (growth_bytes <= usable) return {};
    MemorySnapshot memory;
    memory.free_bytes = info.free_bytes;
    memory.total_bytes = info.total_bytes;
    memory.device_read = true;
    memory.reserve_bytes = reserve_bytes_;
    Failure f = budget_refusal(BudgetCheck::live_free, "BudgetAdaptor::check_live_free",
                               report.figures, memory, report.group);
    f.device = device_.name();
    return std::unexpected(std::move(f));
  };
  auto live = ask();
  if (!live && live.error().result == RhiResult::out_of_memory && owner_.evict_for_retry()) {
    // Evicting gave cached blocks back to the device: ask the device once more.
    counters_.retries.fetch_add(1, std::memory_order_relaxed);
    live = ask();
  }
  return live;
}

std::unique_lock<std::mutex> BudgetAdaptor::serialize_growth() {
  return live_check_ ? std::unique_lock<std::mutex>(growth_mutex_) : std::unique_lock<std::mutex>();
}

void BudgetAdaptor::reinit_after_fork() {
  growth_mutex_.~mutex();
  new (&growth_mutex_) std::mutex();
}

}  // namespace kiln::runtime
