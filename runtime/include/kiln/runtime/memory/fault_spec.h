// FaultSpec: one parsed, validated fault specification for allocation requests and launches, the
// same text in every interface (C++, the KILN_FAULT environment variable, kiln-ops --fault, Python
// kiln.testing.inject). RequestFaultPlan::arm decides requests and launches by it.
#ifndef KILN_RUNTIME_MEMORY_FAULT_SPEC_H_
#define KILN_RUNTIME_MEMORY_FAULT_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "kiln/rhi/result.h"
#include "kiln/runtime/memory/alloc_request.h"

namespace kiln::runtime {

/// The grammar, quoted in every parse error.
inline constexpr std::string_view kFaultSpecGrammar =
    "comma-separated key=value terms: nth=N (N >= 1), category=NAME (ndarray, staging, "
    "argument_buffer, result_buffer, runtime_heap, code_object), min_bytes=SIZE (an integer, "
    "unit B, KiB, MiB or GiB; bytes when none), kernel=NAME (an op such as axpy, or a kernel "
    "such as kiln_axpy_f32), p=P (0 <= P <= 1), seed=S (only with p), kind=oom|lost|launch|heap "
    "(launch and heap count launches: no category or min_bytes)";

/// The failure a FaultSpec gives.
enum class FaultKind : uint8_t {
  oom,     ///< a selected allocation request: out_of_memory, oom_source driver, injected
  lost,    ///< a selected allocation request: device_lost, and the device is marked lost (sticky)
  launch,  ///< a selected launch: error (a non-sticky launch failure), injected, nothing launched
  heap,    ///< a selected launch: out_of_memory, oom_source device_heap, injected
};
/// "oom", "lost", "launch", "heap".
[[nodiscard]] std::string_view to_string(FaultKind kind);

/// A fault specification, e.g. `nth=3`, `nth=2,category=staging`, `min_bytes=64MiB`,
/// `p=0.25,seed=7`, `kind=lost,nth=1`, `kind=launch,kernel=axpy`. Grammar: comma-separated
/// `key=value` terms, each key at most once:
///   - filters, which select the events the spec looks at (all of its kind when none):
///     `category=NAME` (kiln's own names, to_string(MemoryCategory); not pool_cache),
///     `min_bytes=SIZE` (requests of at least SIZE; units B, KiB, MiB, GiB, none = bytes),
///     `kernel=NAME` (an op, `axpy`, selecting its kernels of every dtype, or one kernel,
///     `kiln_axpy_f32`): for the allocation kinds, the requests the launcher makes for a launch of
///     that kernel (its staging copies; its argument and result buffers are the executor's, made
///     once, so a launch of device arrays requests nothing); for the launch kinds,
///     the launches of that kernel. parse() accepts any identifier; the executor checks the name
///     against its kernels where it arms a spec (LlvmRuntimeExecutor::arm_fault);
///   - at most one trigger among the selected events: `nth=N` (the N-th selected event from
///     arming fails, once; N >= 1) or `p=P` (each selected event fails with probability P,
///     0 <= P <= 1, drawn from splitmix64 seeded by `seed=S`, default 0); with no trigger every
///     selected event fails;
///   - `kind=K`, the failure given (FaultKind), and what the events are:
///       `oom` (the default): allocation requests; the driver out-of-memory an injected fault
///         gives (out_of_memory, oom_source driver, injected);
///       `lost`: allocation requests; device_lost (injected), and the device is marked lost, so
///         every later call on it fails fast with device_lost until the executor is recreated;
///       `launch`: launches; the launch fails as a real non-sticky launch failure does
///         (RhiResult::error, injected: RuntimeFaultError), after its buffers were allocated and
///         before the kernel runs; the launch's buffers are released;
///       `heap`: launches; the launch reports device-heap exhaustion as a real one does
///         (out_of_memory, oom_source device_heap, injected: DeviceHeapExhaustedError).
///     `category=` and `min_bytes=` filter allocations: with `kind=launch|heap` they are refused.
struct FaultSpec {
  std::optional<MemoryCategory> category;  ///< only requests of this category; none = all
  uint64_t min_bytes = 0;                  ///< only requests of at least this size
  std::string kernel;                      ///< only events of this op or kernel; empty = all
  uint64_t nth = 0;                        ///< the nth selected event fails; 0 = no nth trigger
  std::optional<double> probability;       ///< each selected event fails with it
  uint64_t seed = 0;                       ///< splitmix64 seed for `probability`
  FaultKind kind = FaultKind::oom;         ///< the failure given, and which events count

  /// Parses `text`. Errors: invalid_usage (site FaultSpec::parse) naming the offending term and
  /// quoting kFaultSpecGrammar: empty spec or term, a term without '=', an unknown or duplicate
  /// key, a bad number or unit, nth=0, p outside [0, 1], seed without p, nth with p, an unknown
  /// category or kind, a kernel name that is not an identifier, category or min_bytes with
  /// kind=launch|heap. Thread-safe (pure).
  [[nodiscard]] static RhiExpected<FaultSpec> parse(std::string_view text);
  /// Whether the spec's events are launches (kind launch or heap) rather than allocation requests.
  [[nodiscard]] bool targets_launches() const {
    return kind == FaultKind::launch || kind == FaultKind::heap;
  }
  /// Whether `request` is one the spec looks at (an allocation kind, and its filters).
  [[nodiscard]] bool selects(const AllocRequest &request) const;
  /// Whether a launch of `kernel` ("kiln_axpy_f32") is one the spec looks at (a launch kind, and
  /// its kernel filter).
  [[nodiscard]] bool selects_launch(std::string_view kernel) const;
  /// Whether `name` (an op, "axpy", or a kernel, "kiln_axpy_f32") names `kernel`
  /// ("kiln_<op>_<dtype>"). Thread-safe (pure).
  [[nodiscard]] static bool kernel_named(std::string_view name, std::string_view kernel);
  /// The spec in its canonical text (parse(to_text()) gives it back).
  [[nodiscard]] std::string to_text() const;
};

/// KILN_FAULT from the environment, parsed; nullopt when unset or empty.
/// Errors: invalid_usage naming KILN_FAULT and the offending term when it does not parse.
[[nodiscard]] RhiExpected<std::optional<FaultSpec>> fault_spec_from_env();

/// splitmix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number generators", 2014;
/// constants as in Vigna's public-domain reference): advances `state`, returns the next value.
[[nodiscard]] uint64_t splitmix64_next(uint64_t &state);

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_FAULT_SPEC_H_
