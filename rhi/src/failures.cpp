// The failure factories (failures.h): each kind of Failure is built here and nowhere else.
#include "kiln/rhi/failures.h"

#include <utility>

namespace kiln {

namespace {

// The figures of the request a failure is about: set here, by the factories, and nowhere else.
void set_request(Failure &f, const AllocationFigures &figures) {
  f.category = figures.category;
  f.requested_bytes = figures.requested_bytes;
  f.class_bytes = figures.class_bytes;
}

// The fields every out-of-memory failure about an allocation has.
Failure out_of_memory(OomSource source, std::string device, const char *site,
                      const AllocationFigures &figures, std::source_location where) {
  Failure f = make_failure(RhiResult::out_of_memory, std::move(device), site, "", where);
  set_request(f, figures);
  f.oom_source = source;
  return f;
}

}  // namespace

Failure make_failure(RhiResult result, std::string device, const char *site, std::string detail,
                     std::source_location where) {
  Failure f;
  f.result = result;
  f.device = std::move(device);
  f.site = site;
  f.detail = std::move(detail);
  f.where = where;
  return f;
}

Failure invalid_usage(std::string device, const char *site, std::string detail,
                      std::source_location where) {
  return make_failure(RhiResult::invalid_usage, std::move(device), site, std::move(detail), where);
}

Failure invalid_request(std::string device, const char *site, std::string detail,
                        const AllocationFigures &figures, std::source_location where) {
  Failure f = invalid_usage(std::move(device), site, std::move(detail), where);
  set_request(f, figures);
  return f;
}

Failure driver_out_of_memory(std::string device, const char *site, const char *driver_status,
                             const AllocationFigures &figures, std::source_location where) {
  Failure f = out_of_memory(OomSource::driver, std::move(device), site, figures, where);
  f.driver_status = driver_status;
  return f;
}

Failure driver_call_failure(RhiResult result, std::string device, const char *site,
                            const char *driver_status, int code,
                            const AllocationFigures *allocation, std::source_location where) {
  // Only an allocation site says it allocated (GpuDevice::allocated), so a copy, launch or
  // module load that runs out of memory is never worded as an allocation of 0 bytes.
  Failure f = allocation != nullptr
                  ? out_of_memory(OomSource::driver, std::move(device), site, *allocation, where)
                  : make_failure(result, std::move(device), site, "", where);
  f.result = result;
  f.oom_source = result == RhiResult::out_of_memory ? OomSource::driver : OomSource::none;
  f.driver_status = driver_status;
  f.allocating = allocation != nullptr;
  if (result != RhiResult::out_of_memory) f.detail = fmt::format("{} failed with code {}", site, code);
  return f;
}

Failure injected_fault(std::string device, const char *site, const AllocationFigures &figures,
                       std::source_location where) {
  Failure f = driver_out_of_memory(std::move(device), site, "injected fault (FaultPlan)", figures,
                                   where);
  f.injected = true;
  return f;
}

Failure injected_device_lost(std::string device, const char *site, MemoryCategory category,
                             uint64_t requested_bytes, std::source_location where) {
  Failure f = make_failure(
      RhiResult::device_lost, std::move(device), site,
      fmt::format("injected device loss (fault spec kind=lost) while allocating {} for {}",
                  format_bytes(requested_bytes), to_string(category)),
      where);
  set_request(f, AllocationFigures{category, requested_bytes, 0});
  f.injected = true;
  return f;
}

Failure injected_launch_fault(std::string device, const char *site, std::string_view kernel,
                              std::source_location where) {
  Failure f = make_failure(
      RhiResult::error, std::move(device), site,
      fmt::format("launch of kernel {} failed: injected launch fault (fault spec kind=launch)",
                  kernel),
      where);
  f.allocating = false;
  f.injected = true;
  return f;
}

Failure injected_heap_exhaustion(std::string device, const char *site, std::string_view kernel,
                                 std::source_location where) {
  Failure f = device_heap_exhausted(
      std::move(device), site, 0,
      fmt::format("kernel {}: injected device-heap exhaustion (fault spec kind=heap)", kernel),
      where);
  f.injected = true;
  return f;
}

Failure budget_refusal(BudgetCheck check, const char *site, const AllocationFigures &figures,
                       const MemorySnapshot &memory, const GroupReuse &group,
                       std::source_location where) {
  Failure f = out_of_memory(OomSource::budget, "", site, figures, where);
  if (group.reused != 0)
    f.detail = fmt::format("{} ({} buffers granted together, {} of them, {}, reusable from the "
                           "pool's cache)", to_string(figures.category), group.buffers,
                           group.reused, format_bytes(group.reused_bytes));
  f.budget_check = check;
  f.has_memory = true;
  f.memory = memory;
  return f;
}

Failure device_heap_exhausted(std::string device, const char *site, uint64_t requested_bytes,
                              std::string detail, std::source_location where) {
  Failure f = out_of_memory(OomSource::device_heap, std::move(device), site,
                            AllocationFigures{MemoryCategory::runtime_heap, requested_bytes, 0},
                            where);
  f.detail = std::move(detail);
  return f;
}

Failure host_out_of_memory(std::string device, const char *site, uint64_t requested_bytes,
                           std::string detail, const char *driver_status,
                           std::source_location where) {
  Failure f = out_of_memory(OomSource::host, std::move(device), site,
                            AllocationFigures{MemoryCategory::ndarray, requested_bytes, 0}, where);
  f.detail = std::move(detail);
  f.driver_status = driver_status;
  return f;
}

}  // namespace kiln
