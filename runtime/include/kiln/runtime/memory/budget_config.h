// How a device's budget is set: the configuration DeviceMemory::create takes, the default
// reserve, and the KILN_POOL_LIMIT_MB override.
#ifndef KILN_RUNTIME_MEMORY_BUDGET_CONFIG_H_
#define KILN_RUNTIME_MEMORY_BUDGET_CONFIG_H_

#include <cstdint>
#include <optional>

#include "kiln/rhi/result.h"

namespace kiln::runtime {

/// How a device's budget is set. Sizes in bytes.
struct BudgetConfig {
  /// A fixed limit (deterministic tests). Unset: KILN_POOL_LIMIT_MB if set, else the ceiling
  /// (total - reserve).
  std::optional<uint64_t> limit_bytes;
  /// Headroom kept free on the device. Unset: default_reserve_bytes(total).
  std::optional<uint64_t> reserve_bytes;
  /// Ask the device for its live free memory whenever kiln must grow (sees other processes).
  bool live_check = true;
  /// Keep freed blocks for reuse (charged as pool_cache; evicted before any refusal).
  bool caching = true;
};

/// The default headroom: max(64 MiB, total / 20). 5 % leaves room for the driver's own context,
/// other libraries in the process and fragmentation; the floor matters on small devices.
[[nodiscard]] uint64_t default_reserve_bytes(uint64_t total_bytes);
/// KILN_POOL_LIMIT_MB from the environment, in bytes; nullopt when unset.
/// Errors: invalid_usage when set but not a non-negative integer.
[[nodiscard]] RhiExpected<std::optional<uint64_t>> pool_limit_from_env();

/// The limit and reserve `config` gives a device of `total_bytes`: the explicit limit, else
/// KILN_POOL_LIMIT_MB, else total - reserve. Errors: invalid_usage for a bad KILN_POOL_LIMIT_MB,
/// or an explicit reserve of at least `total_bytes` (nothing could ever be allocated).
struct BudgetFigures {
  uint64_t limit_bytes = 0;
  uint64_t reserve_bytes = 0;
};
[[nodiscard]] RhiExpected<BudgetFigures> budget_figures(const BudgetConfig &config,
                                                        uint64_t total_bytes);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_BUDGET_CONFIG_H_
