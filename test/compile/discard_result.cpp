// Built by test/compile/CMakeLists.txt with kiln's flags (-Werror=unused-result), once per
// KILN_DISCARD case. Case 0 drops nothing: it builds and runs (checking the conversions
// RhiExpected keeps from std::expected). Every other case drops one result and must fail to
// build, so the [[nodiscard]] on RhiExpected / RhiStatus / RhiResult cannot silently disappear.
#include <string>
#include <type_traits>
#include <utility>

#include "kiln/rhi/result.h"

namespace {

using kiln::Failure;
using kiln::RhiExpected;
using kiln::RhiStatus;

// An interface whose override is not [[nodiscard]] itself: g++ 12 would not warn for a dropped
// virtual call if only the functions carried the attribute.
class Freer {
 public:
  virtual ~Freer() = default;
  virtual RhiStatus free_block(int id) = 0;
  virtual RhiExpected<int> block_size(int id) = 0;
};
class Impl : public Freer {
 public:
  RhiStatus free_block(int id) override {
    if (id < 0) return std::unexpected(kiln::invalid_usage("cpu", "free_block", "negative id"));
    return {};
  }
  RhiExpected<int> block_size(int id) override { return id * 2; }
};

RhiStatus succeed() { return {}; }
RhiExpected<int> forty_two() { return 42; }
RhiExpected<long> widened(RhiExpected<int> value) { return value; }
RhiExpected<std::string> text() { return "abc"; }
kiln::RhiResult code() { return kiln::RhiResult::success; }
RhiExpected<int> refused() { return std::unexpected(kiln::invalid_usage("cpu", "refused", "x")); }
RhiExpected<int> propagated() {
  KILN_RETURN_IF_ERROR(succeed());
  KILN_ASSIGN_OR_RETURN(const int value, forty_two());
  return value + 1;
}

static_assert(std::is_base_of_v<std::expected<int, Failure>, RhiExpected<int>>);
static_assert(std::is_base_of_v<std::expected<void, Failure>, RhiStatus>);
static_assert(std::is_convertible_v<std::expected<int, Failure>, RhiExpected<int>>);
static_assert(std::is_convertible_v<std::unexpected<Failure>, RhiStatus>);
static_assert(std::is_nothrow_move_constructible_v<RhiExpected<int>>);

}  // namespace

int main() {
  Impl impl;
  Freer &freer = impl;
  int failures = 0;
  // Conversions and semantics kept from std::expected.
  RhiExpected<int> value = 3;
  value = refused();
  failures += value ? 1 : 0;
  value = 5;
  failures += value == 5 ? 0 : 1;
  failures += widened(7).value() == 7L ? 0 : 1;
  failures += text().value() == "abc" ? 0 : 1;
  failures += propagated().value() == 43 ? 0 : 1;
  failures += freer.free_block(-1) ? 1 : 0;
  failures += code() == kiln::RhiResult::success ? 0 : 1;
  RhiStatus status = {};
  failures += status ? 0 : 1;
  kiln::ignore_result(freer.free_block(1), "the test only checks that this compiles");

#if KILN_DISCARD == 1
  succeed();  // a dropped RhiStatus
#elif KILN_DISCARD == 2
  forty_two();  // a dropped RhiExpected<int>
#elif KILN_DISCARD == 3
  freer.free_block(1);  // a dropped virtual RhiStatus through a base reference
#elif KILN_DISCARD == 4
  freer.block_size(1);  // a dropped virtual RhiExpected through a base reference
#elif KILN_DISCARD == 5
  code();  // a dropped RhiResult
#endif
  return failures;
}
