#include "hip_runtime.h"

#include "src/driver_loader.h"

namespace kiln::hip {

RhiExpected<const HipRuntime *> HipRuntime::load() {
  static constexpr driver::LibraryInfo kInfo{"amdgpu", "the HIP runtime", "KILN_HIP_RUNTIME",
                                             "install ROCm's HIP runtime (libamdhip64)"};
  return driver::load_once<HipRuntime>(
      kInfo, {"libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.5"},
      [](const driver::OpenedLibrary &opened, HipRuntime &table) -> RhiStatus {
#define KILN_HIP_ENTRY(ret, name, params)                                       \
  {                                                                             \
    KILN_ASSIGN_OR_RETURN(void *address, driver::resolve(kInfo, opened, #name)); \
    table.name = reinterpret_cast<decltype(table.name)>(address);               \
  }
#include "hip_runtime.inc"
#undef KILN_HIP_ENTRY
        return {};
      });
}

}  // namespace kiln::hip
