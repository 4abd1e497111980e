// The memory limit of this process's cgroup, so the CPU device's live check sees a container's
// limit and not only the host's free memory.
#ifndef KILN_RHI_CPU_CGROUP_MEMORY_H_
#define KILN_RHI_CPU_CGROUP_MEMORY_H_

#include <cstdint>
#include <optional>
#include <string>

namespace kiln::cgroup {

/// A cgroup's memory limit and current usage, in bytes.
struct MemoryLimit {
  uint64_t limit_bytes = 0;
  uint64_t usage_bytes = 0;
};

/// Reads the limit of the cgroup that `proc_self_cgroup` (the text of /proc/self/cgroup) names,
/// under `cgroup_root` (normally /sys/fs/cgroup): cgroup v2's memory.max / memory.current, else
/// v1's memory.limit_in_bytes / memory.usage_in_bytes. nullopt when there is no limit (v2 "max",
/// v1's near-2^63 "unlimited") or nothing can be read.
[[nodiscard]] std::optional<MemoryLimit> read_memory_limit(const std::string &proc_self_cgroup,
                                                           const std::string &cgroup_root);
/// The same for this process: /proc/self/cgroup under /sys/fs/cgroup.
[[nodiscard]] std::optional<MemoryLimit> own_memory_limit();

/// Caps the host's `*total_bytes` / `*free_bytes` by a cgroup's `limit`: the total at most the
/// limit, the free bytes at most what the limit leaves above the cgroup's usage (0 when usage is
/// at or past it). No limit: both unchanged. Pure.
void cap_by_limit(const std::optional<MemoryLimit> &limit, uint64_t *total_bytes,
                  uint64_t *free_bytes);

}  // namespace kiln::cgroup

#endif  // KILN_RHI_CPU_CGROUP_MEMORY_H_
