#include "suite.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include <fmt/format.h>
#include <re2/re2.h>

#include "kiln/executor/advice.h"

namespace kiln::ops {

CaseResult run_case(const Case &c, LlvmRuntimeExecutor &ex) {
  CaseResult r;
  r.name = c.name;
  const auto start = std::chrono::steady_clock::now();
  RhiExpected<std::optional<std::string>> outcome = std::optional<std::string>();
  try {
    outcome = c.run(ex);
  } catch (const std::bad_alloc &) {  // the host reference's vectors did not fit
    outcome = std::unexpected(host_out_of_memory("host", "kiln-ops case", c.max_array_bytes,
                                                 "the host reference arrays of this case",
                                                 "std::bad_alloc"));
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!outcome) {
    Failure &f = r.failure.emplace(std::move(outcome).error());
    if (f.advice.empty()) advise(f, kKilnOpsKnobs);
    const ErrorKind kind = classify(f);
    r.error_name = std::string(error_name(kind));
    r.detail = describe(f, kKilnOpsKnobs);
    // Out-of-memory and a lost device are answers a run must survive; anything else is a bug.
    r.verdict = (is_out_of_memory(kind) || kind == ErrorKind::device_lost) ? Verdict::refused
                                                                            : Verdict::fail;
  } else if (outcome->has_value()) {
    r.verdict = Verdict::fail;
    r.detail = **outcome;
  }
  const CategoryBytes in_use = ex.memory().in_use_by_category();
  for (uint64_t bytes : in_use) r.ledger_after_bytes += bytes;
  r.ledger_code_bytes = in_use[static_cast<std::size_t>(MemoryCategory::code_object)];
  r.ledger_cached_bytes = in_use[static_cast<std::size_t>(MemoryCategory::pool_cache)];
  r.device_live_bytes = ex.device().live_allocation_bytes();
  return r;
}

namespace {

/// The "[i/M] case" line on stderr (a TTY) while a case runs. Blanked with spaces, not an
/// escape sequence, so that a dumb terminal is cleared too. Not thread-safe (one run, one line).
class ProgressLine {
 public:
  explicit ProgressLine(bool enabled) : enabled_(enabled) {}
  void show(std::size_t index, std::size_t total, const std::string &name) {
    if (!enabled_) return;
    clear();
    const std::string line = fmt::format("[{}/{}] {}", index, total, name);
    fmt::print(stderr, "{}\r", line);
    width_ = line.size();
  }
  /// Blanks the line, so that the next line printed (verdict, summary) starts on a clean one.
  void clear() {
    if (!enabled_ || width_ == 0) return;
    fmt::print(stderr, "{:{}}\r", "", width_);
    width_ = 0;
  }

 private:
  bool enabled_;
  std::size_t width_ = 0;  ///< characters now on the line; 0 when blank
};

}  // namespace

BudgetReport budget_of(const LlvmRuntimeExecutor &ex) {
  const runtime::MemoryStats stats = ex.memory().stats();
  return BudgetReport{.known = true, .limit_bytes = stats.ledger.limit_bytes,
                      .reserve_bytes = stats.reserve_bytes};
}

void print_result(std::FILE *out, const CaseResult &r) {
  if (out == nullptr) return;
  switch (r.verdict) {
    case Verdict::ok: fmt::print(out, "{}: OK\n", r.name); break;
    case Verdict::fail: fmt::print(out, "{}: FAIL {}\n", r.name, r.detail); break;
    case Verdict::refused: fmt::print(out, "{}: REFUSED {}\n", r.name, r.detail); break;
  }
  std::fflush(out);
}

namespace {

void print_summary(std::FILE *out, const SuiteReport &report) {
  if (out == nullptr) return;
  fmt::print(out, "{}/{} cases OK, {} refused, {} failed\n", report.ok, report.results.size(),
             report.refused, report.failed);
  fmt::print(out, "peak memory per category:");
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    fmt::print(out, " {} {}{}", to_string(static_cast<MemoryCategory>(i)),
               format_bytes(report.peak_bytes[i]), i + 1 < kNumMemoryCategories ? "," : "");
  fmt::print(out, "\nallocations: {}\n", report.allocations);
}

}  // namespace

RhiStatus check_filter(const std::string &filter) {
  const RE2 re(filter, RE2::Quiet);
  if (re.ok()) return {};
  return std::unexpected(invalid_usage("kiln-ops", "check_filter",
                                       fmt::format("--filter '{}' is not a valid regex: {}",
                                                   filter.size() > 80 ? filter.substr(0, 80) + "..." : filter,
                                                   re.error())));
}

std::vector<Case> selected_cases(const SuiteOptions &options) {
  std::vector<Case> cases = make_cases(options.max_array_bytes);
  if (!options.filter.empty()) {
    const RE2 re(options.filter, RE2::Quiet);
    if (!re.ok()) return {};
    std::erase_if(cases, [&](const Case &c) { return !RE2::PartialMatch(c.name, re); });
  }
  return cases;
}

SuiteReport run_suite(const SuiteOptions &options) {
  SuiteReport report;
  ProgressLine progress(options.progress);
  const std::vector<Case> cases = selected_cases(options);
  const std::size_t total = cases.size() * static_cast<std::size_t>(options.repeat);
  for (int rep = 0; rep < options.repeat; ++rep) {
    // A fresh executor per repetition: nothing is carried from one run to the next.
    auto ex = LlvmRuntimeExecutor::create(options.config, options.program);
    if (!ex) {
      report.setup_failure = std::move(ex).error();
      return report;
    }
    if (rep == 0) report.budget = budget_of(**ex);
    runtime::RequestFaultPlan &faults = (*ex)->memory().fault_plan();
    report.ledger_baseline_bytes = (*ex)->memory().in_use_bytes();
    if (options.fault_at != 0 && options.fault_at > report.allocations)
      faults.fail_nth_allocation(options.fault_at - report.allocations);
    else
      faults.fail_nth_allocation(FaultPlan::kNever);  // also disarms the executor's KILN_FAULT
    if (options.fault) faults.arm(*options.fault);  // counts from here, allocation_count goes on
    for (const Case &c : cases) {
      progress.show(report.results.size() + 1, total, c.name);
      CaseResult r = run_case(c, **ex);
      r.repetition = rep + 1;
      progress.clear();
      print_result(options.out, r);
      report.ok += r.verdict == Verdict::ok;
      report.refused += r.verdict == Verdict::refused;
      report.failed += r.verdict == Verdict::fail;
      report.results.push_back(std::move(r));
    }
    report.allocations += faults.allocation_count();
    const runtime::LedgerStats stats = (*ex)->memory().stats().ledger;
    for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
      report.peak_bytes[i] = std::max(report.peak_bytes[i], stats.peak_bytes[i]);
    // Teardown: with the executor gone, its device and ledger must hold nothing.
    const std::shared_ptr<DeviceContext> context = (*ex)->context();
    ex->reset();
    report.ledger_after_teardown_bytes = std::max(report.ledger_after_teardown_bytes,
                                                  context->memory->in_use_bytes());
    report.device_after_teardown_bytes = std::max(report.device_after_teardown_bytes,
                                                  context->device->live_allocation_bytes());
  }
  print_summary(options.out, report);
  return report;
}

}  // namespace kiln::ops
