#include "kiln/runtime/memory/device_memory.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "kiln/rhi/coarse_clock.h"
#include "thread_cache.h"

namespace kiln::runtime {

uint64_t default_reserve_bytes(uint64_t total_bytes) {
  constexpr uint64_t kFloor = 64ull << 20;
  return std::max(kFloor, total_bytes / 20);
}

RhiExpected<std::optional<uint64_t>> pool_limit_from_env() {
  const char *value = std::getenv("KILN_POOL_LIMIT_MB");
  if (value == nullptr || *value == '\0') return std::optional<uint64_t>{};
  uint64_t mb = 0;
  const char *end = value + std::strlen(value);
  auto [ptr, ec] = std::from_chars(value, end, mb);
  const bool whole = ptr == end && (ec == std::errc() || ec == std::errc::result_out_of_range);
  if (!whole)
    return std::unexpected(invalid_usage(
        "kiln", "pool_limit_from_env",
        fmt::format("KILN_POOL_LIMIT_MB='{}' is not a whole number of MiB", value)));
  if (ec != std::errc() || mb > (UINT64_MAX >> 20))
    return std::unexpected(invalid_usage(
        "kiln", "pool_limit_from_env",
        fmt::format("KILN_POOL_LIMIT_MB='{}' is too large: at most {} MiB (2**64 bytes)", value,
                    UINT64_MAX >> 20)));
  return std::optional<uint64_t>{mb << 20};
}

RhiExpected<std::unique_ptr<DeviceMemory>> DeviceMemory::create(LlvmDevice &device,
                                                               BudgetConfig config) {
  KILN_ASSIGN_OR_RETURN(const Device::MemoryInfo info, device.memory_info());
  const uint64_t reserve = config.reserve_bytes.value_or(default_reserve_bytes(info.total_bytes));
  uint64_t limit = info.total_bytes > reserve ? info.total_bytes - reserve : 0;
  if (config.limit_bytes) {
    limit = *config.limit_bytes;
  } else {
    KILN_ASSIGN_OR_RETURN(const std::optional<uint64_t> env_limit, pool_limit_from_env());
    if (env_limit) limit = *env_limit;
  }
  return std::unique_ptr<DeviceMemory>(
      new DeviceMemory(device, limit, reserve, config.live_check, config.caching));
}

MemorySnapshot DeviceMemory::snapshot() {
  MemorySnapshot m;
  fill_live_figures(m, false);
  m.limit_bytes = budget_.limit_bytes();
  m.in_use_bytes = in_use_by_category();
  return m;
}

void DeviceMemory::fill_live_figures(MemorySnapshot &memory, bool may_reuse) {
  const int64_t now_ns = coarse_now_ns();
  if (may_reuse) {
    const int64_t time_ns = reading_time_ns_.load(std::memory_order_acquire);
    if (time_ns >= 0 && now_ns - time_ns < std::chrono::nanoseconds(kLiveReadingReuse).count()) {
      memory.free_bytes = reading_free_bytes_.load(std::memory_order_relaxed);
      memory.total_bytes = reading_total_bytes_.load(std::memory_order_relaxed);
      // The clock moves a tick at a time: the reading is younger than what it says plus a tick.
      const int64_t bound_ns = std::max<int64_t>(now_ns - time_ns, 0) + coarse_resolution_ns();
      memory.live_age_ms = static_cast<uint64_t>((bound_ns + 999'999) / 1'000'000);
      return;
    }
  }
  auto info = device_.memory_info();
  if (!info) return;  // the picture goes without the device's figures
  memory.free_bytes = info->free_bytes;
  memory.total_bytes = info->total_bytes;
  memory.live_age_ms = 0;
  reading_free_bytes_.store(info->free_bytes, std::memory_order_relaxed);
  reading_total_bytes_.store(info->total_bytes, std::memory_order_relaxed);
  reading_time_ns_.store(now_ns, std::memory_order_release);
}

void DeviceMemory::annotate(Failure &failure) {
  if (failure.result == RhiResult::out_of_memory)
    fill_picture(failure, in_use_by_category());
  else if (failure.device.empty())
    failure.device = device_.name();
}

void DeviceMemory::fill_picture(Failure &failure, const CategoryBytes &in_use) {
  if (failure.device.empty()) failure.device = device_.name();
  if (!failure.has_memory || failure.memory.total_bytes == 0)
    fill_live_figures(failure.memory, failure.oom_source == OomSource::budget);
  failure.memory.limit_bytes = budget_.limit_bytes();
  failure.memory.in_use_bytes = in_use;
  failure.has_memory = true;
}

// --- the locked path -------------------------------------------------------------------------

RhiExpected<std::vector<DeviceAllocation>> DeviceMemory::allocate_group(
    std::span<const AllocRequest> requests) {
  KILN_RETURN_IF_ERROR(admit(requests));
  return allocate_admitted(requests);
}

RhiStatus DeviceMemory::check_live_free(uint64_t size_bytes, MemoryCategory category) {
  if (!live_check_) return {};
  count(kLiveChecks);
  KILN_ASSIGN_OR_RETURN(const Device::MemoryInfo info, device_.memory_info());
  const uint64_t usable = info.free_bytes > reserve_bytes_ ? info.free_bytes - reserve_bytes_ : 0;
  if (size_bytes <= usable) return {};
  Failure f;
  f.result = RhiResult::out_of_memory;
  f.oom_source = OomSource::budget;
  f.budget_check = BudgetCheck::live_free;
  f.category = category;
  f.requested_bytes = size_bytes;
  f.device = device_.name();
  f.site = "DeviceMemory::check_live_free";
  f.has_memory = true;
  f.memory.free_bytes = info.free_bytes;
  f.memory.total_bytes = info.total_bytes;
  f.memory.reserve_bytes = reserve_bytes_;
  return std::unexpected(std::move(f));
}

bool DeviceMemory::evicting_would_fit(uint64_t size_bytes, uint64_t limit_bytes,
                                      const CategoryBytes &in_use) {
  if (size_bytes > limit_bytes) return false;  // not even an empty device would do
  uint64_t held = 0;  // what eviction cannot give back
  for (std::size_t i = 0; i < in_use.size(); ++i)
    if (i != static_cast<std::size_t>(MemoryCategory::pool_cache)) held += in_use[i];
  return held <= limit_bytes && size_bytes <= limit_bytes - held;
}

bool DeviceMemory::refused_outright(uint64_t size_bytes, CategoryBytes &in_use) const {
  if (budget_.fits(size_bytes) || observer_count_.load(std::memory_order_acquire) != 0)
    return false;
  in_use = in_use_by_category();  // the refusal's picture, too
  return !evicting_would_fit(size_bytes, budget_.limit_bytes(), in_use);
}

RhiExpected<DeviceAllocation> DeviceMemory::budget_refusal(const AllocRequest &request,
                                                           const CategoryBytes &in_use) {
  // The failure is made in place, in the caller's return slot: a refusal in a loop costs about
  // what a locked pool operation does.
  RhiExpected<DeviceAllocation> refused(std::unexpect);
  Failure &f = refused.error();
  f.result = RhiResult::out_of_memory;
  f.oom_source = OomSource::budget;
  f.budget_check = BudgetCheck::limit;
  f.category = request.category;
  f.requested_bytes = request.size_bytes;
  f.site = "DeviceMemory::refused_outright";  // decided there, without MemoryBudget::reserve
  if (const uint64_t class_bytes = class_of(request.size_bytes); class_bytes > request.size_bytes)
    f.class_bytes = class_bytes;
  fill_picture(f, in_use);  // the view refused_outright took: not read twice
  count(kBudgetRefusals);
  return refused;
}

RhiExpected<Reservation> DeviceMemory::reserve_growth(std::span<const CategoryRequest> growth) {
  auto reservation = budget_.reserve(growth);
  // Cached bytes never cause a refusal on their own: while evicting them would make room, evict
  // and ask again. Other threads may take the room an eviction made and cache their blocks again
  // before this one asks, so this goes a few rounds, each evicting what they cached meanwhile.
  // The retry happens even when this thread evicted nothing: evict_for_retry returns only once
  // any eviction another thread was running has given its bytes back to the ledger.
  for (int round = 0; round < kEvictionRounds && !reservation &&
                      reservation.error().result == RhiResult::out_of_memory &&
                      reservation.error().requested_bytes <= budget_.limit_bytes() &&
                      evicting_would_fit(reservation.error().requested_bytes,
                                         budget_.limit_bytes(), in_use_by_category());
       ++round) {
    (void)evict_for_retry();
    retries_.fetch_add(1, std::memory_order_relaxed);
    reservation = budget_.reserve(growth);
  }
  return reservation;
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

RhiStatus DeviceMemory::validate(MemoryCategory category, uint64_t size_bytes) const {
  if (device_.is_lost())  // cached blocks too
    KILN_RETURN_IF_ERROR(device_.check_alive("DeviceMemory::validate"));
  const char *why = nullptr;
  if (size_bytes == 0) why = "allocation of 0 bytes";
  if (category == MemoryCategory::pool_cache) why = "pool_cache is the pool's own category";
  if (static_cast<std::size_t>(category) >= kNumMemoryCategories) why = "no such memory category";
  if (why == nullptr) return {};
  Failure f = invalid_usage(device_.name(), "DeviceMemory::validate",
                            fmt::format("{} (category {})", why, to_string(category)));
  f.category = category;
  f.requested_bytes = size_bytes;
  return std::unexpected(std::move(f));
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
      for (const AllocRequest &r : requests) (void)fault_plan_.plan_.should_fail(r.size_bytes);
    return {};
  }
  for (const AllocRequest &r : requests) {
    if (!fault_plan_.plan_.should_fail(r.size_bytes)) continue;
    driver_ooms_.fetch_add(1, std::memory_order_relaxed);
    Failure f = make_failure(RhiResult::out_of_memory, device_.name(),
                             "DeviceMemory::check_fault_plan", "");
    f.oom_source = OomSource::driver;
    f.injected = true;
    f.category = r.category;
    f.requested_bytes = r.size_bytes;
    f.driver_status = "injected fault (FaultPlan)";
    return std::unexpected(std::move(f));
  }
  return {};
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

RhiExpected<DeviceAllocation> DeviceMemory::checked_allocate_block(const AllocRequest &request,
                                                                   uint64_t class_bytes) {
  const auto growing = serialize_growth();
  KILN_RETURN_IF_ERROR(check_live_with_eviction(class_bytes, request.category, request.size_bytes));
  return allocate_block(request, class_bytes);
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
  auto reservation = reserve_growth(std::span<const CategoryRequest>(&growth, 1));
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

template <class Attempt>
auto DeviceMemory::with_observer_retry(Attempt attempt) -> decltype(attempt()) {
  auto result = attempt();
  if (!result) {
    annotate(result.error());
    if (result.error().result == RhiResult::out_of_memory && notify_observers(result.error())) {
      retries_.fetch_add(1, std::memory_order_relaxed);
      result = attempt();
      if (!result) annotate(result.error());
    }
  }
  if (!result) count_refusal(result.error());
  return result;
}

RhiExpected<DeviceAllocation> DeviceMemory::allocate_locked_path(MemoryCategory category,
                                                                 uint64_t size_bytes,
                                                                 bool zero_fill) {
  const AllocRequest request{category, size_bytes, zero_fill};
  const std::span<const AllocRequest> one(&request, 1);
  KILN_RETURN_IF_ERROR(admit(one));
  if (caching_) {
    // A single request served from a cache: no group bookkeeping.
    Cache *cache = bind_cache();
    Record *record = nullptr;
    const uint64_t class_bytes = class_of(request.size_bytes);
    if (request.size_bytes <= budget_.in_use_bytes()) {  // else no cached block is that large
      std::lock_guard lock(mutex_);
      record = take_cached_locked(cache, request.category, request.size_bytes, class_bytes);
    }
    if (record != nullptr) {
      const DeviceAllocation block{&device_, record->alloc_id.load(std::memory_order_relaxed)};
      if (request.zero_fill) {
        if (auto cleared = device_.fill_zero(block); !cleared) {
          std::lock_guard lock(mutex_);  // handed back, as the group path does (not a free)
          cache_freed_locked(cache, record, request.category);
          return std::unexpected(std::move(cleared).error());
        }
      }
      count(kAllocations);
      count(kCacheHits);
      return block;
    }
  }
  // Outright only when even the exact size does not fit: rounding never refuses.
  if (CategoryBytes in_use{}; refused_outright(request.size_bytes, in_use))
    return budget_refusal(request, in_use);
  return with_observer_retry([&] { return grow_one(request); });
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
  auto reservation = reserve_growth(growth);
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

bool DeviceMemory::notify_observers(const Failure &failure) {
  if (observer_count_.load(std::memory_order_acquire) == 0) return false;
  std::vector<OomObserver> observers;
  {
    std::lock_guard lock(observers_mutex_);
    for (const auto &[id, observer] : observers_) observers.push_back(observer);
  }
  if (observers.empty()) return false;
  const auto held = [&] {
    const CategoryBytes in_use = in_use_by_category();
    uint64_t total = 0;
    for (std::size_t i = 0; i < in_use.size(); ++i)
      if (i != static_cast<std::size_t>(MemoryCategory::pool_cache)) total += in_use[i];
    return total;
  };
  const uint64_t before = held();
  for (const OomObserver &observer : observers) observer(failure);
  return held() < before;
}

RhiStatus DeviceMemory::admit(std::span<const AllocRequest> requests) {
  for (const AllocRequest &r : requests) KILN_RETURN_IF_ERROR(validate(r.category, r.size_bytes));
  // The fault plan decides once per request; an observer that frees memory lets it through.
  auto fault = check_fault_plan(requests);
  if (fault) return {};
  annotate(fault.error());
  if (!notify_observers(fault.error())) return fault;
  retries_.fetch_add(1, std::memory_order_relaxed);
  return {};
}

RhiExpected<std::vector<DeviceAllocation>> DeviceMemory::allocate_admitted(
    std::span<const AllocRequest> requests) {
  return with_observer_retry([&] { return try_allocate_group(requests); });
}

void DeviceMemory::count_refusal(const Failure &failure) {
  if (failure.result != RhiResult::out_of_memory || failure.oom_source != OomSource::budget) return;
  if (failure.budget_check == BudgetCheck::live_free)
    live_refusals_.fetch_add(1, std::memory_order_relaxed);
  else
    count(kBudgetRefusals);
}

// Stops another thread's fast path on `cache` for a scope (mutex_ held throughout), then trims
// the cache's headroom to what it still owns and lets it go on. Null: nothing to stop.
class DeviceMemory::QuiescedCache {
 public:
  QuiescedCache(DeviceMemory &memory, Cache *cache) : memory_(memory), cache_(cache) {
    if (cache_ != nullptr) memory_.quiesce_cache_locked(*cache_);
  }
  ~QuiescedCache() {
    if (cache_ == nullptr) return;
    memory_.trim_headroom_locked(cache_);
    memory_.reopen_cache_locked(*cache_);
  }
  QuiescedCache(const QuiescedCache &) = delete;
  QuiescedCache &operator=(const QuiescedCache &) = delete;

 private:
  DeviceMemory &memory_;
  Cache *cache_;
};

RhiStatus DeviceMemory::free_locked_path(DeviceAllocation alloc) {
  Cache *cache = caching_ ? bind_cache() : nullptr;
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
    set_owner_locked(record, nullptr);
    blocks_->remove(record);
  }
  auto freed = device_.dealloc_memory(alloc);  // device first, then the ledger (see release_cached)
  std::lock_guard lock(mutex_);
  if (freed) release_charge_locked(*record, category);  // a failed free stays charged
  blocks_->recycle(record);
  return freed;
}

RhiStatus DeviceMemory::charge(MemoryCategory category, uint64_t size_bytes) {
  if (category >= MemoryCategory::pool_cache) {  // the pool's own, or no category at all
    Failure f = invalid_usage(device_.name(), "DeviceMemory::charge",
                              fmt::format("cannot charge category {}", to_string(category)));
    f.category = category;
    f.requested_bytes = size_bytes;
    return std::unexpected(std::move(f));
  }
  const CategoryRequest request{category, size_bytes};
  auto reservation = reserve_growth(std::span<const CategoryRequest>(&request, 1));
  if (!reservation) {
    annotate(reservation.error());
    count_refusal(reservation.error());
    return std::unexpected(std::move(reservation).error());
  }
  reservation->commit();
  Cache *cache = caching_ ? my_cache() : nullptr;
  std::lock_guard lock(mutex_);
  reclaim_headroom_locked(cache, category);
  raise_peak_locked(category);
  return {};
}

void DeviceMemory::uncharge(MemoryCategory category, uint64_t size_bytes) {
  if (category < MemoryCategory::pool_cache) budget_.release(category, size_bytes);
}

uint64_t DeviceMemory::add_oom_observer(OomObserver observer) {
  std::lock_guard lock(observers_mutex_);
  observers_.emplace_back(next_observer_id_, std::move(observer));
  observer_count_.store(observers_.size(), std::memory_order_release);
  return next_observer_id_++;
}

bool DeviceMemory::remove_oom_observer(uint64_t id) {
  std::lock_guard lock(observers_mutex_);
  const bool removed =
      std::erase_if(observers_, [id](const auto &entry) { return entry.first == id; }) > 0;
  observer_count_.store(observers_.size(), std::memory_order_release);
  return removed;
}

}  // namespace kiln::runtime
