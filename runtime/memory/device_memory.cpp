// DeviceMemory's facade: create, the failure picture, admission to the locked allocation path
// (validate, the fault plan, observers; the path itself is allocation_path.cpp), free's locked
// path, and charges outside blocks.
#include "kiln/runtime/memory/device_memory.h"

#include <fmt/format.h>

#include "thread_cache.h"

namespace kiln::runtime {

RhiExpected<std::unique_ptr<DeviceMemory>> DeviceMemory::create(LlvmDevice &device,
                                                               BudgetConfig config) {
  KILN_ASSIGN_OR_RETURN(const LlvmDevice::MemoryInfo info, device.memory_info());
  KILN_ASSIGN_OR_RETURN(const BudgetFigures figures, budget_figures(config, info.total_bytes));
  return std::unique_ptr<DeviceMemory>(new DeviceMemory(
      device, figures.limit_bytes, figures.reserve_bytes, config.live_check, config.caching));
}

MemorySnapshot DeviceMemory::snapshot() {
  MemorySnapshot m;
  picture_.fill_live_figures(m, false, device_);
  m.limit_bytes = limit_bytes();
  m.in_use_bytes = in_use_by_category();
  return m;
}

void DeviceMemory::annotate(Failure &failure) {
  if (failure.result == RhiResult::out_of_memory)
    fill_picture(failure, in_use_by_category());
  else if (failure.device.empty())
    failure.device = device_.name();
}

void DeviceMemory::fill_picture(Failure &failure, const CategoryBytes &in_use) {
  if (failure.device.empty()) failure.device = device_.name();
  if (!failure.memory.device_read)  // also when it has no picture yet: device_read is false
    picture_.fill_live_figures(failure.memory, failure.oom_source == OomSource::budget, device_);
  failure.memory.limit_bytes = limit_bytes();
  failure.memory.in_use_bytes = in_use;
  failure.has_memory = true;
}

// --- the locked path -------------------------------------------------------------------------

RhiStatus DeviceMemory::validate(MemoryCategory category, uint64_t size_bytes) const {
  if (device_.is_lost())  // cached blocks too
    KILN_RETURN_IF_ERROR(device_.check_alive("DeviceMemory::validate"));
  const char *why = nullptr;
  if (size_bytes == 0) why = "allocation of 0 bytes";
  if (category == MemoryCategory::pool_cache) why = "pool_cache is the pool's own category";
  if (static_cast<std::size_t>(category) >= kNumMemoryCategories) why = "no such memory category";
  if (why == nullptr) return {};
  return std::unexpected(invalid_request(device_.name(), "DeviceMemory::validate",
                                         fmt::format("{} (category {})", why, to_string(category)),
                                         AllocationFigures{category, size_bytes, 0}));
}

uint64_t DeviceMemory::class_of(uint64_t size_bytes) const {
  const uint64_t rounded = caching_ ? CachingPool::size_class(size_bytes) : 0;
  return rounded != 0 ? rounded : size_bytes;
}

RhiStatus DeviceMemory::check_fault_plan(std::span<const AllocRequest> requests) {
  if (!fault_plan_.armed()) {
    // Disarmed: only count, in this thread's cache when it has one (no read-modify-write).
    if (Cache *cache = my_cache(); cache != nullptr)
      Cache::add(cache->requests, requests.size());
    else
      fault_plan_.count(requests);
    return {};
  }
  const RequestFaultPlan::Refusal refused = fault_plan_.first_refused(requests);
  if (!refused) return {};
  if (refused.kind == FaultKind::lost) {
    // A sticky fault, as a driver's: the device is lost for every later call (fast path too).
    Failure lost = injected_device_lost(device_.name(), "DeviceMemory::check_fault_plan",
                                        refused.request->category, refused.request->size_bytes);
    device_.mark_lost(lost);
    return std::unexpected(std::move(lost));
  }
  adaptor_.counters().driver_ooms.fetch_add(1, std::memory_order_relaxed);
  return std::unexpected(
      injected_fault(device_.name(), "DeviceMemory::check_fault_plan",
                     AllocationFigures{refused.request->category, refused.request->size_bytes, 0}));
}

RhiStatus DeviceMemory::check_not_observing() const {
  if (!observers_.observing_here()) [[likely]]
    return {};
  return std::unexpected(invalid_usage(
      device_.name(), "DeviceMemory::check_not_observing",
      "an OOM observer may not allocate on the device it observes (it runs while an allocation "
      "there is being refused; free memory instead)"));
}

bool DeviceMemory::notify_observers(const Failure &failure) {
  if (observers_.empty()) return false;
  // While they run, this thread's allocations here take the locked path, which refuses them
  // (check_not_observing): its fast path forgets this memory's cache until they return.
  detail::forget_binding(id_);
  const bool freed = observers_.notify(
      failure, [this] { return BudgetAdaptor::unreclaimable_bytes(in_use_by_category()); });
  ignore_result(my_cache(), "called to bind this thread's fast path to its cache again, now that "
                            "the observers are done");
  return freed;
}

RhiStatus DeviceMemory::admit(std::span<const AllocRequest> requests) {
  KILN_RETURN_IF_ERROR(check_not_observing());
  for (const AllocRequest &r : requests) KILN_RETURN_IF_ERROR(validate(r.category, r.size_bytes));
  // The fault plan decides once per request; an observer that frees memory lets it through.
  auto fault = check_fault_plan(requests);
  if (fault) return {};
  if (fault.error().result != RhiResult::out_of_memory) return fault;  // lost: no observer cures it
  annotate(fault.error());
  if (!notify_observers(fault.error())) return fault;
  adaptor_.counters().retries.fetch_add(1, std::memory_order_relaxed);
  return {};
}

// Stops another thread's fast path on `cache` for a scope (mutex_ held throughout), then trims
// the cache's headroom to what it still owns and lets it go on. Null: nothing to stop.
class DeviceMemory::QuiescedCache {
 public:
  QuiescedCache(DeviceMemory &memory, Cache *cache) : memory_(memory), cache_(cache) {
    if (cache_ != nullptr) cache_->quiesce();
  }
  ~QuiescedCache() {
    if (cache_ == nullptr) return;
    cache_->trim_headroom();
    cache_->reopen();
  }
  QuiescedCache(const QuiescedCache &) = delete;
  QuiescedCache &operator=(const QuiescedCache &) = delete;

 private:
  DeviceMemory &memory_;
  Cache *cache_;
};

RhiStatus DeviceMemory::free_locked_path(DeviceAllocation alloc) {
  // Inside an OOM observer this thread's cache is not bound (its allocations are refused), but a
  // free still goes to it: no quiescing of its own cache, and the block stays this thread's.
  Cache *cache = !caching_                      ? nullptr
                 : observers_.observing_here() ? detail::owned_cache(id_)
                                               : bind_cache();
  Record *record = nullptr;
  MemoryCategory category{};
  {
    std::lock_guard lock(mutex_);
    record = alloc.device == &device_ ? blocks_->find(alloc.alloc_id) : nullptr;
    // A block another live thread's cache owns: that thread may be freeing it lock-free this
    // very moment (a racing double free). Stop its fast path first, so one of the two frees
    // sees the other. (With caching off no fast path runs: nothing to stop.)
    Cache *owner = record != nullptr ? record->owner.load(std::memory_order_relaxed) : nullptr;
    const QuiescedCache quiesced(*this, caching_ && owner != cache ? owner : nullptr);
    if (record == nullptr ||
        record->category.load(std::memory_order_relaxed) == MemoryCategory::pool_cache)
      return std::unexpected(invalid_usage(
          device_.name(), "DeviceMemory::free",
          fmt::format("allocation {} is not live here (freed twice, or never allocated)",
                      alloc.alloc_id)));
    category = record->category.load(std::memory_order_relaxed);
    count(kFrees);
    if (caching_) {
      cache_freed_locked(cache, record, category);
      return {};
    }
    detail::set_owner(*record, nullptr);
    blocks_->remove(record);
  }
  auto freed = device_.dealloc_memory(alloc);  // device first, then the ledger (see release_cached)
  std::lock_guard lock(mutex_);
  if (freed) release_charge_locked(*record, category);  // a failed free stays charged
  blocks_->recycle(record);
  return freed;
}

RhiStatus DeviceMemory::charge(MemoryCategory category, uint64_t size_bytes) {
  KILN_RETURN_IF_ERROR(check_not_observing());  // a charge is an allocation, too
  KILN_RETURN_IF_ERROR(device_.check_alive("DeviceMemory::charge"));  // nothing to charge it for
  if (category >= MemoryCategory::pool_cache)  // the pool's own, or no category at all
    return std::unexpected(invalid_request(device_.name(), "DeviceMemory::charge",
                                           fmt::format("cannot charge category {}", to_string(category)),
                                           AllocationFigures{category, size_bytes, 0}));
  KILN_RETURN_IF_ERROR(adaptor_.charge(category, size_bytes));
  Cache *cache = caching_ ? my_cache() : nullptr;
  std::lock_guard lock(mutex_);
  if (cache != nullptr) cache->reclaim_headroom(category);
  raise_peak_locked(category);
  return {};
}

void DeviceMemory::uncharge(MemoryCategory category, uint64_t size_bytes) {
  if (category < MemoryCategory::pool_cache) adaptor_.budget().release(category, size_bytes);
}

}  // namespace kiln::runtime
