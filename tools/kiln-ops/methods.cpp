// kiln-ops --sweep and --min-budget (methods.h).
#include "methods.h"

#include <fmt/format.h>

namespace kiln::ops {
namespace {

/// The selected cases as one workload for kiln::testing, with what the last run saw. Every
/// case runs even after one is refused (as in a plain kiln-ops run). Not thread-safe.
class CasesWorkload {
 public:
  explicit CasesWorkload(std::vector<Case> cases) : cases_(std::move(cases)) {}

  /// Runs every case on `ex`. Returns the first FAIL's failure (wrong values: an error naming
  /// the case), else the first refusal, else success.
  RhiStatus run(LlvmRuntimeExecutor &ex) {
    results_.clear();
    hit_case_.clear();
    runtime::RequestFaultPlan &plan = ex.memory().fault_plan();
    const uint64_t nth = armed_nth(plan);
    const uint64_t requests_before = plan.allocation_count();  // set-up's requests left out
    for (const Case &c : cases_) {
      const uint64_t before = selected(plan);
      results_.push_back(run_case(c, ex));
      if (nth != 0 && before < nth && nth <= selected(plan)) hit_case_ = c.name;
    }
    if (calls_++ == 0) {  // the first run: the counting run of a sweep, the largest budget's
      first_.results = results_;
      first_.budget = budget_of(ex);
      first_.peak_bytes = ex.memory().stats().ledger.peak_bytes;
      for (const CaseResult &r : results_) {
        first_.ok += r.verdict == Verdict::ok;
        first_.refused += r.verdict == Verdict::refused;
        first_.failed += r.verdict == Verdict::fail;
      }
      first_.allocations = plan.allocation_count() - requests_before;
      first_selected_ = selected(plan);
    }
    return answer();
  }
  [[nodiscard]] testing::Workload workload() {
    return [this](LlvmRuntimeExecutor &ex) { return run(ex); };
  }
  [[nodiscard]] const std::vector<CaseResult> &results() const { return results_; }
  [[nodiscard]] const std::string &hit_case() const { return hit_case_; }
  [[nodiscard]] const SuiteReport &first() const { return first_; }
  [[nodiscard]] std::size_t size() const { return cases_.size(); }
  /// The requests the first run's armed spec selected (a sweep's count, known before its runs).
  [[nodiscard]] uint64_t first_selected() const { return first_selected_; }

 private:
  static uint64_t armed_nth(const runtime::RequestFaultPlan &plan) {
    const runtime::RequestFaultPlan::Setting setting = plan.setting();
    return setting.spec ? setting.spec->spec.nth : 0;
  }
  static uint64_t selected(const runtime::RequestFaultPlan &plan) {
    const runtime::RequestFaultPlan::Setting setting = plan.setting();
    return setting.spec ? setting.spec->selected_count : 0;
  }
  RhiStatus answer() const {
    for (const CaseResult &r : results_)
      if (r.verdict == Verdict::fail)
        return std::unexpected(r.failure ? *r.failure
                                         : make_failure(RhiResult::error, "kiln-ops", "kiln-ops case",
                                                        fmt::format("{}: FAIL {}", r.name, r.detail)));
    for (const CaseResult &r : results_)
      if (r.verdict == Verdict::refused) return std::unexpected(*r.failure);
    return {};
  }
  std::vector<Case> cases_;
  std::vector<CaseResult> results_;
  std::string hit_case_;
  SuiteReport first_;
  uint64_t first_selected_ = 0;
  int calls_ = 0;
};

/// "OK", "REFUSED <ErrorName>" or "FAIL <case>: <why>": the worst case of a run.
std::string verdict_of(const std::vector<CaseResult> &results) {
  for (const CaseResult &r : results)
    if (r.verdict == Verdict::fail) return fmt::format("FAIL {}: {}", r.name, r.detail);
  for (const CaseResult &r : results)
    if (r.verdict == Verdict::refused) return fmt::format("REFUSED {}", r.error_name);
  return "OK";
}

std::string held_text(const CategoryBytes &bytes) {
  std::string out;
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    if (bytes[i] != 0)
      out += fmt::format("{}{} {}", out.empty() ? "" : ", ",
                         to_string(static_cast<MemoryCategory>(i)), format_bytes(bytes[i]));
  return out;
}

void print_run(std::FILE *out, const SweepRunResult &r, uint64_t total) {
  if (out == nullptr) return;
  const std::string request =
      r.run.category ? fmt::format("{} {}", to_string(*r.run.category),
                                   format_bytes(r.run.requested_bytes))
                     : std::string("not reached");
  fmt::print(out, "sweep {}/{}: request {} ({}) in {}: {}{}{}\n", r.run.at, total, r.run.at,
             request, r.case_name.empty() ? "no case" : r.case_name, r.verdict,
             r.run.leaked() ? fmt::format("; left held: {}", held_text(r.run.leaked_bytes)) : "",
             r.ok ? "" : " [broke the contract]");
  std::fflush(out);
}

std::string filter_words(const SuiteOptions &options) {
  return options.fault ? fmt::format(" selected by '{}'", options.fault->to_text()) : "";
}

}  // namespace

SweepModeReport run_sweep_mode(const SuiteOptions &options) {
  SweepModeReport report;
  CasesWorkload cases(selected_cases(options));
  testing::SweepOptions sweep_options{.config = options.config, .program = options.program,
                                      .filter = options.fault, .on_run = {}};
  sweep_options.on_run = [&](const testing::SweepRun &run) {
    SweepRunResult r{.run = run, .case_name = cases.hit_case(),
                     .verdict = verdict_of(cases.results()), .ok = run.ok()};
    report.broken += !r.ok;
    report.runs.push_back(std::move(r));
    print_run(options.out, report.runs.back(), cases.first_selected());
  };
  auto swept = testing::sweep(cases.workload(), sweep_options);
  report.clean = cases.first();
  if (!swept) {
    report.error = std::move(swept).error();
    if (report.error->kind == testing::WorkloadError::Kind::setup_failed)
      report.clean.setup_failure = report.error->cause;  // the reports say so, as for a run
    return report;
  }
  report.allocations = swept->allocations;
  if (options.out != nullptr)
    fmt::print(options.out,
               "sweep: {} allocation request(s){} in the counting run of {} case(s) ({} OK, {} "
               "refused, {} failed); {} run(s), one per request, {} broke the contract\n",
               report.allocations, filter_words(options), cases.size(), report.clean.ok,
               report.clean.refused, report.clean.failed, report.runs.size(), report.broken);
  return report;
}

MinBudgetModeReport run_min_budget_mode(const SuiteOptions &options) {
  MinBudgetModeReport report;
  CasesWorkload cases(selected_cases(options));
  testing::MinBudgetOptions budget_options{.config = options.config, .program = options.program,
                                           .max_budget_bytes = std::nullopt,
                                           .granularity_bytes = report.granularity_bytes};
  auto found = testing::min_budget(cases.workload(), budget_options);
  report.clean = cases.first();
  if (!found) {
    report.error = std::move(found).error();
    if (report.error->kind == testing::WorkloadError::Kind::setup_failed)
      report.clean.setup_failure = report.error->cause;
    return report;
  }
  report.budget = std::move(*found);
  const testing::BudgetReport &b = *report.budget;
  if (options.out == nullptr) return report;
  fmt::print(options.out,
             "min-budget: {} ({} bytes) is the smallest budget under which the {} "
             "case(s) pass, to {}; {} run(s) from the largest budget, {}\n",
             format_bytes(b.budget_bytes), b.budget_bytes,
             cases.size(),
             format_bytes(report.granularity_bytes), b.runs, format_bytes(b.max_budget_bytes));
  fmt::print(options.out, "peak memory per category at it: {}\n", held_text(b.peak_bytes));
  if (b.refused)
    fmt::print(options.out, "refused just below it (budget {} bytes): {}\n",
               b.refused_budget_bytes, describe(*b.refused, kKilnOpsKnobs));
  else
    fmt::print(options.out, "refused just below it: nothing (every budget tried passed)\n");
  return report;
}

}  // namespace kiln::ops
