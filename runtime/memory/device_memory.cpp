#include "kiln/runtime/memory/device_memory.h"

#include <charconv>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

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
  if (ec != std::errc() || ptr != end || mb > (UINT64_MAX >> 20))
    return std::unexpected(invalid_usage(
        "kiln", "pool_limit_from_env",
        fmt::format("KILN_POOL_LIMIT_MB='{}' is not a whole number of MiB", value)));
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
  return std::unique_ptr<DeviceMemory>(new DeviceMemory(device, limit, reserve, config.live_check));
}

DeviceMemory::DeviceMemory(LlvmDevice &device, uint64_t limit_bytes, uint64_t reserve_bytes,
                           bool live_check)
    : device_(device), budget_(limit_bytes), reserve_bytes_(reserve_bytes), live_check_(live_check) {}

DeviceMemory::~DeviceMemory() {
  // Whatever is still live is given back to the device: nothing outlives its allocator.
  std::unordered_map<uint64_t, AllocRequest> live;
  {
    std::lock_guard lock(mutex_);
    live.swap(live_);
  }
  for (const auto &[id, request] : live) (void)device_.dealloc_memory(DeviceAllocation{&device_, id});
}

MemorySnapshot DeviceMemory::snapshot() {
  MemorySnapshot m;
  if (auto info = device_.memory_info()) {
    m.free_bytes = info->free_bytes;
    m.total_bytes = info->total_bytes;
  }
  m.limit_bytes = budget_.limit_bytes();
  m.in_use_bytes = budget_.in_use_by_category();
  return m;
}

void DeviceMemory::annotate(Failure &failure) {
  if (failure.device.empty()) failure.device = device_.name();
  if (failure.result != RhiResult::out_of_memory) return;
  const uint64_t limit = failure.has_memory ? failure.memory.limit_bytes : 0;
  failure.memory = snapshot();
  if (limit != 0) failure.memory.limit_bytes = limit;
  failure.has_memory = true;
}

RhiStatus DeviceMemory::check_live_free(uint64_t size_bytes, MemoryCategory category) {
  if (!live_check_) return {};
  live_checks_.fetch_add(1, std::memory_order_relaxed);
  KILN_ASSIGN_OR_RETURN(const Device::MemoryInfo info, device_.memory_info());
  const uint64_t usable = info.free_bytes > reserve_bytes_ ? info.free_bytes - reserve_bytes_ : 0;
  if (size_bytes <= usable) return {};
  live_refusals_.fetch_add(1, std::memory_order_relaxed);
  Failure f;
  f.result = RhiResult::out_of_memory;
  f.oom_source = OomSource::budget;
  f.category = category;
  f.requested_bytes = size_bytes;
  f.device = device_.name();
  f.site = "DeviceMemory::check_live_free";
  f.detail = fmt::format("{} (live free memory minus the {} reserve is {})", to_string(category),
                         format_bytes(reserve_bytes_), format_bytes(usable));
  f.has_memory = true;
  f.memory.free_bytes = info.free_bytes;
  f.memory.total_bytes = info.total_bytes;
  f.memory.limit_bytes = budget_.limit_bytes();
  f.memory.in_use_bytes = budget_.in_use_by_category();
  return std::unexpected(std::move(f));
}

RhiExpected<DeviceAllocation> DeviceMemory::allocate_reserved(const AllocRequest &request) {
  LlvmRuntimeAllocParams params;
  params.size_bytes = request.size_bytes;
  params.category = request.category;
  params.zero_fill = request.zero_fill;
  auto alloc = device_.allocate_runtime(params);
  if (!alloc) {
    if (alloc.error().result == RhiResult::out_of_memory)
      driver_ooms_.fetch_add(1, std::memory_order_relaxed);
    return alloc;
  }
  allocations_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard lock(mutex_);
  live_.emplace(alloc->alloc_id, request);
  return alloc;
}

RhiExpected<DeviceAllocation> DeviceMemory::allocate(MemoryCategory category, uint64_t size_bytes,
                                                     bool zero_fill) {
  const AllocRequest request{category, size_bytes, zero_fill};
  KILN_ASSIGN_OR_RETURN(auto group, allocate_group(std::span<const AllocRequest>(&request, 1)));
  return group.front();
}

RhiExpected<std::vector<DeviceAllocation>> DeviceMemory::allocate_group(
    std::span<const AllocRequest> requests) {
  std::vector<CategoryRequest> charges;
  uint64_t total = 0;
  for (const AllocRequest &r : requests) {
    if (r.size_bytes == 0)
      return std::unexpected(invalid_usage(device_.name(), "DeviceMemory::allocate",
                                           fmt::format("allocation of 0 bytes for {}",
                                                       to_string(r.category))));
    charges.push_back({r.category, r.size_bytes});
    total += r.size_bytes;
  }
  auto reservation = budget_.reserve(charges);
  if (!reservation) {
    annotate(reservation.error());
    return std::unexpected(std::move(reservation).error());
  }
  if (auto live = check_live_free(total, requests.empty() ? MemoryCategory::ndarray
                                                          : requests[0].category);
      !live)
    return std::unexpected(std::move(live).error());
  std::vector<DeviceAllocation> out;
  out.reserve(requests.size());
  for (const AllocRequest &r : requests) {
    auto alloc = allocate_reserved(r);
    if (!alloc) {
      for (DeviceAllocation a : out) (void)free_unreserved(a);
      annotate(alloc.error());
      return std::unexpected(std::move(alloc).error());
    }
    out.push_back(*alloc);
  }
  reservation->commit();
  return out;
}

RhiStatus DeviceMemory::free_unreserved(DeviceAllocation alloc) {
  {
    std::lock_guard lock(mutex_);
    live_.erase(alloc.alloc_id);
  }
  return device_.dealloc_memory(alloc);
}

RhiStatus DeviceMemory::free(DeviceAllocation alloc) {
  AllocRequest request;
  {
    std::lock_guard lock(mutex_);
    auto it = alloc.device == &device_ ? live_.find(alloc.alloc_id) : live_.end();
    if (it == live_.end())
      return std::unexpected(invalid_usage(
          device_.name(), "DeviceMemory::free",
          fmt::format("allocation {} is not live here (freed twice, or never allocated)",
                      alloc.alloc_id)));
    request = it->second;
    live_.erase(it);
  }
  budget_.release(request.category, request.size_bytes);
  frees_.fetch_add(1, std::memory_order_relaxed);
  return device_.dealloc_memory(alloc);
}

RhiStatus DeviceMemory::charge(MemoryCategory category, uint64_t size_bytes) {
  auto reservation = budget_.reserve(category, size_bytes);
  if (!reservation) {
    annotate(reservation.error());
    return std::unexpected(std::move(reservation).error());
  }
  reservation->commit();
  return {};
}

void DeviceMemory::uncharge(MemoryCategory category, uint64_t size_bytes) {
  budget_.release(category, size_bytes);
}

MemoryStats DeviceMemory::stats() const {
  MemoryStats s;
  s.ledger = budget_.stats();
  s.reserve_bytes = reserve_bytes_;
  s.allocations = allocations_.load();
  s.frees = frees_.load();
  s.live_checks = live_checks_.load();
  s.driver_ooms = driver_ooms_.load();
  s.live_refusals = live_refusals_.load();
  return s;
}

}  // namespace kiln::runtime
