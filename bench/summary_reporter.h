// The console reporter both benchmark programs print their ratio summary from: the usual table,
// plus one run kept per case name (its single run, or with repetitions the aggregate the program
// names) for the summary to read after the runs.
#ifndef KILN_BENCH_SUMMARY_REPORTER_H_
#define KILN_BENCH_SUMMARY_REPORTER_H_

#include <unistd.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include <benchmark/benchmark.h>

namespace kiln::bench {

class SummaryReporter : public benchmark::ConsoleReporter {
 public:
  /// `aggregate`: which aggregate stands for a case run with repetitions ("mean", "median").
  /// Colours on a terminal, as Google Benchmark's own reporter does.
  explicit SummaryReporter(std::string aggregate)
      : ConsoleReporter(isatty(STDOUT_FILENO) ? OO_ColorTabular : OO_Tabular),
        aggregate_(std::move(aggregate)) {}

  void ReportRuns(const std::vector<Run> &runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run &run : runs) {
      if (run.error_occurred) continue;
      // With repetitions the aggregate comes after the repetitions and overwrites them.
      if (run.run_type == Run::RT_Aggregate && run.aggregate_name != aggregate_) continue;
      runs_.insert_or_assign(run.run_name.function_name, run);
    }
  }

  /// The kept run of the case named `name`, or null if it did not run.
  [[nodiscard]] const Run *find(const std::string &name) const {
    auto it = runs_.find(name);
    return it == runs_.end() ? nullptr : &it->second;
  }

  /// Whether no case ran (--benchmark_list_tests, a filter that matched nothing).
  [[nodiscard]] bool empty() const { return runs_.empty(); }

  /// Real seconds per iteration of the case named `name`, or a negative number if it did not run.
  [[nodiscard]] double seconds(const std::string &name) const {
    const Run *run = find(name);
    return run == nullptr
               ? -1.0
               : run->GetAdjustedRealTime() / benchmark::GetTimeUnitMultiplier(run->time_unit);
  }

 private:
  std::string aggregate_;
  std::map<std::string, Run> runs_;
};

/// Runs the registered benchmarks and shuts Google Benchmark down: in the console format through
/// a SummaryReporter keeping `aggregate` ("mean", "median"), then print_summary(reporter) when
/// a case ran (not after --benchmark_list_tests); in any other format as requested, without the
/// summary.
template <class PrintSummary>
void run_benchmarks(bool console_format, std::string aggregate, PrintSummary print_summary) {
  if (console_format) {
    SummaryReporter reporter(std::move(aggregate));
    benchmark::RunSpecifiedBenchmarks(&reporter);
    if (!reporter.empty()) print_summary(reporter);
  } else {
    benchmark::RunSpecifiedBenchmarks();
  }
  benchmark::Shutdown();
}

}  // namespace kiln::bench

#endif  // KILN_BENCH_SUMMARY_REPORTER_H_
