#include "kiln/runtime/memory/memory_stats.h"

#include <fmt/format.h>

namespace kiln::runtime {

std::string format_memory_summary(std::string_view device, const MemoryStats &s) {
  std::string out = fmt::format("kiln memory summary: {} (limit {}, reserve {})\n", device,
                                format_bytes(s.ledger.limit_bytes), format_bytes(s.reserve_bytes));
  out += fmt::format("  {:<16} {:>12} {:>12}\n", "category", "current", "peak");
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    out +=
        fmt::format("  {:<16} {:>12} {:>12}\n", to_string(static_cast<MemoryCategory>(i)),
                    format_bytes(s.ledger.current_bytes[i]), format_bytes(s.ledger.peak_bytes[i]));
  out +=
      fmt::format("  {:<16} {:>12} {:>12}\n", "total", format_bytes(s.ledger.current_total_bytes()),
                  format_bytes(s.ledger.peak_total_bytes));
  out += fmt::format(
      "  pool: {} cached in {} blocks; {} hits ({} lock-free) of {} allocations; "
      "{} evicted\n",
      format_bytes(s.cached_bytes), s.cached_blocks, s.cache_hits, s.lock_free_hits, s.allocations,
      s.evictions);
  out += fmt::format(
      "  refusals: {} by budget, {} by live free memory; driver out-of-memory: {}; "
      "retries: {}; frees: {}; live checks: {}\n",
      s.ledger.refusals, s.live_refusals, s.driver_ooms, s.retries, s.frees, s.live_checks);
  return out;
}

}  // namespace kiln::runtime
