// What a device's destructor could not release. A destructor cannot return an RhiResult, so a
// driver call that fails while a device is torn down (cuDevicePrimaryCtxRelease_v2 after a sticky
// fault, hipDeviceReset) is recorded here, and whoever can report it takes it: the Python
// bindings turn each one into a RuntimeWarning after kiln.init replaced an executor; a C++
// program calls take_teardown_failures() after dropping its executor.
#ifndef KILN_RHI_TEARDOWN_FAILURES_H_
#define KILN_RHI_TEARDOWN_FAILURES_H_

#include <string>
#include <vector>

namespace kiln {

/// Records that a device's teardown failed: `message` names the device, the driver call, its
/// status and what stays held. At most 64 are kept (the oldest are dropped first). Thread-safe;
/// never throws (a message that cannot be stored is dropped).
void record_teardown_failure(std::string message) noexcept;

/// The teardown failures recorded since the last call, oldest first; the record is left empty.
/// Thread-safe.
[[nodiscard]] std::vector<std::string> take_teardown_failures();

}  // namespace kiln

#endif  // KILN_RHI_TEARDOWN_FAILURES_H_
