#include "kiln/rhi/result.h"

#include <fmt/format.h>

namespace kiln {

std::string_view to_string(RhiResult result) {
  switch (result) {
    case RhiResult::success: return "success";
    case RhiResult::error: return "error";
    case RhiResult::invalid_usage: return "invalid_usage";
    case RhiResult::not_supported: return "not_supported";
    case RhiResult::out_of_memory: return "out_of_memory";
    case RhiResult::device_lost: return "device_lost";
  }
  return "unknown";
}

std::string_view to_string(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::ndarray: return "ndarray";
    case MemoryCategory::staging: return "staging";
    case MemoryCategory::argument_buffer: return "argument_buffer";
    case MemoryCategory::result_buffer: return "result_buffer";
    case MemoryCategory::runtime_heap: return "runtime_heap";
    case MemoryCategory::code_object: return "code_object";
    case MemoryCategory::pool_cache: return "pool_cache";
  }
  return "unknown";
}

std::string_view to_string(OomSource source) {
  switch (source) {
    case OomSource::none: return "none";
    case OomSource::driver: return "driver";
    case OomSource::budget: return "budget";
    case OomSource::device_heap: return "device_heap";
    case OomSource::host: return "host";
  }
  return "unknown";
}

std::string_view to_string(BudgetCheck check) {
  switch (check) {
    case BudgetCheck::none: return "none";
    case BudgetCheck::limit: return "limit";
    case BudgetCheck::live_free: return "live_free";
  }
  return "unknown";
}

uint64_t MemorySnapshot::in_use_total_bytes() const {
  uint64_t total = 0;
  for (uint64_t bytes : in_use_bytes) total += bytes;
  return total;
}

std::string format_bytes(uint64_t bytes) {
  constexpr const char *kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes) / 1024.0;
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, kUnits[unit]);
}

namespace {

// "ndarray 70.90 MiB, staging 312.00 KiB": the non-zero categories.
std::string format_in_use(const CategoryBytes &in_use) {
  std::string out;
  for (std::size_t i = 0; i < in_use.size(); ++i) {
    if (in_use[i] == 0) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} {}", to_string(static_cast<MemoryCategory>(i)), format_bytes(in_use[i]));
  }
  return out.empty() ? "nothing" : out;
}

std::string memory_clause(const MemorySnapshot &m) {
  if (!m.device_read)
    return fmt::format("device's free memory could not be read; kiln holds {} ({})",
                       format_bytes(m.in_use_total_bytes()), format_in_use(m.in_use_bytes));
  const std::string age =
      m.live_age_ms == 0 ? std::string() : fmt::format(" (read up to {} ms before)", m.live_age_ms);
  return fmt::format("device has {} free of {}{}; kiln holds {} ({})", format_bytes(m.free_bytes),
                     format_bytes(m.total_bytes), age, format_bytes(m.in_use_total_bytes()),
                     format_in_use(m.in_use_bytes));
}

// "47.00 MiB", or "47.00 MiB (or its pool size class, 48.00 MiB)" when the pool rounded it.
std::string requested_clause(const Failure &f) {
  if (f.class_bytes <= f.requested_bytes) return format_bytes(f.requested_bytes);
  return fmt::format("{} (or its pool size class, {})", format_bytes(f.requested_bytes),
                     format_bytes(f.class_bytes));
}

// The refusal by the budget's limit: the figures are the limit and what kiln holds.
std::string limit_refusal_head(const Failure &f, const std::string &what) {
  const uint64_t used = f.memory.in_use_total_bytes();
  const uint64_t left = f.memory.limit_bytes > used ? f.memory.limit_bytes - used : 0;
  return fmt::format("{} could not allocate {} for {}: budget {} has {} left", f.device,
                     requested_clause(f), what, format_bytes(f.memory.limit_bytes),
                     format_bytes(left));
}

// The refusal by live free device memory: the figures are the device's free memory and the
// reserve kept free (the limit did not refuse, so it is not named).
std::string live_refusal_head(const Failure &f, const std::string &what) {
  const uint64_t usable =
      f.memory.free_bytes > f.memory.reserve_bytes ? f.memory.free_bytes - f.memory.reserve_bytes : 0;
  return fmt::format("{} could not allocate {} for {}: live free device memory {} minus the {} "
                     "reserve leaves {}", f.device, requested_clause(f), what,
                     format_bytes(f.memory.free_bytes), format_bytes(f.memory.reserve_bytes),
                     format_bytes(usable));
}

std::string driver_refusal_head(const Failure &f, const std::string &what) {
  const char *status = *f.driver_status ? f.driver_status : "out of memory";
  if (!f.allocating)  // a copy, a launch or a module load: no size, no category to name
    return fmt::format("{} ran out of memory in {}: driver reported {}", f.device,
                       *f.site ? f.site : "a driver call", status);
  if (f.injected)
    return fmt::format("{} could not allocate {} for {}: {}", f.device, requested_clause(f), what,
                       *f.driver_status ? f.driver_status : "injected fault");
  return fmt::format("{} could not allocate {} for {}: driver reported {}", f.device,
                     requested_clause(f), what, status);
}

std::string out_of_memory_head(const Failure &f) {
  const std::string what = f.detail.empty() ? std::string(to_string(f.category)) : f.detail;
  switch (f.oom_source) {
    case OomSource::budget:
      return f.budget_check == BudgetCheck::live_free ? live_refusal_head(f, what)
                                                      : limit_refusal_head(f, what);
    case OomSource::device_heap:
      if (f.injected)  // no kernel asked for anything: the detail says what was injected
        return fmt::format("{} device heap exhausted: {}", f.device, what);
      return fmt::format("{} device heap exhausted: a kernel asked for {} ({})", f.device,
                         format_bytes(f.requested_bytes), what);
    case OomSource::host:
      return fmt::format("{} could not allocate {} of host memory for {}", f.device,
                         format_bytes(f.requested_bytes), what);
    default:
      return driver_refusal_head(f, what);
  }
}

}  // namespace

std::string Failure::message() const {
  std::string out;
  if (result == RhiResult::out_of_memory) {
    out = out_of_memory_head(*this);
    if (has_memory) out += "; " + memory_clause(memory);
  } else {
    out = fmt::format("{}: {}", device.empty() ? "kiln" : device,
                      detail.empty() ? std::string(to_string(result)) : detail);
    if (*driver_status) out += fmt::format(" (driver reported {})", driver_status);
  }
  if (!advice.empty()) out += "; " + advice;
  if (*site) out += fmt::format(" [at {}]", site);
  for (const std::string &line : context) out += fmt::format("; while {}", line);
  return out;
}

Failure &Failure::add_context(std::string line) & {
  context.push_back(std::move(line));
  return *this;
}

Failure &&Failure::add_context(std::string line) && {
  context.push_back(std::move(line));
  return std::move(*this);
}

namespace {
thread_local Failure t_last_failure;
}

const Failure &last_failure() { return t_last_failure; }
void set_last_failure(Failure failure) { t_last_failure = std::move(failure); }

}  // namespace kiln
