#include "kiln/runtime/memory/budget_config.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

namespace kiln::runtime {

uint64_t default_reserve_bytes(uint64_t total_bytes) {
  constexpr uint64_t kFloor = 64ull << 20;
  return std::max(kFloor, total_bytes / 20);
}

RhiExpected<std::optional<uint64_t>> pool_limit_from_env() {
  const char *value = std::getenv("KILN_POOL_LIMIT_MB");
  if (value == nullptr || *value == '\0') return std::optional<uint64_t>{};
  uint64_t mb = 0;
  const char *end = value + std::strlen(value);
  auto [ptr, ec] = std::from_chars(value, end, mb);
  const bool whole = ptr == end && (ec == std::errc() || ec == std::errc::result_out_of_range);
  if (!whole)
    return std::unexpected(invalid_usage(
        "kiln", "pool_limit_from_env",
        fmt::format("KILN_POOL_LIMIT_MB='{}' is not a whole number of MiB", value)));
  if (ec != std::errc() || mb > (UINT64_MAX >> 20))
    return std::unexpected(invalid_usage(
        "kiln", "pool_limit_from_env",
        fmt::format("KILN_POOL_LIMIT_MB='{}' is too large: at most {} MiB (2**64 bytes)", value,
                    UINT64_MAX >> 20)));
  return std::optional<uint64_t>{mb << 20};
}

RhiExpected<BudgetFigures> budget_figures(const BudgetConfig &config, uint64_t total_bytes) {
  if (config.reserve_bytes && *config.reserve_bytes >= total_bytes)
    return std::unexpected(invalid_usage(
        "kiln", "budget_figures",
        fmt::format("the reserve, {}, is not below the device's total memory, {}: no memory "
                    "would be left to allocate; ask for a smaller reserve (reserve_bytes)",
                    format_bytes(*config.reserve_bytes), format_bytes(total_bytes))));
  BudgetFigures figures;
  figures.reserve_bytes = config.reserve_bytes.value_or(default_reserve_bytes(total_bytes));
  figures.limit_bytes = total_bytes > figures.reserve_bytes ? total_bytes - figures.reserve_bytes : 0;
  if (config.limit_bytes) {
    figures.limit_bytes = *config.limit_bytes;
  } else {
    KILN_ASSIGN_OR_RETURN(const std::optional<uint64_t> env_limit, pool_limit_from_env());
    if (env_limit) figures.limit_bytes = *env_limit;
  }
  return figures;
}

}  // namespace kiln::runtime
