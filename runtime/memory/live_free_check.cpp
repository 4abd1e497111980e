// The live free-memory check of DeviceMemory's growth: the device's free memory less the reserve
// must hold the growth (the producer of BudgetCheck::live_free refusals), one growing thread at a
// time from the device's answer to the driver's allocation.
#include "kiln/runtime/memory/device_memory.h"

namespace kiln::runtime {

RhiStatus DeviceMemory::check_live_free(uint64_t size_bytes, MemoryCategory category) {
  if (!live_check_) return {};
  count(kLiveChecks);
  KILN_ASSIGN_OR_RETURN(const LlvmDevice::MemoryInfo info, device_.memory_info());
  const uint64_t usable = info.free_bytes > reserve_bytes_ ? info.free_bytes - reserve_bytes_ : 0;
  if (size_bytes <= usable) return {};
  MemorySnapshot memory;
  memory.free_bytes = info.free_bytes;
  memory.total_bytes = info.total_bytes;
  memory.reserve_bytes = reserve_bytes_;
  Failure f = budget_refusal(BudgetCheck::live_free, "DeviceMemory::check_live_free", category,
                             size_bytes, memory);
  f.device = device_.name();
  return std::unexpected(std::move(f));
}

RhiStatus DeviceMemory::check_live_with_eviction(uint64_t growth_bytes, MemoryCategory category,
                                                 uint64_t requested_bytes) {
  auto live = check_live_free(growth_bytes, category);
  if (!live && live.error().result == RhiResult::out_of_memory && evict_for_retry()) {
    // Evicting gave cached blocks back to the device: ask the device once more.
    retries_.fetch_add(1, std::memory_order_relaxed);
    live = check_live_free(growth_bytes, category);
  }
  if (live) return {};
  live.error().requested_bytes = requested_bytes;
  return live;
}

std::unique_lock<std::mutex> DeviceMemory::serialize_growth() {
  return live_check_ ? std::unique_lock<std::mutex>(growth_mutex_) : std::unique_lock<std::mutex>();
}

}  // namespace kiln::runtime
