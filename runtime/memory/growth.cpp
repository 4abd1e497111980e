// DeviceMemory's growth: new device blocks for the requests the caches could not serve, at their
// size classes and, if rounding was refused, at their exact sizes; a group all or nothing. The
// budget reserves first (with this memory as its reclaim hook: evict, then ask again), then the
// live check, then the driver.
#include "kiln/runtime/memory/device_memory.h"

#include <fmt/format.h>

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

RhiExpected<DeviceAllocation> DeviceMemory::grow_one(const AllocRequest &request) {
  const uint64_t class_bytes = class_of(request.size_bytes);
  auto block = grow_one_at(request, class_bytes);
  if (!block && rounding_refused(block.error(), request.size_bytes, class_bytes)) {
    // Rounding never refuses what fits unrounded: the exact size, once (budget, live free
    // memory and driver alike). Such a block is cached under its own size.
    block = grow_one_at(request, request.size_bytes);
    if (!block && block.error().result == RhiResult::out_of_memory)
      block.error().class_bytes = class_bytes;
  }
  return block;
}

RhiExpected<DeviceAllocation> DeviceMemory::grow_one_at(const AllocRequest &request,
                                                        uint64_t block_bytes) {
  // The single-request growth path: the group path's steps without its bookkeeping vectors.
  const CategoryRequest growth{request.category, block_bytes};
  auto reservation = budget_.reserve(std::span<const CategoryRequest>(&growth, 1), *this);
  if (!reservation) {
    reservation.error().requested_bytes = request.size_bytes;
    return std::unexpected(std::move(reservation).error());
  }
  KILN_ASSIGN_OR_RETURN(const DeviceAllocation block, checked_allocate_block(request, block_bytes));
  reservation->commit();
  Cache *cache = bind_cache();
  std::lock_guard lock(mutex_);
  register_block_locked(cache, block, request.category, block_bytes);
  count(kAllocations);
  return block;
}

namespace {

uint64_t saturating_add(uint64_t a, uint64_t b) { return b > UINT64_MAX - a ? UINT64_MAX : a + b; }

}  // namespace

// A group is granted whole or not at all, so its refusal reports the whole group: the blocks it
// reused from the cache count too (they go back there, and the snapshot shows them as cache).
// Reporting only the misses would refuse less than the room the message shows. Only the budget's
// refusals are about the group; a driver's refusal (or an injected fault) is about the one block
// it refused, and keeps that block's figures.
Failure DeviceMemory::whole_group_refusal(Failure f, std::span<const AllocRequest> requests,
                                          std::span<Record *const> hit) {
  if (f.result != RhiResult::out_of_memory || !f.allocating || f.oom_source != OomSource::budget)
    return f;
  uint64_t reused_bytes = 0, reused_class_bytes = 0;
  std::size_t reused = 0;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (hit[i] == nullptr) continue;
    ++reused;
    reused_bytes = saturating_add(reused_bytes, requests[i].size_bytes);
    reused_class_bytes =
        saturating_add(reused_class_bytes, hit[i]->class_bytes.load(std::memory_order_relaxed));
  }
  if (reused == 0) return f;
  f.requested_bytes = saturating_add(f.requested_bytes, reused_bytes);
  if (f.class_bytes != 0) {  // the misses' rounding was refused too: the class of the group
    const uint64_t class_total = saturating_add(f.class_bytes, reused_class_bytes);
    f.class_bytes = class_total > f.requested_bytes ? class_total : 0;
  }
  const std::string what = f.detail.empty() ? std::string(to_string(f.category)) : f.detail;
  f.detail = fmt::format("{} ({} buffers granted together, {} of them, {}, reusable from the "
                         "pool's cache)", what, requests.size(), reused, format_bytes(reused_bytes));
  return f;
}

RhiExpected<std::vector<DeviceAllocation>> DeviceMemory::try_allocate_group(
    std::span<const AllocRequest> requests) {
  const std::size_t n = requests.size();
  std::vector<uint64_t> classes(n);
  for (std::size_t i = 0; i < n; ++i) classes[i] = class_of(requests[i].size_bytes);
  Cache *cache = bind_cache();
  // 1. Reuse: cached blocks need no budget growth and no driver call.
  std::vector<DeviceAllocation> out(n);
  std::vector<Record *> hit(n, nullptr);
  if (caching_) {
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < n; ++i) {
      hit[i] = take_cached_locked(cache, requests[i].category, requests[i].size_bytes, classes[i]);
      if (hit[i] != nullptr)
        out[i] = DeviceAllocation{&device_, hit[i]->alloc_id.load(std::memory_order_relaxed)};
    }
  }
  auto fail = [&](Failure f) -> RhiExpected<std::vector<DeviceAllocation>> {
    std::lock_guard lock(mutex_);  // the hits go back to the cache, charged as cache again
    for (std::size_t i = 0; i < n; ++i)
      if (hit[i] != nullptr) cache_freed_locked(cache, hit[i], requests[i].category);
    return std::unexpected(std::move(f));
  };
  for (std::size_t i = 0; i < n; ++i) {
    if (hit[i] == nullptr || !requests[i].zero_fill) continue;
    if (auto cleared = device_.fill_zero(out[i]); !cleared) return fail(std::move(cleared).error());
  }
  // 2. Growth: the misses at their size classes; if that is refused, at their exact sizes
  // (rounding never refuses what fits unrounded).
  std::size_t hits = 0;
  for (Record *r : hit) hits += r != nullptr;
  if (hits < n) {
    std::vector<uint64_t> block_bytes = classes;
    auto grown = grow_misses(requests, hit, block_bytes, out);
    if (!grown) {
      std::vector<uint64_t> exact(n);
      uint64_t size_total = 0, class_total = 0;  // of the misses, saturating
      for (std::size_t i = 0; i < n; ++i) {
        exact[i] = requests[i].size_bytes;
        if (hit[i] != nullptr) continue;
        size_total = exact[i] > UINT64_MAX - size_total ? UINT64_MAX : size_total + exact[i];
        class_total = classes[i] > UINT64_MAX - class_total ? UINT64_MAX : class_total + classes[i];
      }
      if (rounding_refused(grown.error(), size_total, class_total)) {
        block_bytes = exact;
        grown = grow_misses(requests, hit, block_bytes, out);
        if (!grown && grown.error().result == RhiResult::out_of_memory)
          grown.error().class_bytes = class_total;
      }
    }
    if (!grown) return fail(whole_group_refusal(std::move(grown).error(), requests, hit));
    std::lock_guard lock(mutex_);
    for (std::size_t i = 0; i < n; ++i)
      if (hit[i] == nullptr)
        register_block_locked(cache, out[i], requests[i].category, block_bytes[i]);
  }
  count(kAllocations, n);
  count(kCacheHits, hits);
  return out;
}

RhiStatus DeviceMemory::grow_misses(std::span<const AllocRequest> requests,
                                    std::span<Record *const> hit,
                                    std::span<const uint64_t> block_bytes,
                                    std::span<DeviceAllocation> out) {
  // The misses are reserved together, checked against live free memory, allocated.
  std::vector<CategoryRequest> growth;
  uint64_t growth_bytes = 0;     // what the device must give
  uint64_t requested_bytes = 0;  // what the caller asked for, as failures report it
  for (std::size_t i = 0; i < requests.size(); ++i)
    if (hit[i] == nullptr) {
      growth.push_back({requests[i].category, block_bytes[i]});
      growth_bytes += block_bytes[i];  // the budget refuses a sum that wraps before it is used
      requested_bytes = requests[i].size_bytes > UINT64_MAX - requested_bytes
                            ? UINT64_MAX
                            : requested_bytes + requests[i].size_bytes;
    }
  auto reservation = budget_.reserve(growth, *this);
  if (!reservation) {
    Failure f = std::move(reservation).error();
    f.requested_bytes = requested_bytes;
    return std::unexpected(std::move(f));
  }
  std::vector<DeviceAllocation> grown;
  auto fail = [&](Failure f) -> RhiStatus {
    for (DeviceAllocation a : grown)
      ignore_result(device_.dealloc_memory(a),
                    "error path: `f` is the answer; the device defers a refused free to "
                    "synchronize()");
    return std::unexpected(std::move(f));  // then the reservation goes
  };
  const auto growing = serialize_growth();  // held until every block is allocated
  if (auto live =
          check_live_with_eviction(growth_bytes, growth.front().category, requested_bytes);
      !live)
    return fail(std::move(live).error());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (hit[i] != nullptr) continue;
    auto block = allocate_block(requests[i], block_bytes[i]);
    if (!block) return fail(std::move(block).error());
    out[i] = *block;
    grown.push_back(*block);
  }
  reservation->commit();
  return {};
}

}  // namespace kiln::runtime
