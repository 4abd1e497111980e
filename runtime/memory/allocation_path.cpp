// DeviceMemory's one locked allocation path, for a single request and a group alike: admitted
// requests are served from the caches where they can be; the misses grow together, all or
// nothing, or are refused outright when no eviction or observer could help (both decided by the
// budget adaptor); an out-of-memory failure goes to the OOM observers, and is tried once more if
// they freed memory.
#include "kiln/runtime/memory/device_memory.h"

#include "thread_cache.h"

namespace kiln::runtime {

template <class Result>
Result DeviceMemory::allocate_requests(std::span<const AllocRequest> requests,
                                       std::span<Slot> slots, std::span<CategoryRequest> growth) {
  // Every return is a prvalue or the one named result (allocate_admitted's): a refusal's Failure
  // is built in the caller's result, never moved on the way.
  if (auto admitted = admit(requests); !admitted)
    return Result(std::unexpect, std::move(admitted).error());
  return allocate_admitted<Result>(requests, slots, growth);
}

template <class Result>
Result DeviceMemory::allocate_admitted(std::span<const AllocRequest> requests,
                                       std::span<Slot> slots, std::span<CategoryRequest> growth) {
  Cache *cache = bind_cache();
  bool outright = false;
  Result result = try_requests<Result>(cache, requests, slots, growth, outright);
  if (result || outright) return result;  // an outright refusal is annotated and counted
  annotate(result.error());
  // An out-of-memory failure goes to the observers; if they freed memory, once more.
  if (result.error().result == RhiResult::out_of_memory && notify_observers(result.error())) {
    adaptor_.counters().retries.fetch_add(1, std::memory_order_relaxed);
    result = try_requests<Result>(cache, requests, slots, growth, outright);
    // Outright this time too when the observers are gone by now (one removed itself).
    if (result || outright) return result;
    annotate(result.error());
  }
  adaptor_.count_refusal(result.error());
  return result;
}

template <class Result>
Result DeviceMemory::try_requests(Cache *cache, std::span<const AllocRequest> requests,
                                  std::span<Slot> slots, std::span<CategoryRequest> growth,
                                  bool &outright) {
  for (std::size_t i = 0; i < requests.size(); ++i)
    slots[i] = Slot{class_of(requests[i].size_bytes), 0, nullptr, {}};
  // 1. Reuse: cached blocks need no budget growth and no driver call.
  const Hits hits = take_cached(cache, requests, slots);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (slots[i].hit == nullptr || !requests[i].zero_fill) continue;
    if (auto cleared = device_.fill_zero(slots[i].block); !cleared) {
      give_back_hits(cache, requests, slots);  // handed back to the cache, not freed
      return Result(std::unexpect, std::move(cleared).error());
    }
  }
  // 2. Growth for the misses, or their refusal. A failure holds nothing: the hits go back to the
  // cache before anyone (observers, the caller) sees its picture.
  if (hits.count < requests.size()) {
    // Outright only when nothing was reused (nothing to hand back, and the misses are the whole
    // request) and no observer could free memory.
    const auto misses = BudgetAdaptor::Misses::of(requests, slots);
    if (CategoryBytes held{};
        hits.count == 0 && adaptor_.refuses_outright(misses, !observers_.empty(), held)) {
      outright = true;
      return Result(std::unexpect, adaptor_.refused_outright(misses, held));
    }
    if (auto grown = adaptor_.grow(requests, slots, growth, misses, ReusedBlocks::of(requests, slots));
        !grown) {
      give_back_hits(cache, requests, slots);
      return Result(std::unexpect, std::move(grown).error());
    }
  }
  if (!hits.live) {
    std::lock_guard lock(mutex_);
    go_live_locked(cache, requests, slots);
  }
  count(kAllocations, requests.size());
  if (hits.count != 0) count(kCacheHits, hits.count);
  return Result();
}

void DeviceMemory::go_live_locked(Cache *cache, std::span<const AllocRequest> requests,
                                  std::span<Slot> slots) {
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (slots[i].hit != nullptr)
      slots[i].hit->category.store(requests[i].category, std::memory_order_relaxed);
    else
      register_block_locked(cache, slots[i].block, requests[i].category, slots[i].block_bytes);
  }
}

// Flattened, with take_cached always inlined: the one path then costs a single request what the
// hand-written single-request path did (callgrind, instructions per call: pool hit 778 before the
// paths became one, 956 as separate calls, 816 flattened; budget refusal 1448, 1623, 1476).
[[gnu::flatten]] RhiExpected<DeviceAllocation> DeviceMemory::allocate_locked_path(
    MemoryCategory category, uint64_t size_bytes, bool zero_fill) {
  const AllocRequest request{category, size_bytes, zero_fill};
  const std::span<const AllocRequest> one(&request, 1);
  Slot slot;  // one request's bookkeeping on the stack: no heap allocation on this path
  CategoryRequest growth;
  // The result is built where it is returned (one return: the named value's copy is elided).
  auto result = allocate_requests<RhiExpected<DeviceAllocation>>(one, std::span(&slot, 1),
                                                                 std::span(&growth, 1));
  if (result) *result = slot.block;
  return result;
}

RhiExpected<std::vector<DeviceAllocation>> DeviceMemory::allocate_group(
    std::span<const AllocRequest> requests) {
  std::vector<Slot> slots(requests.size());
  std::vector<CategoryRequest> growth(requests.size());
  KILN_RETURN_IF_ERROR(allocate_requests<RhiStatus>(requests, slots, growth));
  std::vector<DeviceAllocation> out(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) out[i] = slots[i].block;
  return out;
}

[[gnu::always_inline]] inline DeviceMemory::Hits DeviceMemory::take_cached(
    Cache *cache, std::span<const AllocRequest> requests, std::span<Slot> slots) {
  if (!caching_) return {};
  const uint64_t held_bytes = in_use_bytes();  // no cached block is larger
  bool any = false;
  for (const AllocRequest &r : requests) any |= r.size_bytes <= held_bytes;
  if (!any) return {};
  Hits hits;
  bool pending = false;  // a miss to grow or a hit to clear first: either may hand the hits back
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < requests.size(); ++i) {
    Slot &slot = slots[i];
    slot.hit = take_cached_locked(cache, requests[i].category, requests[i].size_bytes,
                                  slot.class_bytes);
    if (slot.hit == nullptr) {
      pending = true;
      continue;
    }
    slot.block = DeviceAllocation{&device_, slot.hit->alloc_id.load(std::memory_order_relaxed)};
    pending |= requests[i].zero_fill;
    ++hits.count;
  }
  if (pending) return hits;
  for (std::size_t i = 0; i < requests.size(); ++i)  // all hits, none to clear: live right away
    slots[i].hit->category.store(requests[i].category, std::memory_order_relaxed);
  hits.live = true;
  return hits;
}

void DeviceMemory::give_back_hits(Cache *cache, std::span<const AllocRequest> requests,
                                  std::span<Slot> slots) {
  std::lock_guard lock(mutex_);  // charged as cache again
  for (std::size_t i = 0; i < requests.size(); ++i)
    if (slots[i].hit != nullptr) cache_freed_locked(cache, slots[i].hit, requests[i].category);
}

}  // namespace kiln::runtime
