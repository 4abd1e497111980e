// The backend registry: the one place a Backend becomes a device. Each backend folder defines
// its factory (backends.inc lists them), so the layers above include no backend header.
#ifndef KILN_RHI_BACKEND_REGISTRY_H_
#define KILN_RHI_BACKEND_REGISTRY_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/rhi/device.h"
#include "kiln/rhi/result.h"

namespace kiln {

/// What a mock device is like. Sizes in bytes.
struct MockDeviceOptions {
  uint64_t capacity_bytes = 1ull << 30;  ///< total device memory
  /// Bytes used by "other processes", one value per memory_info() call in turn; the last value
  /// stays in force. Empty: nobody else uses the device.
  std::vector<uint64_t> other_process_bytes_script;
};

/// What create_device needs beyond the backend; each backend reads its own fields.
struct DeviceOptions {
  int ordinal = 0;          ///< which GPU (cuda, amdgpu); cpu and mock have one device
  MockDeviceOptions mock;   ///< the mock device's capacity and script (mock)
};

/// Makes a device of `backend` with its registered factory. Errors: those of the backend's
/// factory (cuda and amdgpu: not_supported when the driver library, or device `ordinal`, is
/// missing, naming the library and the driver's answer; device_lost; error), and not_supported
/// for a backend this kiln has no factory for. Thread-safe.
[[nodiscard]] RhiExpected<std::unique_ptr<LlvmDevice>> create_device(Backend backend,
                                                                     const DeviceOptions &options = {});

}  // namespace kiln

#endif  // KILN_RHI_BACKEND_REGISTRY_H_
