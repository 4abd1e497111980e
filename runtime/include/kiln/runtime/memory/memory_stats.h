// A device's memory counters (a snapshot) and the readable summary made from them.
#ifndef KILN_RUNTIME_MEMORY_MEMORY_STATS_H_
#define KILN_RUNTIME_MEMORY_MEMORY_STATS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/runtime/memory/budget.h"

namespace kiln::runtime {

/// Counters and bytes for one device (a snapshot). `get_*`-cheap: no device call.
struct MemoryStats {
  /// Current/peak bytes per category, the limit, and budget refusals returned to callers (a
  /// refusal that eviction or an observer cured, and then succeeded, does not count).
  LedgerStats ledger;
  uint64_t reserve_bytes = 0;   ///< headroom kept free on the device
  uint64_t allocations = 0;     ///< successful allocations (cache hits included)
  uint64_t frees = 0;
  uint64_t cache_hits = 0;      ///< allocations served from the caching pool
  uint64_t lock_free_hits = 0;  ///< of those, served by the calling thread's cache without a lock
  uint64_t cached_bytes = 0;    ///< bytes in the caching pool now
  uint64_t cached_blocks = 0;
  uint64_t evictions = 0;       ///< cached blocks given back to the device under pressure
  uint64_t live_checks = 0;     ///< live free-memory queries made
  uint64_t live_refusals = 0;   ///< refusals by live free memory returned to callers
  uint64_t driver_ooms = 0;     ///< out_of_memory answers from the driver
  uint64_t retries = 0;         ///< allocations retried after evicting the cache or an observer
};

/// A readable table of `stats` for `device`: current and peak bytes per category, the pool and
/// the counters (DeviceMemory::summary, kiln.memory_summary, kiln-ops --summary).
[[nodiscard]] std::string format_memory_summary(std::string_view device, const MemoryStats &stats);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_MEMORY_STATS_H_
