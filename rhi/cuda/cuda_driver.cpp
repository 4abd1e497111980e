#include "cuda_driver.h"

#include "src/driver_loader.h"

namespace kiln::cuda {

RhiExpected<const CudaDriver *> CudaDriver::load() {
  static constexpr driver::LibraryInfo kInfo{"cuda", "the CUDA driver", "KILN_CUDA_DRIVER",
                                             "install the NVIDIA driver"};
  return driver::load_once<CudaDriver>(
      kInfo, {"libcuda.so.1"}, [](const driver::OpenedLibrary &opened, CudaDriver &table) -> RhiStatus {
#define KILN_CUDA_ENTRY(name, params)                                           \
  {                                                                             \
    KILN_ASSIGN_OR_RETURN(void *address, driver::resolve(kInfo, opened, #name)); \
    table.name = reinterpret_cast<decltype(table.name)>(address);               \
  }
#include "cuda_driver.inc"
#undef KILN_CUDA_ENTRY
        return {};
      });
}

}  // namespace kiln::cuda
