#include <fmt/format.h>

#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/failures.h"

namespace kiln {

MockDevice::MockDevice(MockDeviceOptions options)
    : HostMemoryDevice("mock"),
      capacity_bytes_(options.capacity_bytes),
      script_(std::move(options.other_process_bytes_script)) {
  if (!script_.empty()) current_other_bytes_ = script_.front();
}

void MockDevice::set_other_process_bytes(uint64_t bytes) {
  std::lock_guard lock(script_mutex_);
  script_.clear();
  script_pos_ = 0;
  current_other_bytes_ = bytes;
  script_done_.store(true, std::memory_order_release);
}

uint64_t MockDevice::other_process_bytes() {
  // Once the script is used up (or when there is none) the value no longer moves: no lock.
  if (script_done_.load(std::memory_order_acquire)) return current_other_bytes_.load();
  std::lock_guard lock(script_mutex_);
  if (script_pos_ >= script_.size()) script_done_.store(true, std::memory_order_release);
  if (script_pos_ < script_.size()) current_other_bytes_ = script_[script_pos_++];
  return current_other_bytes_;
}

RhiExpected<LlvmDevice::MemoryInfo> MockDevice::memory_info() {
  memory_info_count_.fetch_add(1);
  if (fail_memory_info_.load(std::memory_order_relaxed)) [[unlikely]] {
    Failure f = failure(RhiResult::error, "MockDevice::memory_info", "the query failed");
    f.driver_status = "MOCK_ERROR_UNKNOWN";
    return std::unexpected(std::move(f));
  }
  const uint64_t used = held_bytes_.load() + other_process_bytes();
  return MemoryInfo{used >= capacity_bytes_ ? 0 : capacity_bytes_ - used, capacity_bytes_};
}

RhiExpected<uint64_t> MockDevice::driver_allocate(const LlvmRuntimeAllocParams &params) {
  driver_allocation_count_.fetch_add(1);
  // Claim the bytes first so concurrent allocations can never overshoot the capacity.
  const uint64_t others = current_other_bytes_.load();
  uint64_t held = held_bytes_.load();
  do {
    if (params.size_bytes > capacity_bytes_ || held + others > capacity_bytes_ - params.size_bytes) {
      driver_oom_count_.fetch_add(1);
      return std::unexpected(driver_out_of_memory(name(), "MockDevice::driver_allocate",
                                                  "MOCK_ERROR_OUT_OF_MEMORY", params.figures()));
    }
  } while (!held_bytes_.compare_exchange_weak(held, held + params.size_bytes));
  uint64_t high = high_water_bytes_.load();
  while (held + params.size_bytes > high &&
         !high_water_bytes_.compare_exchange_weak(high, held + params.size_bytes)) {
  }
  auto address = HostMemoryDevice::driver_allocate(params);
  if (!address) held_bytes_.fetch_sub(params.size_bytes);
  return address;
}

RhiStatus MockDevice::driver_free(uint64_t address, uint64_t size_bytes) {
  held_bytes_.fetch_sub(size_bytes);
  return HostMemoryDevice::driver_free(address, size_bytes);
}

/// The registry's factory for Backend::mock (backends.inc).
/// Errors: invalid_usage for an ordinal other than 0 (the mock is one device).
RhiExpected<std::unique_ptr<LlvmDevice>> make_mock_device(const DeviceOptions &options) {
  if (options.ordinal != 0)
    return std::unexpected(invalid_usage(
        fmt::format("mock:{}", options.ordinal), "create_device",
        fmt::format("the mock backend has one device, mock:0; there is no ordinal {}", options.ordinal)));
  return std::make_unique<MockDevice>(options.mock);
}

}  // namespace kiln
