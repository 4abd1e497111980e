#include <bit>

#include <fmt/format.h>

#include "kiln/rhi/device.h"

namespace kiln {

Failure LlvmDevice::failure(RhiResult result, const char *site, std::string detail) const {
  return make_failure(result, name(), site, std::move(detail));
}

RhiResult LlvmDevice::allocate_memory_runtime(const LlvmRuntimeAllocParams &params,
                                              DeviceAllocation *out) {
  auto alloc = allocate_runtime(params);
  if (!alloc) {
    const RhiResult result = alloc.error().result;
    set_last_failure(std::move(alloc).error());
    return result;
  }
  *out = *alloc;
  return RhiResult::success;
}

RhiExpected<DeviceAllocation> LlvmDevice::allocate(const AllocParams &params) {
  LlvmRuntimeAllocParams runtime_params;
  static_cast<AllocParams &>(runtime_params) = params;
  return allocate_runtime(runtime_params);
}

void LlvmDevice::mark_lost(const Failure &cause) {
  std::lock_guard lock(mutex_);
  if (lost_.load()) return;
  lost_cause_ = cause.message();
  loss_injected_.store(cause.injected, std::memory_order_relaxed);
  lost_.store(true, std::memory_order_release);
}

RhiStatus LlvmDevice::check_alive(const char *site) const {
  if (!is_lost()) return {};
  return std::unexpected(failure(
      RhiResult::device_lost, site,
      fmt::format("the device was lost earlier ({}); recreate the executor", lost_cause_)));
}

RhiExpected<DeviceAllocation> LlvmDevice::allocate_runtime(const LlvmRuntimeAllocParams &params) {
  constexpr const char *kSite = "LlvmDevice::allocate_runtime";
  KILN_RETURN_IF_ERROR(check_alive(kSite));
  const auto refuse = [&](std::string detail) {
    return std::unexpected(invalid_request(name(), kSite, std::move(detail), params.figures()));
  };
  if (params.size_bytes == 0) return refuse("allocation of 0 bytes (zero-size ndarrays allocate nothing)");
  if (!std::has_single_bit(params.alignment_bytes))
    return refuse(fmt::format("alignment {} is not a power of two", params.alignment_bytes));
  if (fault_plan_.should_fail(params.size_bytes))
    return std::unexpected(injected_fault(name(), kSite, params.figures()));
  KILN_ASSIGN_OR_RETURN(const uint64_t address, driver_allocate(params));
  if (params.zero_fill) {
    if (auto cleared = driver_memset_zero(address, params.size_bytes); !cleared) {
      // The memset failure is the answer; a free that fails too is kept for synchronize().
      // On a lost device the memory went with it, as in dealloc_memory.
      if (!resources_lost()) defer_if_failed(driver_free(address, params.size_bytes));
      return std::unexpected(std::move(cleared).error());
    }
  }
  std::lock_guard lock(mutex_);
  const uint64_t id = next_alloc_id_++;
  live_.emplace(id, Entry{address, params.size_bytes});
  live_bytes_.store(live_bytes_.load(std::memory_order_relaxed) + params.size_bytes,
                    std::memory_order_relaxed);
  return DeviceAllocation{this, id};
}

RhiExpected<LlvmDevice::Entry> LlvmDevice::find_live(DeviceAllocation alloc, const char *site) const {
  KILN_RETURN_IF_ERROR(check_alive(site));
  if (alloc.device != this)
    return std::unexpected(failure(RhiResult::invalid_usage, site,
                                   fmt::format("allocation {} belongs to another device",
                                               alloc.alloc_id)));
  std::lock_guard lock(mutex_);
  auto it = live_.find(alloc.alloc_id);
  if (it == live_.end())
    return std::unexpected(failure(
        RhiResult::invalid_usage, site,
        fmt::format("allocation {} is not live (freed twice, or never allocated)", alloc.alloc_id)));
  return it->second;
}

RhiExpected<LlvmDevice::Entry> LlvmDevice::check_range(DeviceAllocation alloc, uint64_t offset,
                                                       uint64_t size_bytes, const char *site) const {
  KILN_ASSIGN_OR_RETURN(const Entry entry, find_live(alloc, site));
  if (offset > entry.size_bytes || size_bytes > entry.size_bytes - offset)
    return std::unexpected(failure(
        RhiResult::invalid_usage, site,
        fmt::format("range [{}, {}+{}) lies outside allocation {} of {} bytes", offset, offset,
                    size_bytes, alloc.alloc_id, entry.size_bytes)));
  return entry;
}

RhiStatus LlvmDevice::dealloc_memory(DeviceAllocation alloc) {
  constexpr const char *kSite = "LlvmDevice::dealloc_memory";
  Entry entry{};
  {
    if (alloc.device != this)
      return std::unexpected(failure(RhiResult::invalid_usage, kSite,
                                     "allocation belongs to another device"));
    std::lock_guard lock(mutex_);
    auto it = live_.find(alloc.alloc_id);
    if (it == live_.end())
      return std::unexpected(failure(
          RhiResult::invalid_usage, kSite,
          fmt::format("allocation {} is not live (freed twice, or never allocated)",
                      alloc.alloc_id)));
    entry = it->second;
    if (entry.external)
      return std::unexpected(failure(
          RhiResult::invalid_usage, kSite,
          fmt::format("allocation {} is memory another library owns (register_external); "
                      "unregister it instead",
                      alloc.alloc_id)));
    live_.erase(it);
    live_bytes_.store(live_bytes_.load(std::memory_order_relaxed) - entry.size_bytes,
                      std::memory_order_relaxed);
  }
  if (resources_lost()) return {};  // the memory went with the device
  auto freed = driver_free(entry.address, entry.size_bytes);
  defer_if_failed(freed);
  return freed;
}

RhiExpected<DeviceAllocation> LlvmDevice::register_external(uint64_t address, uint64_t size_bytes) {
  constexpr const char *kSite = "LlvmDevice::register_external";
  KILN_RETURN_IF_ERROR(check_alive(kSite));
  if (size_bytes == 0 || address == 0)
    return std::unexpected(failure(RhiResult::invalid_usage, kSite,
                                   fmt::format("external memory of {} bytes at address {:#x}: "
                                               "needs a non-zero size and address",
                                               size_bytes, address)));
  std::lock_guard lock(mutex_);
  const uint64_t id = next_alloc_id_++;
  live_.emplace(id, Entry{address, size_bytes, /*external=*/true});
  ++external_count_;
  return DeviceAllocation{this, id};
}

RhiStatus LlvmDevice::unregister_external(DeviceAllocation alloc) {
  constexpr const char *kSite = "LlvmDevice::unregister_external";
  if (alloc.device != this)
    return std::unexpected(failure(RhiResult::invalid_usage, kSite, "allocation belongs to another device"));
  std::lock_guard lock(mutex_);
  auto it = live_.find(alloc.alloc_id);
  if (it == live_.end() || !it->second.external)
    return std::unexpected(failure(
        RhiResult::invalid_usage, kSite,
        fmt::format("allocation {} is not live external memory", alloc.alloc_id)));
  live_.erase(it);
  --external_count_;
  return {};
}

void LlvmDevice::defer_if_failed(const RhiStatus &freed) {
  if (freed) return;
  std::lock_guard lock(mutex_);
  if (!deferred_) deferred_ = freed.error();
}

RhiStatus LlvmDevice::memcpy_host_to_device(DeviceAllocation dst, uint64_t offset_bytes,
                                            const void *src, uint64_t size_bytes) {
  KILN_ASSIGN_OR_RETURN(const Entry entry,
                        check_range(dst, offset_bytes, size_bytes, "memcpy_host_to_device"));
  if (size_bytes == 0) return {};
  return driver_copy_to_device(entry.address + offset_bytes, src, size_bytes);
}

RhiStatus LlvmDevice::memcpy_device_to_host(void *dst, DeviceAllocation src, uint64_t offset_bytes,
                                            uint64_t size_bytes) {
  KILN_ASSIGN_OR_RETURN(const Entry entry,
                        check_range(src, offset_bytes, size_bytes, "memcpy_device_to_host"));
  if (size_bytes == 0) return {};
  return driver_copy_to_host(dst, entry.address + offset_bytes, size_bytes);
}

RhiStatus LlvmDevice::memcpy_device_to_device(DeviceAllocation dst, uint64_t dst_offset,
                                              DeviceAllocation src, uint64_t src_offset,
                                              uint64_t size_bytes) {
  KILN_ASSIGN_OR_RETURN(const Entry d, check_range(dst, dst_offset, size_bytes, "memcpy_device_to_device"));
  KILN_ASSIGN_OR_RETURN(const Entry s, check_range(src, src_offset, size_bytes, "memcpy_device_to_device"));
  if (size_bytes == 0) return {};
  return driver_copy_device(d.address + dst_offset, s.address + src_offset, size_bytes);
}

RhiStatus LlvmDevice::fill_zero(DeviceAllocation alloc) {
  KILN_ASSIGN_OR_RETURN(const Entry entry, find_live(alloc, "LlvmDevice::fill_zero"));
  return driver_memset_zero(entry.address, entry.size_bytes);
}

RhiStatus LlvmDevice::fill_zero(DeviceAllocation alloc, uint64_t offset_bytes, uint64_t size_bytes) {
  KILN_ASSIGN_OR_RETURN(const Entry entry,
                        check_range(alloc, offset_bytes, size_bytes, "LlvmDevice::fill_zero"));
  if (size_bytes == 0) return {};
  return driver_memset_zero(entry.address + offset_bytes, size_bytes);
}

RhiExpected<uint64_t> LlvmDevice::device_address(DeviceAllocation alloc) const {
  KILN_ASSIGN_OR_RETURN(const Entry entry, find_live(alloc, "LlvmDevice::device_address"));
  return entry.address;
}

RhiExpected<uint64_t> LlvmDevice::allocation_size(DeviceAllocation alloc) const {
  KILN_ASSIGN_OR_RETURN(const Entry entry, find_live(alloc, "LlvmDevice::allocation_size"));
  return entry.size_bytes;
}

RhiStatus LlvmDevice::take_deferred_failure() {
  std::lock_guard lock(mutex_);
  if (!deferred_) return {};
  Failure f = std::move(*deferred_);
  deferred_.reset();
  return std::unexpected(std::move(f));
}

uint64_t LlvmDevice::live_allocation_count() const {
  std::lock_guard lock(mutex_);
  return live_.size() - external_count_;
}

uint64_t LlvmDevice::live_allocation_bytes() const {
  return live_bytes_.load(std::memory_order_relaxed);
}

}  // namespace kiln
