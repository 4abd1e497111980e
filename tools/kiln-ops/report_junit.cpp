// The JUnit XML report of a kiln-ops run: the format Jenkins, GitLab, GitHub and Buildkite
// read. REFUSED is <skipped> (an answer, not a failure, as in the exit status), FAIL <failure>.
#include <fmt/format.h>

#include "kiln/executor/errors.h"
#include "methods.h"
#include "reports.h"

namespace kiln::ops {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

/// The length of the well-formed UTF-8 sequence of a non-ASCII character at the start of `s`
/// that XML 1.0 allows (no surrogate, no overlong form, no U+FFFE/U+FFFF); 0 if there is none.
std::size_t utf8_char_length(std::string_view s) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(s[i]); };
  std::size_t length = 0;
  uint32_t code = 0;
  if (byte(0) >= 0xC2 && byte(0) <= 0xDF)
    length = 2, code = byte(0) & 0x1Fu;
  else if (byte(0) >= 0xE0 && byte(0) <= 0xEF)
    length = 3, code = byte(0) & 0x0Fu;
  else if (byte(0) >= 0xF0 && byte(0) <= 0xF4)
    length = 4, code = byte(0) & 0x07u;
  else
    return 0;
  if (s.size() < length) return 0;
  for (std::size_t i = 1; i < length; ++i) {
    if ((byte(i) & 0xC0u) != 0x80u) return 0;
    code = (code << 6) | (byte(i) & 0x3Fu);
  }
  const bool overlong = (length == 3 && code < 0x800) || (length == 4 && code < 0x10000);
  const bool excluded =
      (code >= 0xD800 && code <= 0xDFFF) || code == 0xFFFE || code == 0xFFFF || code > 0x10FFFF;
  return overlong || excluded ? 0 : length;
}

/// `s` as XML 1.0 text, valid in an attribute value too: markup characters and line breaks as
/// references; other control characters and bytes that are no valid UTF-8 as U+FFFD.
std::string xml_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x80) {
      const std::size_t length = utf8_char_length(s.substr(i));
      out += length == 0 ? kReplacement : s.substr(i, length);
      i += length == 0 ? 1 : length;
      continue;
    }
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      case '\n': out += "&#10;"; break;
      case '\r': out += "&#13;"; break;
      case '\t': out += "&#9;"; break;
      default:
        if (c < 0x20)
          out += kReplacement;
        else
          out += static_cast<char>(c);
    }
    ++i;
  }
  return out;
}

struct Counts {
  std::size_t tests = 0, failures = 0, errors = 0, skipped = 0;
  double seconds = 0.0;
};

/// One <testcase>; `name` gets " (run k)" when the suite ran more than once.
/// One <testcase>; `repetition` 0: one for the whole run, never named "(run k)".
void add_testcase(std::string &xml, Counts &counts, const RunInfo &info, std::string_view name,
                  int repetition, double seconds, std::string_view body) {
  const std::string classname = fmt::format("kiln-ops.{}", device_label(info.options->config));
  const std::string run =
      info.options->repeat > 1 && repetition > 0 ? fmt::format(" (run {})", repetition) : "";
  xml += fmt::format("    <testcase classname=\"{}\" name=\"{}{}\" time=\"{:.6f}\"",
                     xml_escape(classname), xml_escape(name), run, seconds);
  xml += body.empty() ? "/>\n" : fmt::format(">\n      {}\n    </testcase>\n", body);
  counts.tests += 1;
  counts.seconds += seconds;
}

std::string case_body(const CaseResult &r, Counts &counts) {
  switch (r.verdict) {
    case Verdict::ok: return {};
    case Verdict::refused:
      counts.skipped += 1;
      return fmt::format("<skipped message=\"REFUSED {}\"/>", xml_escape(r.detail));
    case Verdict::fail: break;
  }
  counts.failures += 1;
  const std::string type = r.failure ? r.error_name : "WrongResult";
  const std::string message = r.failure ? r.detail : fmt::format("{}: {}", type, r.detail);
  return fmt::format("<failure type=\"{}\" message=\"{}\">{}</failure>", xml_escape(type),
                     xml_escape(message), xml_escape(message));
}

/// A case a set-up failure left unrun: skipped when the backend is absent, else an error.
std::string not_run_body(const Failure &setup, const RunInfo &info, Counts &counts) {
  const std::string why = describe(setup, kKilnOpsKnobs);
  if (info.exit_status == ExitStatus::backend_unavailable) {
    counts.skipped += 1;
    return fmt::format("<skipped message=\"backend unavailable: {}\"/>", xml_escape(why));
  }
  counts.errors += 1;
  return fmt::format("<error type=\"{}\" message=\"set-up failed: {}\"/>",
                     xml_escape(error_name(classify(setup))), xml_escape(why));
}

/// The testcase of --sweep / --min-budget itself, so a CI reading only the JUnit sees what the
/// exit status says: an <error> when the method had no answer (exit 3), a <failure> when runs of
/// the sweep broke the contract (exit 1), else passed. Nothing when no method ran.
void add_method_testcase(std::string &xml, Counts &counts, const RunInfo &info) {
  const std::optional<testing::WorkloadError> *error = nullptr;
  std::string failure;
  if (info.sweep != nullptr) {
    error = &info.sweep->error;
    if (info.sweep->broken != 0)
      failure = fmt::format("{} of {} sweep run(s) broke the contract", info.sweep->broken,
                            info.sweep->runs.size());
  } else if (info.min_budget != nullptr) {
    error = &info.min_budget->error;
  } else {
    return;
  }
  const std::string_view name = info.sweep != nullptr ? "sweep" : "min-budget";
  std::string body;
  if (error->has_value()) {
    counts.errors += 1;
    body = fmt::format("<error type=\"{}\" message=\"{}\"/>", xml_escape((*error)->name()),
                       xml_escape((*error)->message));
  } else if (!failure.empty()) {
    counts.failures += 1;
    body = fmt::format("<failure type=\"SweepError\" message=\"{}\"/>", xml_escape(failure));
  }
  add_testcase(xml, counts, info, name, /*repetition=*/0, 0.0, body);
}

std::string properties(const SuiteReport &report, const RunInfo &info) {
  std::string xml = "    <properties>\n";
  const auto add = [&](std::string_view name, const std::string &value) {
    xml += fmt::format("      <property name=\"{}\" value=\"{}\"/>\n", name, xml_escape(value));
  };
  add("kiln_version", std::string(info.kiln_version));
  add("backend", device_label(info.options->config));
  add("exit_status", std::to_string(static_cast<int>(info.exit_status)));
  add("budget_source", info.budget_source);
  if (report.budget.known) add("budget_limit_bytes", std::to_string(report.budget.limit_bytes));
  return xml + "    </properties>\n";
}

}  // namespace

std::string junit_report(const SuiteReport &report, const RunInfo &info) {
  Counts counts;
  std::string cases;
  for (const CaseResult &r : report.results)
    add_testcase(cases, counts, info, r.name, r.repetition, r.seconds, case_body(r, counts));
  if (report.setup_failure) {
    const int repetition = report.results.empty() ? 1 : report.results.back().repetition + 1;
    for (const std::string &name : info.case_names)
      add_testcase(cases, counts, info, name, repetition, 0.0,
                   not_run_body(*report.setup_failure, info, counts));
  }
  add_method_testcase(cases, counts, info);
  const std::string totals =
      fmt::format("tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.6f}\"",
                  counts.tests, counts.failures, counts.errors, counts.skipped, counts.seconds);
  const std::string suite = fmt::format("kiln-ops.{}", device_label(info.options->config));
  return fmt::format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"kiln-ops\" {}>\n"
      "  <testsuite name=\"{}\" {}>\n{}{}  </testsuite>\n</testsuites>\n",
      totals, xml_escape(suite), totals, properties(report, info), cases);
}

}  // namespace kiln::ops
