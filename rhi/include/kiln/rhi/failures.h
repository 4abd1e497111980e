// The failure factories: the one function that builds each kind of Failure, and the context
// macro each layer uses to say what it was doing. Included by result.h (after Failure).
#ifndef KILN_RHI_FAILURES_H_
#define KILN_RHI_FAILURES_H_

#include <cstdint>
#include <source_location>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "kiln/rhi/result.h"

namespace kiln {

/// An allocation request as its failure reports it: the category, the bytes the caller asked for
/// (a block may be larger: its size class) and, when a size class was refused before the exact
/// size, the class's bytes (0 otherwise).
struct AllocationFigures {
  MemoryCategory category = MemoryCategory::ndarray;
  uint64_t requested_bytes = 0;
  uint64_t class_bytes = 0;
};

/// A group allocation's cache hits, which its budget refusal names: the group is granted whole or
/// not at all, so the refusal is about all `buffers`, the `reused` ones (`reused_bytes`,
/// reusable from the pool's cache) included. Empty (reused 0) for a single request.
struct GroupReuse {
  std::size_t buffers = 0;
  std::size_t reused = 0;
  uint64_t reused_bytes = 0;
};

// Every factory records where it was called (`Failure::where`), so a test can check that the
// `site` a failure names is the function that built it (kiln's own sites; a driver failure's
// site names the driver call instead). `site` and `driver_status` must be string literals.
// None of them names a knob of an interface: advice is added by the executor (Failure::advice).

/// A failure of `result` with a one-line reason (error, not_supported, device_lost, or one of
/// the out-of-memory kinds below, which prefer their own factory).
[[nodiscard]] Failure make_failure(RhiResult result, std::string device, const char *site,
                                   std::string detail,
                                   std::source_location where = std::source_location::current());
/// invalid_usage: the caller passed something that can never work; `detail` says what.
[[nodiscard]] Failure invalid_usage(std::string device, const char *site, std::string detail,
                                    std::source_location where = std::source_location::current());
/// invalid_usage about an allocation request (`figures`): the caller asked for something that
/// can never be allocated; `detail` says what.
[[nodiscard]] Failure invalid_request(std::string device, const char *site, std::string detail,
                                      const AllocationFigures &figures,
                                      std::source_location where = std::source_location::current());
/// out_of_memory, oom_source driver: the driver (or the mock's capacity, or the host allocator
/// serving the cpu device) refused the allocation `figures` describes.
[[nodiscard]] Failure driver_out_of_memory(
    std::string device, const char *site, const char *driver_status,
    const AllocationFigures &figures, std::source_location where = std::source_location::current());
/// A driver's answer to an operation that is not an allocation (a copy, a launch, a module
/// load): `result` mapped from the driver's `code` (named `driver_status`). An out_of_memory
/// answer has oom_source driver and names no size (allocating false); any other has the detail
/// "<site> failed with code <code>". With `allocation`, the call was that allocation: the
/// failure is about it (allocating, its category and figures), whatever the result.
[[nodiscard]] Failure driver_call_failure(
    RhiResult result, std::string device, const char *site, const char *driver_status, int code,
    const AllocationFigures *allocation = nullptr,
    std::source_location where = std::source_location::current());
/// out_of_memory, oom_source driver, injected: a FaultPlan refused the request `figures`
/// describes as a driver would (no memory setting cures it).
[[nodiscard]] Failure injected_fault(std::string device, const char *site,
                                     const AllocationFigures &figures,
                                     std::source_location where = std::source_location::current());
/// device_lost, injected: a fault spec (kind=lost) lost the device at a request of
/// `requested_bytes` of `category`, as a sticky driver fault would. The caller marks the device
/// lost with it.
[[nodiscard]] Failure injected_device_lost(
    std::string device, const char *site, MemoryCategory category, uint64_t requested_bytes,
    std::source_location where = std::source_location::current());
/// error, injected: a fault spec (kind=launch) failed the launch of `kernel` as a non-sticky
/// launch failure does (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, hipErrorLaunchOutOfResources).
[[nodiscard]] Failure injected_launch_fault(
    std::string device, const char *site, std::string_view kernel,
    std::source_location where = std::source_location::current());
/// out_of_memory, oom_source device_heap, injected: a fault spec (kind=heap) made the launch of
/// `kernel` report device-heap exhaustion, as device_heap_exhausted does for a real one.
[[nodiscard]] Failure injected_heap_exhaustion(
    std::string device, const char *site, std::string_view kernel,
    std::source_location where = std::source_location::current());
/// out_of_memory, oom_source budget: kiln's budget refused growth for the allocation `figures`
/// describes; `check` says which check (the limit, or the device's live free memory less the
/// reserve) and `memory` carries that check's figures (limit and in-use, or free/total/reserve).
/// A group's refusal says so in its detail (`group`). The device is filled in by whoever
/// annotates the failure (DeviceMemory::annotate).
[[nodiscard]] Failure budget_refusal(BudgetCheck check, const char *site,
                                     const AllocationFigures &figures, const MemorySnapshot &memory,
                                     const GroupReuse &group = {},
                                     std::source_location where = std::source_location::current());
/// out_of_memory, oom_source device_heap: the device runtime's heap (runtime_heap) could not
/// give `requested_bytes` to a running kernel; `detail` names the kernel and the heap's figures.
[[nodiscard]] Failure device_heap_exhausted(
    std::string device, const char *site, uint64_t requested_bytes, std::string detail,
    std::source_location where = std::source_location::current());
/// out_of_memory, oom_source host: host memory for `requested_bytes` (0 when unknown) could not
/// be had; `driver_status` names what said no ("ENOMEM", "std::bad_alloc", "MemoryError").
[[nodiscard]] Failure host_out_of_memory(
    std::string device, const char *site, uint64_t requested_bytes, std::string detail,
    const char *driver_status, std::source_location where = std::source_location::current());

}  // namespace kiln

/// `KILN_RETURN_IF_ERROR_CONTEXT(expr, "while {}", what)`: as KILN_RETURN_IF_ERROR, adding one
/// context line (formatted with fmt, only on failure) to the failure it returns (Dawn's
/// DAWN_TRY_CONTEXT). Each layer says what it was doing; the message lists the lines.
#define KILN_RETURN_IF_ERROR_CONTEXT(expr, ...)                                        \
  do {                                                                                 \
    auto &&kiln_status_ = (expr);                                                      \
    if (!kiln_status_)                                                                 \
      return std::unexpected(                                                          \
          std::move(kiln_status_).error().add_context(fmt::format(__VA_ARGS__)));      \
  } while (0)

/// `KILN_ASSIGN_OR_RETURN_CONTEXT(auto x, expr, "while {}", what)`: as KILN_ASSIGN_OR_RETURN,
/// adding one context line on failure.
#define KILN_ASSIGN_OR_RETURN_CONTEXT(lhs, expr, ...) \
  KILN_ASSIGN_OR_RETURN_CONTEXT_IMPL_(KILN_CONCAT_(kiln_expected_, __LINE__), lhs, expr, __VA_ARGS__)
#define KILN_ASSIGN_OR_RETURN_CONTEXT_IMPL_(tmp, lhs, expr, ...)                        \
  auto tmp = (expr);                                                                   \
  if (!tmp)                                                                            \
    return std::unexpected(std::move(tmp).error().add_context(fmt::format(__VA_ARGS__))); \
  lhs = std::move(tmp).value()

#endif  // KILN_RHI_FAILURES_H_
