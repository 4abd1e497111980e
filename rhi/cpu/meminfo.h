// The host's total and available memory from /proc/meminfo, read without touching the heap: the
// CPU device's live check refreshes it between the allocations of the program it guards.
#ifndef KILN_RHI_CPU_MEMINFO_H_
#define KILN_RHI_CPU_MEMINFO_H_

#include <cstdint>
#include <string_view>

namespace kiln::meminfo {

/// MemTotal and MemAvailable of /proc/meminfo's `text`, in bytes (the file says kB, meaning
/// KiB). False when either is missing or not a number (MemAvailable needs Linux >= 3.14).
[[nodiscard]] bool parse(std::string_view text, uint64_t *total_bytes, uint64_t *available_bytes);
/// The same, read from /proc/meminfo now (its first 1 KiB, where both lines are). False when it
/// cannot be read or parsed.
[[nodiscard]] bool read(uint64_t *total_bytes, uint64_t *available_bytes);

}  // namespace kiln::meminfo

#endif  // KILN_RHI_CPU_MEMINFO_H_
