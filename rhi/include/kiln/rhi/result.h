// RhiResult, the failure detail that travels with it, and the macros that propagate both.
#ifndef KILN_RHI_RESULT_H_
#define KILN_RHI_RESULT_H_

#include <array>
#include <cstdint>
#include <expected>
#include <source_location>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace kiln {

/// The closed set of answers every RHI and runtime call gives. `[[nodiscard]]`: a call returning
/// one cannot drop it (as RhiExpected / RhiStatus below).
enum class [[nodiscard]] RhiResult : uint8_t {
  /// The call did what it was asked.
  success = 0,
  /// Use this when the device or driver failed in a way that none of the codes below describes;
  /// the failure detail carries the driver's own status name.
  error,
  /// Use this when the caller passed something that can never work (negative dimension, size
  /// overflow, bad alignment, double free, unknown kernel). Retrying the same call cannot succeed.
  invalid_usage,
  /// Use this when the backend, driver or feature is absent on this machine (no driver library,
  /// stub library, no device). Retrying on another backend may succeed.
  not_supported,
  /// Use this when memory could not be had: driver refusal, budget refusal, device-heap exhaustion
  /// or host allocation failure (`Failure::oom_source` says which). Freeing memory may help.
  out_of_memory,
  /// Use this after a sticky device fault (illegal address, ECC error, ...). The device is marked
  /// lost and every later call on it fails fast with device_lost.
  device_lost,
};

/// Every kind of memory kiln holds on a device; each is charged to the device's ledger.
enum class MemoryCategory : uint8_t {
  ndarray = 0,      ///< user-visible arrays
  staging,          ///< device copies of host arrays passed to a launch
  argument_buffer,  ///< kernel argument blocks
  result_buffer,    ///< per-launch result slots the device writes and the host reads
  runtime_heap,     ///< the device runtime: its state and its heap chunk
  code_object,      ///< compiled kernel modules (charged by their size)
  pool_cache,       ///< freed blocks the caching pool keeps for reuse
};
inline constexpr std::size_t kNumMemoryCategories = 7;

/// Which "no" an out_of_memory is: the named error it becomes depends on it.
enum class OomSource : uint8_t {
  none = 0,     ///< not an out-of-memory failure
  driver,       ///< the driver (or the mock's capacity, or an injected fault) refused
  budget,       ///< kiln's budget refused before asking the driver
  device_heap,  ///< the device-side runtime heap was exhausted while a kernel ran
  host,         ///< host memory could not be had (e.g. a host-side staging copy)
};

/// Which check of kiln's budget refused an out_of_memory with oom_source budget.
enum class BudgetCheck : uint8_t {
  none = 0,   ///< not a budget refusal
  limit,      ///< the budget's limit: in-use + request would pass it
  live_free,  ///< the device's live free memory minus the reserve is smaller than the request
};

[[nodiscard]] std::string_view to_string(RhiResult result);
[[nodiscard]] std::string_view to_string(MemoryCategory category);
[[nodiscard]] std::string_view to_string(OomSource source);
[[nodiscard]] std::string_view to_string(BudgetCheck check);

/// Bytes per category, indexed by MemoryCategory.
using CategoryBytes = std::array<uint64_t, kNumMemoryCategories>;

/// A picture of a device's memory at the moment of a failure. All sizes in bytes.
struct MemorySnapshot {
  uint64_t free_bytes = 0;   ///< live free device memory reported by the device
  uint64_t total_bytes = 0;  ///< total device memory reported by the device
  uint64_t limit_bytes = 0;  ///< kiln's budget limit for the device (0 if no budget applied)
  uint64_t reserve_bytes = 0;  ///< headroom kept free (set when live free memory refused)
  /// At most how long before the failure free/total were read, in whole ms rounded up: 0 when
  /// read for this failure. A budget refusal may reuse a reading of the same kernel tick (see
  /// DeviceMemory::annotate); it then says the tick's length (1 to 10 ms).
  uint32_t live_age_ms = 0;
  /// Whether free_bytes and total_bytes are the device's answer; false until the device is
  /// asked, and when its memory query failed (both are then 0 and mean nothing: the message
  /// says the device's free memory could not be read). Beside live_age_ms: one word for both.
  bool device_read = false;
  CategoryBytes in_use_bytes{};  ///< what kiln holds, per category
  [[nodiscard]] uint64_t in_use_total_bytes() const;
};

/// The detail that travels with every non-success RhiResult. Cheap to build (strings stay small;
/// `site` and `driver_status` point at string literals); the message is formatted only when
/// `message()` is called.
struct Failure {
  RhiResult result = RhiResult::error;
  OomSource oom_source = OomSource::none;
  /// For oom_source budget: which check refused (the message words each with its own figures).
  BudgetCheck budget_check = BudgetCheck::none;
  MemoryCategory category = MemoryCategory::ndarray;
  uint64_t requested_bytes = 0;
  /// The caching pool's size class for the request when it is larger than requested_bytes and
  /// did not fit either (the pool falls back to the exact size before it refuses); 0 otherwise.
  uint64_t class_bytes = 0;
  /// Whether the failure is about allocating `requested_bytes` of `category`. False for an
  /// out-of-memory answer to another operation (a copy, a launch, a module load), which `site`
  /// names: the message then names no size and no category.
  bool allocating = true;
  /// Whether a FaultPlan injected this failure (no memory setting cures it).
  bool injected = false;
  std::string device;                ///< "cpu", "mock", "cuda:0"
  const char *site = "";             ///< the function that refused, e.g. "cuMemAlloc_v2", "MemoryBudget::reserve"
  const char *driver_status = "";    ///< the driver's own status name, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
  std::string detail;                ///< what was wrong, for invalid_usage and runtime faults
  /// A user kernel's code (its IR, an operation of the kernel language) did not compile: an
  /// invalid_usage that Python raises as KernelCompileError.
  bool kernel_compile = false;
  /// Where in that code, 1-based; 0 when the failure has no position (a module that does not
  /// verify).
  uint32_t source_line = 0;
  uint32_t source_column = 0;
  bool has_memory = false;           ///< whether `memory` was filled
  MemorySnapshot memory;             ///< live memory picture (out_of_memory failures)
  std::vector<std::string> context;  ///< lines added on the way up, innermost first
  /// What to do, in the words of the caller's interface. Filled by the interface layer (the
  /// executor's advise(), with the knobs of C++, Python or kiln-ops); the layers below never
  /// name a knob. Empty: the message gives no advice.
  std::string advice;
  /// Where the factory that built this failure was called (rhi/failures.h): file, line and
  /// function. Not part of the message; tests check `site` against it.
  std::source_location where{};

  /// The full one-line message: what failed, the numbers, then `advice` when there is one.
  [[nodiscard]] std::string message() const;
  /// Adds a context line ("while allocating ndarray f32[1024]"); returns *this for chaining.
  Failure &add_context(std::string line) &;
  Failure &&add_context(std::string line) &&;
};

/// A value of type T or the Failure that prevented it: `std::expected<T, Failure>` with every
/// member, conversion and comparison of it, as a `[[nodiscard]]` class type (like LLVM's
/// `Expected`). The attribute sits on the type, not on each function, so dropping the result of
/// ANY call returning one warns (`-Wunused-result`, an error in kiln's build), virtual calls
/// through a base reference included (g++ 12 does not warn for those when only the function is
/// `[[nodiscard]]`). To drop one on purpose, say why: `ignore_result(expr, "why")`.
/// Builds from a T (or anything convertible to it), from `std::unexpected<Failure>`, from
/// another RhiExpected / std::expected whose value converts, and (RhiStatus) from `{}`.
template <class T>
class [[nodiscard]] RhiExpected : public std::expected<T, Failure> {
  using base = std::expected<T, Failure>;

 public:
  using base::base;
  /// Success (RhiStatus) or a value-initialized T. User-provided on purpose: with `= default`,
  /// `return {};` value-initializes, which zero-fills the whole object (the Failure's ~300 bytes
  /// of storage) before constructing it, on every successful return (the memory layer's locked
  /// path returns one per call).
  constexpr RhiExpected() noexcept(std::is_nothrow_default_constructible_v<base>)
    requires std::is_default_constructible_v<base>
      : base() {}
  /// From the plain std::expected (what std::expected's own members return).
  constexpr RhiExpected(const base &other) : base(other) {}
  constexpr RhiExpected(base &&other) : base(std::move(other)) {}
};
/// Success or the Failure: `RhiStatus{}` / `return {};` is success.
using RhiStatus = RhiExpected<void>;

/// Drops a result on purpose. `why` says why dropping it loses nothing, e.g.
/// "best-effort cleanup; the caller already reports the first failure". Use only where a failure
/// is reported another way or cannot matter; a lost failure is a bug.
template <class T>
constexpr void ignore_result(T &&result, const char *why) noexcept {
  static_cast<void>(result);
  static_cast<void>(why);
}

/// The failure recorded by the last RhiResult-returning call on this thread that failed.
/// RhiResult-returning functions set it; the expected-returning forms carry it directly.
[[nodiscard]] const Failure &last_failure();
void set_last_failure(Failure failure);

/// Formats a byte count for people: "512.00 MiB", "4.00 GiB", "64 B".
[[nodiscard]] std::string format_bytes(uint64_t bytes);

}  // namespace kiln

#define KILN_CONCAT_INNER_(a, b) a##b
#define KILN_CONCAT_(a, b) KILN_CONCAT_INNER_(a, b)

/// Evaluates an RhiStatus / RhiExpected expression; returns its failure from the enclosing function.
#define KILN_RETURN_IF_ERROR(expr)                              \
  do {                                                          \
    auto &&kiln_status_ = (expr);                               \
    if (!kiln_status_) return std::unexpected(std::move(kiln_status_).error()); \
  } while (0)

/// `KILN_ASSIGN_OR_RETURN(auto x, expr)`: binds the value of an RhiExpected or returns its failure.
#define KILN_ASSIGN_OR_RETURN(lhs, expr) \
  KILN_ASSIGN_OR_RETURN_IMPL_(KILN_CONCAT_(kiln_expected_, __LINE__), lhs, expr)
#define KILN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr)            \
  auto tmp = (expr);                                           \
  if (!tmp) return std::unexpected(std::move(tmp).error());    \
  lhs = std::move(tmp).value()

// The factories that build each kind of Failure (after Failure is complete).
#include "kiln/rhi/failures.h"

#endif  // KILN_RHI_RESULT_H_
