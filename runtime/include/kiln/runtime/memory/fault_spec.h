// FaultSpec: one parsed, validated fault specification for allocation requests, the same text in
// every interface (C++, the KILN_FAULT environment variable, kiln-ops --fault, Python
// kiln.testing.inject). RequestFaultPlan::arm decides requests by it.
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
    "unit B, KiB, MiB or GiB; bytes when none), p=P (0 <= P <= 1), seed=S (only with p), "
    "kind=oom";

/// A fault specification, e.g. `nth=3`, `nth=2,category=staging`, `min_bytes=64MiB`,
/// `p=0.25,seed=7`. Grammar: comma-separated `key=value` terms, each key at most once:
///   - filters, which select the requests the spec looks at (all requests when none):
///     `category=NAME` (kiln's own names, to_string(MemoryCategory); not pool_cache),
///     `min_bytes=SIZE` (requests of at least SIZE; units B, KiB, MiB, GiB, none = bytes);
///   - at most one trigger among the selected requests: `nth=N` (the N-th selected request from
///     arming fails, once; N >= 1) or `p=P` (each selected request fails with probability P,
///     0 <= P <= 1, drawn from splitmix64 seeded by `seed=S`, default 0); with no trigger every
///     selected request fails;
///   - `kind=oom` (the default): the failure given is the driver out-of-memory an injected fault
///     gives (out_of_memory, oom_source driver, injected).
/// Not supported yet, refused with invalid_usage saying so: `kind=lost`, `kind=launch`,
/// `kind=heap` and the `kernel=NAME` target.
struct FaultSpec {
  std::optional<MemoryCategory> category;  ///< only requests of this category; none = all
  uint64_t min_bytes = 0;                  ///< only requests of at least this size
  uint64_t nth = 0;                        ///< the nth selected request fails; 0 = no nth trigger
  std::optional<double> probability;       ///< each selected request fails with it
  uint64_t seed = 0;                       ///< splitmix64 seed for `probability`

  /// Parses `text`. Errors: invalid_usage (site FaultSpec::parse) naming the offending term and
  /// quoting kFaultSpecGrammar: empty spec or term, a term without '=', an unknown or duplicate
  /// key, a bad number or unit, nth=0, p outside [0, 1], seed without p, nth with p, an unknown
  /// category, and the kinds and keys not supported yet. Thread-safe (pure).
  [[nodiscard]] static RhiExpected<FaultSpec> parse(std::string_view text);
  /// Whether `request` is one the spec looks at (its filters).
  [[nodiscard]] bool selects(const AllocRequest &request) const;
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
