// LlvmDevice and DeviceAllocation: the driver-level interface every backend implements.
//
// A device here is only the driver: it allocates, frees, copies and reports memory. Budget,
// ledger and caching pool are adaptors around it in runtime/memory (as RMM wraps an upstream
// resource), so every backend gets them without knowing about them.
#ifndef KILN_RHI_DEVICE_H_
#define KILN_RHI_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "kiln/rhi/fault_plan.h"
#include "kiln/rhi/fork_hooks.h"
#include "kiln/rhi/result.h"

namespace kiln {

class LlvmDevice;

/// The backends kiln knows (backends.inc lists them; backend_registry.h makes their devices).
enum class Backend : uint8_t {
#define KILN_BACKEND(name, code_arch) name,
#include "kiln/rhi/backends.inc"
#undef KILN_BACKEND
};
[[nodiscard]] std::string_view to_string(Backend backend);
/// "cpu" -> Backend::cpu, ...; anything else -> invalid_usage naming the backends kiln knows.
[[nodiscard]] RhiExpected<Backend> parse_backend(std::string_view name);

/// A device as a user names it: a backend and the backend's device ordinal.
struct DeviceName {
  Backend backend = Backend::cpu;
  int ordinal = 0;
};
/// "cuda" -> {cuda, 0}, "cuda:1" -> {cuda, 1} (any backend, optionally ":<ordinal>", the
/// ordinal a decimal from 0 to 9999). Errors: invalid_usage naming the backends kiln knows (an
/// unknown backend) or saying the ordinal is malformed. Whether the device exists is decided
/// when it is created (create_device). Thread-safe.
[[nodiscard]] RhiExpected<DeviceName> parse_device_name(std::string_view name);

/// A handle to one live allocation on a device. It names memory only after a successful
/// allocation wrote it; a failed allocation never produces one (there is no "invalid" value to
/// check). Copyable; it does not own the memory: free it with LlvmDevice::dealloc_memory.
struct DeviceAllocation {
  LlvmDevice *device = nullptr;
  uint64_t alloc_id = 0;
  friend bool operator==(const DeviceAllocation &, const DeviceAllocation &) = default;
};

/// What to allocate. Sizes in bytes.
struct AllocParams {
  uint64_t size_bytes = 0;
  uint64_t alignment_bytes = 64;  ///< a power of two
  MemoryCategory category = MemoryCategory::ndarray;  ///< reported in failure details
  /// What a failure reports as requested: the bytes the caller asked for, when the block is
  /// larger (its size class); 0: size_bytes.
  uint64_t requested_bytes = 0;
  /// A size class refused before this size, reported by a failure (0: none).
  uint64_t class_bytes = 0;
  /// The request as its failure reports it.
  [[nodiscard]] AllocationFigures figures() const {
    return {category, requested_bytes != 0 ? requested_bytes : size_bytes, class_bytes};
  }
};

/// Parameters of a runtime allocation (memory the LLVM runtime and its launchers use).
struct LlvmRuntimeAllocParams : AllocParams {
  bool zero_fill = false;  ///< clear the memory before returning it
};

/// A device whose kernels come from LLVM: allocation, copies, memory info, device addresses and
/// the fault plan every backend honours (Dawn-style error injection, for tests and CI). A backend
/// implements the driver hooks; this class keeps the allocation table. Thread-safe.
class LlvmDevice {
 public:
  virtual ~LlvmDevice() = default;
  LlvmDevice(const LlvmDevice &) = delete;
  LlvmDevice &operator=(const LlvmDevice &) = delete;

  /// "cpu", "mock", "cuda:0".
  [[nodiscard]] const std::string &name() const { return name_; }
  [[nodiscard]] virtual Backend backend() const = 0;

  /// Allocates memory for the LLVM runtime (ndarrays, staging, argument and result buffers, the
  /// device heap), charged by callers to params.category. On success writes *out; on failure
  /// leaves *out untouched, holds nothing, and records the detail in last_failure().
  /// Errors: out_of_memory (driver refused or an injected fault: oom_source driver),
  ///         invalid_usage (size_bytes == 0, alignment not a power of two), device_lost.
  /// Thread-safe.
  [[nodiscard]] RhiResult allocate_memory_runtime(const LlvmRuntimeAllocParams &params,
                                                  DeviceAllocation *out);
  /// The same, as an expected: the value on success, the failure detail otherwise.
  [[nodiscard]] RhiExpected<DeviceAllocation> allocate_runtime(const LlvmRuntimeAllocParams &params);
  /// The same without zero_fill.
  [[nodiscard]] RhiExpected<DeviceAllocation> allocate(const AllocParams &params);

  /// Frees an allocation this device made. Errors: invalid_usage (not live: double free, foreign
  /// or never allocated, or memory registered by register_external), device_lost. Thread-safe.
  [[nodiscard]] RhiStatus dealloc_memory(DeviceAllocation alloc);

  /// Enters `size_bytes` of memory another library owns, at device address `address` (a host
  /// address on cpu and mock), in the allocation table, so kernels and copies can use it like
  /// an allocation of this device (DLPack import). Nothing is allocated, charged or counted in
  /// live_allocation_count/bytes; the owner keeps the memory valid until unregister_external.
  /// Errors: invalid_usage (size_bytes == 0, address 0), device_lost. Thread-safe.
  [[nodiscard]] RhiExpected<DeviceAllocation> register_external(uint64_t address, uint64_t size_bytes);
  /// Removes an entry register_external made; the memory is not freed (its owner frees it).
  /// Errors: invalid_usage (not live, or an allocation this device made). Works on a lost
  /// device. Thread-safe.
  [[nodiscard]] RhiStatus unregister_external(DeviceAllocation alloc);

  /// Copies between host memory and a live allocation. `offset_bytes + size_bytes` must lie
  /// inside the allocation (else invalid_usage). Blocking. Thread-safe.
  [[nodiscard]] RhiStatus memcpy_host_to_device(DeviceAllocation dst, uint64_t offset_bytes,
                                                const void *src, uint64_t size_bytes);
  [[nodiscard]] RhiStatus memcpy_device_to_host(void *dst, DeviceAllocation src,
                                                uint64_t offset_bytes, uint64_t size_bytes);
  [[nodiscard]] RhiStatus memcpy_device_to_device(DeviceAllocation dst, uint64_t dst_offset,
                                                  DeviceAllocation src, uint64_t src_offset,
                                                  uint64_t size_bytes);

  /// Live free and total device memory in bytes, asked of the device now (never cached).
  [[nodiscard]] RhiResult get_memory_info(uint64_t *free_bytes, uint64_t *total_bytes);
  struct MemoryInfo {
    uint64_t free_bytes = 0;
    uint64_t total_bytes = 0;
  };
  [[nodiscard]] virtual RhiExpected<MemoryInfo> memory_info() = 0;

  /// Waits for outstanding work; returns the first deferred error (e.g. a failed free in a
  /// destructor path), then clears it.
  [[nodiscard]] virtual RhiStatus synchronize() = 0;

  /// Sets every byte of a live allocation to zero. Errors: invalid_usage (not live).
  [[nodiscard]] RhiStatus fill_zero(DeviceAllocation alloc);
  /// Sets bytes [offset_bytes, offset_bytes + size_bytes) of a live allocation to zero.
  /// Errors: invalid_usage (not live, or the range lies outside it), device_lost. Blocking.
  [[nodiscard]] RhiStatus fill_zero(DeviceAllocation alloc, uint64_t offset_bytes, uint64_t size_bytes);
  /// The device address of a live allocation (what kernels are given), or invalid_usage.
  [[nodiscard]] RhiExpected<uint64_t> device_address(DeviceAllocation alloc) const;
  /// The size in bytes of a live allocation, or invalid_usage.
  [[nodiscard]] RhiExpected<uint64_t> allocation_size(DeviceAllocation alloc) const;
  /// Whether device memory can be read and written directly by host code (cpu, mock).
  [[nodiscard]] virtual bool host_addressable() const = 0;

  /// Injected faults (fail the N-th allocation, fail large sizes). Thread-safe.
  [[nodiscard]] FaultPlan &fault_plan() { return fault_plan_; }

  /// Marks the device lost after a sticky fault: every later call fails fast with device_lost
  /// naming `cause`; frees only forget their allocation (its memory went with the device).
  /// An injected loss (`cause.injected`, FaultSpec kind=lost) refuses new work the same way but
  /// keeps the device: frees and module unloads still reach the driver (resources_lost()).
  void mark_lost(const Failure &cause);
  [[nodiscard]] bool is_lost() const { return lost_.load(std::memory_order_acquire); }
  /// Whether the device's memory and modules went with it: lost by a real sticky fault, not an
  /// injected one. Releases skip the driver only then.
  [[nodiscard]] bool resources_lost() const {
    return is_lost() && !loss_injected_.load(std::memory_order_acquire);
  }
  /// Success, or the device_lost failure when the device is lost.
  [[nodiscard]] RhiStatus check_alive(const char *site) const;

  /// The first failed free since the last call (a free in a destructor path cannot report it),
  /// then cleared; success when there was none. Backends' synchronize() returns it first.
  [[nodiscard]] RhiStatus take_deferred_failure();

  /// Number of live allocations and their total size in bytes (what the driver holds for kiln).
  [[nodiscard]] uint64_t live_allocation_count() const;
  [[nodiscard]] uint64_t live_allocation_bytes() const;

 protected:
  explicit LlvmDevice(std::string name) : name_(std::move(name)) {}

  /// Backend hooks. Called with validated arguments; the base class keeps the allocation table.
  [[nodiscard]] virtual RhiExpected<uint64_t> driver_allocate(const LlvmRuntimeAllocParams &params) = 0;
  [[nodiscard]] virtual RhiStatus driver_free(uint64_t address, uint64_t size_bytes) = 0;
  [[nodiscard]] virtual RhiStatus driver_copy_to_device(uint64_t dst, const void *src, uint64_t size_bytes) = 0;
  [[nodiscard]] virtual RhiStatus driver_copy_to_host(void *dst, uint64_t src, uint64_t size_bytes) = 0;
  [[nodiscard]] virtual RhiStatus driver_copy_device(uint64_t dst, uint64_t src, uint64_t size_bytes) = 0;
  [[nodiscard]] virtual RhiStatus driver_memset_zero(uint64_t dst, uint64_t size_bytes) = 0;

  /// A failure naming this device; site must be a string literal.
  [[nodiscard]] Failure failure(RhiResult result, const char *site, std::string detail) const;

 private:
  struct Entry {
    uint64_t address;
    uint64_t size_bytes;
    bool external = false;  ///< entered by register_external: another library owns the memory
  };
  [[nodiscard]] RhiExpected<Entry> find_live(DeviceAllocation alloc, const char *site) const;
  /// Keeps a failed driver free as the deferred failure (the first one wins) for synchronize().
  void defer_if_failed(const RhiStatus &freed);
  [[nodiscard]] RhiExpected<Entry> check_range(DeviceAllocation alloc, uint64_t offset,
                                               uint64_t size_bytes, const char *site) const;

  std::string name_;
  FaultPlan fault_plan_;
  std::atomic<bool> lost_{false};
  std::atomic<bool> loss_injected_{false};  // set with lost_, before it
  std::string lost_cause_;  // written once, before lost_ is set
  std::optional<Failure> deferred_;  // the first failed free not yet reported (guarded by mutex_)
  // A leaf lock (map updates only): held across fork() so the child sees live_ whole.
  mutable ForkSafeMutex mutex_{ForkSafeMutex::Policy::hold_across_fork};
  std::unordered_map<uint64_t, Entry> live_;
  uint64_t next_alloc_id_ = 1;
  uint64_t external_count_ = 0;  // entries of live_ made by register_external (guarded by mutex_)
  std::atomic<uint64_t> live_bytes_{0};  // written under mutex_, read without it
};

}  // namespace kiln

#endif  // KILN_RHI_DEVICE_H_
