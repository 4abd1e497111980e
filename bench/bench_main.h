// What both benchmark programs do with their command line, before their own set-up.
#ifndef KILN_BENCH_BENCH_MAIN_H_
#define KILN_BENCH_BENCH_MAIN_H_

#include <optional>
#include <string_view>
#include <vector>

#include <benchmark/benchmark.h>

namespace kiln::bench {

/// Initializes Google Benchmark with `default_min_time` (e.g. "--benchmark_min_time=0.5") placed
/// first, so a min time given on the command line wins. Returns whether the console format is in
/// use (the ratio summary is printed only then), or nullopt after reporting an unrecognized
/// argument (the caller exits 2).
inline std::optional<bool> initialize(int argc, char **argv, const char *default_min_time) {
  std::vector<char *> args;
  args.push_back(argv[0]);
  args.push_back(const_cast<char *>(default_min_time));
  bool console_format = true;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.starts_with("--benchmark_format=") && arg != "--benchmark_format=console")
      console_format = false;
    args.push_back(argv[i]);
  }
  int num_args = static_cast<int>(args.size());
  args.push_back(nullptr);
  benchmark::Initialize(&num_args, args.data());
  if (benchmark::ReportUnrecognizedArguments(num_args, args.data())) return std::nullopt;
  return console_format;
}

}  // namespace kiln::bench

#endif  // KILN_BENCH_BENCH_MAIN_H_
