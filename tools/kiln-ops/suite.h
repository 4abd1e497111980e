// The kiln-ops suite: operation cases run on one backend, each checked against a host reference.
#ifndef KILN_TOOLS_KILN_OPS_SUITE_H_
#define KILN_TOOLS_KILN_OPS_SUITE_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/executor/errors.h"
#include "kiln/executor/executor.h"
#include "kiln/runtime/memory/fault_spec.h"

namespace kiln::ops {

/// kiln-ops' own knobs, named by the advice of a refusal (it has no reserve flag).
inline constexpr InterfaceKnobs kKilnOpsKnobs{"--budget-mb", "", "--heap-mb"};

/// One operation case: a name like "axpy/f32/medium" and the code that runs and checks it.
struct Case {
  std::string name;
  uint64_t max_array_bytes = 0;  ///< the largest array the case allocates
  /// Runs the case. Returns nullopt when the result matched the reference, or why it did not.
  /// A failure from the executor is returned as a Failure.
  std::function<RhiExpected<std::optional<std::string>>(LlvmRuntimeExecutor &)> run;
};

/// Every case whose arrays are at most `max_array_bytes`.
[[nodiscard]] std::vector<Case> make_cases(uint64_t max_array_bytes);

/// Appends the user-kernel cases (user_kernel_cases.cpp) whose arrays are at most
/// `max_array_bytes`: an ElementwiseKernel, a ReductionKernel and an LLVM IR kernel that allocates
/// from the device heap, each compiled for the case's executor and checked against the host.
void add_user_kernel_cases(std::vector<Case> &cases, uint64_t max_array_bytes);

/// The entries of the user-kernel cases' kernels (squared_diff, sum_of_squares, heap_square),
/// which a --fault kernel= may name.
[[nodiscard]] std::span<const std::string> user_kernel_case_names();

enum class Verdict : uint8_t { ok, fail, refused };

struct CaseResult {
  std::string name;
  int repetition = 1;      ///< which run of the suite (1 .. SuiteOptions::repeat)
  Verdict verdict = Verdict::ok;
  std::string detail;      ///< FAIL: why; REFUSED: "<ErrorName>: <message>"
  std::string error_name;  ///< REFUSED / FAIL-by-error: the named error
  std::optional<Failure> failure;  ///< REFUSED / FAIL-by-error: the failure, advice filled
  double seconds = 0.0;
  uint64_t ledger_after_bytes = 0;  ///< ledger total after the case (runtime state and code only)
  uint64_t ledger_code_bytes = 0;   ///< of which code_object (held by the JIT, not the device)
  uint64_t ledger_cached_bytes = 0; ///< of which pool_cache (freed blocks kept for reuse)
  uint64_t device_live_bytes = 0;   ///< bytes the device holds for kiln after the case
};

struct SuiteOptions {
  ExecutorConfig config;
  std::string filter;               ///< RE2 regex searched in case names; empty = all
  int repeat = 1;
  uint64_t fault_at = 0;            ///< 0 = no fault; else the N-th allocation from the first case fails
  /// A fault spec armed afresh at the first case of each repetition (each repetition is the
  /// same run); exclusive with fault_at. kiln-ops fills it from --fault or KILN_FAULT.
  std::optional<runtime::FaultSpec> fault;
  uint64_t max_array_bytes = 256ull << 20;
  std::shared_ptr<Program> program;  ///< reuse a compiled Program (tests); null = shared host one
  std::FILE *out = stdout;           ///< verdict lines and summary; null = silent
  /// "[i/M] case" on stderr while a case runs (a TTY), blanked before any other line is printed.
  bool progress = false;
};

/// The budget a run had, read from the first executor (bytes). Unknown when set-up failed.
struct BudgetReport {
  bool known = false;
  uint64_t limit_bytes = 0;    ///< the budget's limit
  uint64_t reserve_bytes = 0;  ///< headroom kept free on the device
};

struct SuiteReport {
  std::vector<CaseResult> results;  ///< every case of every repetition, in order
  int ok = 0, refused = 0, failed = 0;
  CategoryBytes peak_bytes{};        ///< highest ledger bytes per category over the run
  BudgetReport budget;
  uint64_t allocations = 0;          ///< driver allocation attempts counted from the first case
  uint64_t ledger_baseline_bytes = 0;  ///< ledger total after set-up (runtime state + code)
  uint64_t ledger_after_teardown_bytes = 0;  ///< ledger total once the executor is gone (0)
  uint64_t device_after_teardown_bytes = 0;  ///< bytes the device still held then (0)
  std::optional<Failure> setup_failure;  ///< the executor could not be made
};

/// Whether `filter` is a valid RE2 regex (RE2 syntax, matched in linear time; nesting deeper
/// than RE2's limit of 1000 is refused, never a stack overflow). Errors: invalid_usage with
/// RE2's reason.
[[nodiscard]] RhiStatus check_filter(const std::string &filter);
/// The cases the options select (size limit and filter), in order; none for an invalid filter.
[[nodiscard]] std::vector<Case> selected_cases(const SuiteOptions &options);
/// Runs one case on `ex` and judges it: OK, FAIL (wrong values, or an error other than
/// out-of-memory or a lost device) or REFUSED; reads the ledger and device after it. A
/// std::bad_alloc from the host reference is HostOutOfMemoryError. Never throws otherwise.
[[nodiscard]] CaseResult run_case(const Case &c, LlvmRuntimeExecutor &ex);
/// The budget the executor was given: its limit and reserve (no device call: a fake driver's
/// scripted readings and fault counts stay those of the cases).
[[nodiscard]] BudgetReport budget_of(const LlvmRuntimeExecutor &ex);
/// Prints "<case>: OK", "<case>: FAIL <why>" or "<case>: REFUSED <error>" on `out` (null: none).
void print_result(std::FILE *out, const CaseResult &r);
/// Runs the suite. Never throws for device answers; a refused case does not stop the sweep.
/// The JSON and JUnit reports of a run are written by report_json.h / report_junit.h.
[[nodiscard]] SuiteReport run_suite(const SuiteOptions &options);

}  // namespace kiln::ops

#endif  // KILN_TOOLS_KILN_OPS_SUITE_H_
