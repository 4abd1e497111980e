// FaultSpec::parse and the KILN_FAULT variable (grammar in fault_spec.h).
#include "kiln/runtime/memory/fault_spec.h"

#include <array>
#include <charconv>
#include <cstdlib>
#include <utility>

#include <fmt/format.h>

namespace kiln::runtime {
namespace {

/// A parse error: what was wrong with `term` of `text`, and the grammar.
std::unexpected<Failure> bad_term(std::string_view text, std::string_view term, std::string_view why) {
  return std::unexpected(invalid_usage(
      "kiln", "FaultSpec::parse",
      fmt::format("fault spec '{}': term '{}' {}; grammar: {}", text, term, why, kFaultSpecGrammar)));
}

/// A whole unsigned decimal number, or nullopt (empty, sign, trailing characters, overflow).
std::optional<uint64_t> parse_u64(std::string_view digits) {
  uint64_t value = 0;
  const char *end = digits.data() + digits.size();
  auto [ptr, ec] = std::from_chars(digits.data(), end, value);
  if (digits.empty() || ec != std::errc() || ptr != end) return std::nullopt;
  return value;
}

/// "64MiB" -> bytes; nullopt for a bad number, an unknown unit or an overflow.
std::optional<uint64_t> parse_size(std::string_view value) {
  static constexpr std::array<std::pair<std::string_view, unsigned>, 4> kUnits = {
      {{"GiB", 30}, {"MiB", 20}, {"KiB", 10}, {"B", 0}}};
  unsigned shift = 0;
  for (const auto &[unit, unit_shift] : kUnits)
    if (value.ends_with(unit)) {
      value.remove_suffix(unit.size());
      shift = unit_shift;
      break;
    }
  const std::optional<uint64_t> n = parse_u64(value);
  if (!n || (shift != 0 && *n > (UINT64_MAX >> shift))) return std::nullopt;
  return *n << shift;
}

/// A probability in [0, 1], or nullopt (not a number, NaN, out of range, trailing characters).
std::optional<double> parse_probability(std::string_view value) {
  double p = 0.0;
  const char *end = value.data() + value.size();
  auto [ptr, ec] = std::from_chars(value.data(), end, p);
  if (value.empty() || ec != std::errc() || ptr != end || !(p >= 0.0 && p <= 1.0)) return std::nullopt;
  return p;
}

/// The category named `name` (to_string's names; pool_cache is the pool's own, never requested).
std::optional<MemoryCategory> category_named(std::string_view name) {
  for (std::size_t i = 0; i < kNumMemoryCategories; ++i) {
    const auto category = static_cast<MemoryCategory>(i);
    if (category != MemoryCategory::pool_cache && to_string(category) == name) return category;
  }
  return std::nullopt;
}

/// Whether `name` is an identifier: [A-Za-z_][A-Za-z0-9_]*.
bool is_identifier(std::string_view name) {
  const auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (name.empty() || !alpha(name.front())) return false;
  for (char c : name)
    if (!alpha(c) && !(c >= '0' && c <= '9')) return false;
  return true;
}

/// The kind named `name` (to_string(FaultKind)'s names).
std::optional<FaultKind> kind_named(std::string_view name) {
  for (FaultKind kind : {FaultKind::oom, FaultKind::lost, FaultKind::launch, FaultKind::heap})
    if (to_string(kind) == name) return kind;
  return std::nullopt;
}

/// Parses one `key=value` term into `spec`; `seen` holds the keys already given.
RhiStatus parse_term(std::string_view text, std::string_view term, FaultSpec &spec, std::string &seen) {
  const std::size_t eq = term.find('=');
  if (term.empty()) return bad_term(text, term, "is empty");
  if (eq == std::string_view::npos) return bad_term(text, term, "is not key=value");
  const std::string_view key = term.substr(0, eq);
  const std::string_view value = term.substr(eq + 1);
  const std::string marker = fmt::format("|{}|", key);
  if (seen.find(marker) != std::string::npos) return bad_term(text, term, "repeats its key");
  seen += marker;
  if (key == "nth") {
    const std::optional<uint64_t> n = parse_u64(value);
    if (!n || *n == 0) return bad_term(text, term, "needs a whole number >= 1");
    spec.nth = *n;
  } else if (key == "category") {
    const std::optional<MemoryCategory> c = category_named(value);
    if (!c) return bad_term(text, term, "names no memory category");
    spec.category = c;
  } else if (key == "min_bytes") {
    const std::optional<uint64_t> size = parse_size(value);
    if (!size) return bad_term(text, term, "needs a whole number with unit B, KiB, MiB or GiB");
    spec.min_bytes = *size;
  } else if (key == "p") {
    spec.probability = parse_probability(value);
    if (!spec.probability) return bad_term(text, term, "needs a number from 0 to 1");
  } else if (key == "seed") {
    const std::optional<uint64_t> s = parse_u64(value);
    if (!s) return bad_term(text, term, "needs a whole number");
    spec.seed = *s;
  } else if (key == "kind") {
    const std::optional<FaultKind> kind = kind_named(value);
    if (!kind) return bad_term(text, term, "names no failure kind (oom, lost, launch, heap)");
    spec.kind = *kind;
  } else if (key == "kernel") {
    if (!is_identifier(value))
      return bad_term(text, term, "needs an op or kernel name (letters, digits, '_')");
    spec.kernel = value;
  } else {
    return bad_term(text, term, "has an unknown key");
  }
  return {};
}

}  // namespace

RhiExpected<FaultSpec> FaultSpec::parse(std::string_view text) {
  if (text.empty()) return bad_term(text, text, "is empty: a spec needs at least one term");
  FaultSpec spec;
  std::string seen;
  std::string_view rest = text;
  while (true) {
    const std::size_t comma = rest.find(',');
    KILN_RETURN_IF_ERROR(parse_term(text, rest.substr(0, comma), spec, seen));
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  if (seen.find("|seed|") != std::string::npos && !spec.probability)
    return bad_term(text, "seed", "is given without p (the seed is for p's draws)");
  if (spec.nth != 0 && spec.probability)
    return bad_term(text, "p", "cannot be combined with nth (one trigger per spec)");
  if (spec.targets_launches()) {
    const std::string why = fmt::format(
        "filters allocation requests; kind={} counts launches (filter them with kernel=)",
        to_string(spec.kind));
    if (spec.category) return bad_term(text, "category", why);
    if (seen.find("|min_bytes|") != std::string::npos) return bad_term(text, "min_bytes", why);
  }
  return spec;
}

std::string_view to_string(FaultKind kind) {
  switch (kind) {
    case FaultKind::oom: return "oom";
    case FaultKind::lost: return "lost";
    case FaultKind::launch: return "launch";
    case FaultKind::heap: return "heap";
  }
  return "oom";
}

bool FaultSpec::kernel_named(std::string_view name, std::string_view kernel) {
  if (name == kernel) return true;
  // "axpy" names "kiln_axpy_<dtype>"; a dtype has no '_' ("reduce" does not name reduce_sum).
  constexpr std::string_view kPrefix = "kiln_";
  if (!kernel.starts_with(kPrefix)) return false;
  kernel.remove_prefix(kPrefix.size());
  if (!kernel.starts_with(name) || kernel.size() <= name.size() + 1 || kernel[name.size()] != '_')
    return false;
  return kernel.substr(name.size() + 1).find('_') == std::string_view::npos;
}

bool FaultSpec::selects(const AllocRequest &request) const {
  return !targets_launches() && (!category || request.category == *category) &&
         request.size_bytes >= min_bytes &&
         (kernel.empty() || kernel_named(kernel, request.kernel));
}

bool FaultSpec::selects_launch(std::string_view launched) const {
  return targets_launches() && (kernel.empty() || kernel_named(kernel, launched));
}

std::string FaultSpec::to_text() const {
  std::string text;
  const auto add = [&text](std::string term) { text += (text.empty() ? "" : ",") + term; };
  if (nth != 0) add(fmt::format("nth={}", nth));
  if (category) add(fmt::format("category={}", to_string(*category)));
  if (min_bytes != 0) add(fmt::format("min_bytes={}B", min_bytes));
  if (!kernel.empty()) add(fmt::format("kernel={}", kernel));
  if (probability) add(fmt::format("p={},seed={}", *probability, seed));
  if (kind != FaultKind::oom || text.empty()) add(fmt::format("kind={}", to_string(kind)));
  return text;
}

RhiExpected<std::optional<FaultSpec>> fault_spec_from_env() {
  const char *value = std::getenv("KILN_FAULT");
  if (value == nullptr || *value == '\0') return std::optional<FaultSpec>{};
  RhiExpected<FaultSpec> spec = FaultSpec::parse(value);
  if (!spec) {
    Failure f = std::move(spec).error();
    f.detail = fmt::format("KILN_FAULT: {}", f.detail);
    return std::unexpected(std::move(f));
  }
  return std::optional<FaultSpec>(std::move(*spec));
}

uint64_t splitmix64_next(uint64_t &state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace kiln::runtime
