#ifndef KILN_RHI_MOCK_DEVICE_H_
#define KILN_RHI_MOCK_DEVICE_H_

#include <atomic>
#include <vector>

#include "kiln/rhi/backend_registry.h"
#include "kiln/rhi/host_device.h"

namespace kiln {

/// A device for tests and CI without a GPU: host memory behind a fixed capacity, a script of
/// other processes' usage, and counters that let tests prove what the driver was asked.
/// The driver refuses (out_of_memory, driver status MOCK_ERROR_OUT_OF_MEMORY) any allocation that
/// does not fit in capacity - held - other processes' bytes. Thread-safe.
class MockDevice final : public HostMemoryDevice {
 public:
  explicit MockDevice(MockDeviceOptions options = {});
  [[nodiscard]] Backend backend() const override { return Backend::mock; }
  /// free = capacity - held - other processes' bytes (the script's next value), total = capacity.
  RhiExpected<MemoryInfo> memory_info() override;

  /// Sets other processes' usage directly (replaces the script).
  void set_other_process_bytes(uint64_t bytes);
  /// While true, memory_info() fails (RhiResult::error, driver status MOCK_ERROR_UNKNOWN), as a
  /// driver whose query breaks; it is still counted.
  void fail_memory_info(bool fail) { fail_memory_info_.store(fail); }
  /// Bytes the driver holds for kiln now, and the most it ever held at once.
  [[nodiscard]] uint64_t held_bytes() const { return held_bytes_.load(); }
  [[nodiscard]] uint64_t high_water_bytes() const { return high_water_bytes_.load(); }
  /// How many times the driver itself answered out_of_memory.
  [[nodiscard]] uint64_t driver_oom_count() const { return driver_oom_count_.load(); }
  [[nodiscard]] uint64_t driver_allocation_count() const { return driver_allocation_count_.load(); }
  [[nodiscard]] uint64_t memory_info_count() const { return memory_info_count_.load(); }

 protected:
  RhiExpected<uint64_t> driver_allocate(const LlvmRuntimeAllocParams &params) override;
  RhiStatus driver_free(uint64_t address, uint64_t size_bytes) override;

 private:
  [[nodiscard]] uint64_t other_process_bytes();

  const uint64_t capacity_bytes_;
  ForkSafeMutex script_mutex_{ForkSafeMutex::Policy::hold_across_fork};  // a leaf lock
  std::vector<uint64_t> script_;
  std::size_t script_pos_ = 0;
  std::atomic<uint64_t> held_bytes_{0};
  std::atomic<uint64_t> high_water_bytes_{0};
  std::atomic<uint64_t> driver_oom_count_{0};
  std::atomic<uint64_t> driver_allocation_count_{0};
  std::atomic<uint64_t> memory_info_count_{0};
  std::atomic<uint64_t> current_other_bytes_{0};
  std::atomic<bool> script_done_{false};  // the script has no value left to hand out
  std::atomic<bool> fail_memory_info_{false};
};

}  // namespace kiln

#endif  // KILN_RHI_MOCK_DEVICE_H_
