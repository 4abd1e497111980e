// DeviceMemory's growth: new device blocks for the requests the caches could not serve, at their
// size classes and, if rounding was refused, at their exact sizes; all or nothing. The budget
// reserves first (with this memory as its reclaim hook: evict, then ask again), then the live
// check, then the driver.
#include "kiln/runtime/memory/device_memory.h"

#include "thread_cache.h"

namespace kiln::runtime {

uint64_t DeviceMemory::unreclaimable_bytes() const {
  return unreclaimable_bytes(in_use_by_category());
}

bool DeviceMemory::reclaim() {
  // Other threads may take the room an eviction made and cache their blocks again before this
  // one asks: the budget goes a few rounds, each evicting what they cached meanwhile.
  // evict_for_retry returns only once any eviction another thread was running has given its
  // bytes back to the ledger.
  const bool evicted = evict_for_retry();
  retries_.fetch_add(1, std::memory_order_relaxed);
  return evicted;
}

RhiExpected<DeviceAllocation> DeviceMemory::allocate_block(const AllocRequest &request,
                                                           uint64_t class_bytes) {
  LlvmRuntimeAllocParams params;
  params.size_bytes = class_bytes;
  params.category = request.category;
  params.zero_fill = request.zero_fill;
  auto alloc = device_.allocate_runtime(params);
  if (!alloc && alloc.error().result == RhiResult::out_of_memory) {
    driver_ooms_.fetch_add(1, std::memory_order_relaxed);
    if (evict_for_retry()) {  // the driver said no: give the cache back and try once more
      retries_.fetch_add(1, std::memory_order_relaxed);
      alloc = device_.allocate_runtime(params);
      if (!alloc && alloc.error().result == RhiResult::out_of_memory)
        driver_ooms_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (alloc) return alloc;
  alloc.error().requested_bytes = request.size_bytes;
  return alloc;
}

bool DeviceMemory::rounding_refused(const Failure &failure, uint64_t size_bytes,
                                    uint64_t class_bytes) {
  if (class_bytes == size_bytes || failure.result != RhiResult::out_of_memory) return false;
  // The limit or the live check refused the class: they decide the exact size just as surely.
  if (failure.oom_source == OomSource::budget) return true;
  // The driver refused the class: rounding was the cause only if, by the device's own account,
  // the exact size fits and the class does not (an injected or other refusal stays one).
  if (failure.oom_source != OomSource::driver || failure.injected) return false;
  const auto info = device_.memory_info();
  return info && size_bytes <= info->free_bytes && info->free_bytes < class_bytes;
}

RhiStatus DeviceMemory::grow(std::span<const AllocRequest> requests, std::span<Slot> slots,
                             std::span<CategoryRequest> growth, const Misses &misses) {
  for (Slot &slot : slots) slot.block_bytes = slot.class_bytes;
  auto grown = grow_misses(requests, slots, growth);
  if (grown || !rounding_refused(grown.error(), misses.size_bytes, misses.class_bytes))
    return grown;
  // Rounding never refuses what fits unrounded: the exact sizes, once (budget, live free memory
  // and driver alike). Such blocks are cached under their own sizes.
  for (std::size_t i = 0; i < requests.size(); ++i) slots[i].block_bytes = requests[i].size_bytes;
  grown = grow_misses(requests, slots, growth);
  if (!grown && grown.error().result == RhiResult::out_of_memory)
    grown.error().class_bytes = misses.class_bytes;
  return grown;
}

RhiStatus DeviceMemory::grow_misses(std::span<const AllocRequest> requests, std::span<Slot> slots,
                                    std::span<CategoryRequest> growth) {
  // The misses are reserved together, checked against live free memory, allocated.
  std::size_t n_growth = 0;
  uint64_t growth_bytes = 0;     // what the device must give
  uint64_t requested_bytes = 0;  // what the caller asked for, as failures report it
  for (std::size_t i = 0; i < requests.size(); ++i)
    if (slots[i].hit == nullptr) {
      growth[n_growth++] = {requests[i].category, slots[i].block_bytes};
      growth_bytes += slots[i].block_bytes;  // the budget refuses a sum that wraps before it is used
      requested_bytes = requests[i].size_bytes > UINT64_MAX - requested_bytes
                            ? UINT64_MAX
                            : requested_bytes + requests[i].size_bytes;
    }
  auto reservation = budget_.reserve(growth.first(n_growth), *this);
  if (!reservation) {
    Failure f = std::move(reservation).error();
    f.requested_bytes = requested_bytes;
    return std::unexpected(std::move(f));
  }
  const auto growing = serialize_growth();  // held until every block is allocated
  KILN_RETURN_IF_ERROR(check_live_with_eviction(growth_bytes, growth.front().category,
                                                requested_bytes));
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (slots[i].hit != nullptr) continue;
    auto block = allocate_block(requests[i], slots[i].block_bytes);
    if (!block) {
      free_grown(slots.first(i));
      return std::unexpected(std::move(block).error());  // then the reservation goes
    }
    slots[i].block = *block;
  }
  reservation->commit();
  return {};
}

void DeviceMemory::free_grown(std::span<const Slot> slots) {
  for (const Slot &slot : slots)
    if (slot.hit == nullptr)
      ignore_result(device_.dealloc_memory(slot.block),
                    "error path: the refusal is the answer; the device defers a refused free to "
                    "synchronize()");
}

}  // namespace kiln::runtime
