// What to do about a failure, in the words of the caller's own interface. The layers below
// (rhi, runtime) word what happened and never name a knob; the interface layer (the C++ named
// errors, the Python bindings, kiln-ops) fills Failure::advice with advise() and its knobs.
#ifndef KILN_EXECUTOR_ADVICE_H_
#define KILN_EXECUTOR_ADVICE_H_

#include <string>
#include <string_view>

#include "kiln/rhi/result.h"

namespace kiln {

/// How one interface spells the settings an advice names. An empty field: the interface has no
/// such setting, and the advice does not mention it. KILN_POOL_LIMIT_MB, which every interface
/// reads, is named beside `budget`.
struct InterfaceKnobs {
  std::string_view budget;   ///< the budget's limit
  std::string_view reserve;  ///< the headroom kept free on the device
  std::string_view heap;     ///< the device-side heap
};

/// The C++ API's knobs (BudgetConfig, ExecutorConfig); what kiln::Error's message uses.
inline constexpr InterfaceKnobs kCppKnobs{"BudgetConfig::limit_bytes", "BudgetConfig::reserve_bytes",
                                          "ExecutorConfig::device_heap_bytes"};

/// The advice for `failure` with `knobs`: empty for failures no setting cures (invalid usage,
/// lost device, ...). Out of memory: by budget limit, raise the budget; by live free memory, free
/// device memory or lower the reserve; by the driver, set a budget below the device; device
/// heap, raise the heap; host memory, free host memory (never a device setting); an injected
/// fault says it was injected.
[[nodiscard]] std::string advice_for(const Failure &failure, const InterfaceKnobs &knobs);
/// Sets `failure.advice` to advice_for(failure, knobs) unless it already has one.
void advise(Failure &failure, const InterfaceKnobs &knobs);

}  // namespace kiln

#endif  // KILN_EXECUTOR_ADVICE_H_
