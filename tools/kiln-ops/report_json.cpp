// The JSON report of a kiln-ops run (nlohmann-json). The field names of a failure are those of
// kiln's Python exceptions (requested_bytes, site, free_bytes, ...): one vocabulary.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/executor/errors.h"
#include "reports.h"

namespace kiln::ops {
namespace {

using json = nlohmann::ordered_json;  // fields in the order written here

json category_bytes(const CategoryBytes &bytes) {
  json out = json::object();
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i)
    out[std::string(to_string(static_cast<MemoryCategory>(i)))] = bytes[i];
  return out;
}

/// A failure as structured fields. requested_bytes and category are null unless it is an
/// out-of-memory refusal of an allocation (not a launch, a copy, a missing driver); memory is
/// null when no picture was taken.
json failure_json(const Failure &f) {
  const bool allocation = f.result == RhiResult::out_of_memory && f.allocating;
  json memory = nullptr;
  // The device's figures are null when its memory query failed, as in Python.
  const auto if_read = [&](uint64_t figure) {
    return f.memory.device_read ? json(figure) : json(nullptr);
  };
  if (f.has_memory)
    memory = {{"free_bytes", if_read(f.memory.free_bytes)},
              {"total_bytes", if_read(f.memory.total_bytes)},
              {"limit_bytes", f.memory.limit_bytes},
              {"reserve_bytes", f.memory.reserve_bytes},
              {"live_age_ms", if_read(f.memory.live_age_ms)},
              {"in_use_bytes", category_bytes(f.memory.in_use_bytes)}};
  return {{"name", error_name(classify(f))},
          {"message", f.message()},
          {"requested_bytes", allocation ? json(f.requested_bytes) : json(nullptr)},
          {"category", allocation ? json(to_string(f.category)) : json(nullptr)},
          {"site", f.site},
          {"device", f.device},
          {"driver_status", f.driver_status},
          {"result", to_string(f.result)},
          {"oom_source", to_string(f.oom_source)},
          {"budget_check", to_string(f.budget_check)},
          {"injected", f.injected},
          {"detail", f.detail},
          {"advice", f.advice},
          {"context", f.context},
          {"memory", memory}};
}

constexpr const char *kStatusNames[] = {"ok", "failed", "refused"};  // by Verdict

json case_json(const CaseResult &r) {
  const bool wrong_result = r.verdict == Verdict::fail && !r.failure;
  return {{"name", r.name},
          {"repetition", r.repetition},
          {"status", kStatusNames[static_cast<int>(r.verdict)]},
          {"seconds", r.seconds},
          {"reason", wrong_result ? json(r.detail) : json(nullptr)},
          {"error", r.failure ? failure_json(*r.failure) : json(nullptr)},
          {"ledger_after_bytes", r.ledger_after_bytes},
          {"device_live_bytes", r.device_live_bytes}};
}

json budget_json(const SuiteReport &report, const RunInfo &info) {
  const BudgetReport &b = report.budget;
  return {{"source", info.budget_source},
          {"limit_bytes", b.known ? json(b.limit_bytes) : json(nullptr)},
          {"reserve_bytes", b.known ? json(b.reserve_bytes) : json(nullptr)}};
}

json error_json(const std::optional<testing::WorkloadError> &error) {
  if (!error) return nullptr;
  return {{"name", error->name()},
          {"message", error->message},
          {"cause", error->cause ? failure_json(*error->cause) : json(nullptr)}};
}

/// --sweep's object: the counting run's requests and one entry per faulted run.
json sweep_json(const SweepModeReport *sweep, const SuiteOptions &options) {
  if (sweep == nullptr) return nullptr;
  json runs = json::array();
  for (const SweepRunResult &r : sweep->runs)
    runs.push_back({{"at", r.run.at},
                    {"case", r.case_name.empty() ? json(nullptr) : json(r.case_name)},
                    {"category", r.run.category ? json(to_string(*r.run.category)) : json(nullptr)},
                    {"requested_bytes", r.run.category ? json(r.run.requested_bytes) : json(nullptr)},
                    {"verdict", r.verdict},
                    {"error", r.run.outcome.error_name.empty() ? json(nullptr)
                                                               : json(r.run.outcome.error_name)},
                    {"leaked_bytes", category_bytes(r.run.leaked_bytes)},
                    {"ok", r.ok}});
  return {{"filter", options.fault ? json(options.fault->to_text()) : json(nullptr)},
          {"allocations", sweep->allocations},
          {"runs_total", sweep->runs.size()},
          {"broken", sweep->broken},
          {"error", error_json(sweep->error)},
          {"runs", std::move(runs)}};
}

/// --min-budget's object: the budget found, its peaks and the refusal just below it.
json min_budget_json(const MinBudgetModeReport *found) {
  if (found == nullptr) return nullptr;
  const auto &b = found->budget;
  return {{"budget_bytes", b ? json(b->budget_bytes) : json(nullptr)},
          {"max_budget_bytes", b ? json(b->max_budget_bytes) : json(nullptr)},
          {"granularity_bytes", found->granularity_bytes},
          {"runs", b ? json(b->runs) : json(nullptr)},
          {"peak_bytes", b ? category_bytes(b->peak_bytes) : json(nullptr)},
          {"refused_budget_bytes", b && b->refused ? json(b->refused_budget_bytes) : json(nullptr)},
          {"refused", b && b->refused ? failure_json(*b->refused) : json(nullptr)},
          {"error", error_json(found->error)}};
}

}  // namespace

std::string device_label(const ExecutorConfig &config) {
  const std::string_view backend = to_string(config.backend);
  return config.device_ordinal == 0 ? std::string(backend)
                                    : fmt::format("{}:{}", backend, config.device_ordinal);
}

std::string json_report(const SuiteReport &report, const RunInfo &info) {
  const SuiteOptions &options = *info.options;
  json cases = json::array();
  for (const CaseResult &r : report.results) cases.push_back(case_json(r));
  const json doc = {
      {"schema_version", kJsonSchemaVersion},
      {"tool", "kiln-ops"},
      {"kiln_version", info.kiln_version},
      {"backend", to_string(options.config.backend)},
      {"device", device_label(options.config)},
      {"status", to_string(info.exit_status)},
      {"exit_status", static_cast<int>(info.exit_status)},
      {"budget", budget_json(report, info)},
      {"options",
       {{"filter", options.filter},
        {"repeat", options.repeat},
        {"fault_at", options.fault_at},
        {"fault", options.fault ? json(options.fault->to_text()) : json(nullptr)},
        {"max_array_bytes", options.max_array_bytes},
        {"device_heap_bytes", options.config.device_heap_bytes}}},
      {"summary",
       {{"cases", report.results.size()},
        {"ok", report.ok},
        {"refused", report.refused},
        {"failed", report.failed},
        {"allocations", report.allocations}}},
      {"peak_bytes", category_bytes(report.peak_bytes)},
      {"teardown",
       {{"ledger_bytes", report.ledger_after_teardown_bytes},
        {"device_bytes", report.device_after_teardown_bytes}}},
      {"setup_failure", report.setup_failure ? failure_json(*report.setup_failure) : json(nullptr)},
      {"cases", std::move(cases)},
      {"sweep", sweep_json(info.sweep, options)},
      {"min_budget", min_budget_json(info.min_budget)}};
  return doc.dump(2, ' ', false, json::error_handler_t::replace) + "\n";
}

}  // namespace kiln::ops
