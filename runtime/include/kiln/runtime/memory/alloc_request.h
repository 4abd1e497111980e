// One allocation request to a device's memory: the unit the fault plan, the budget and the
// caching pool decide on.
#ifndef KILN_RUNTIME_MEMORY_ALLOC_REQUEST_H_
#define KILN_RUNTIME_MEMORY_ALLOC_REQUEST_H_

#include <cstdint>
#include <string_view>

#include "kiln/rhi/result.h"

namespace kiln::runtime {

/// One member of an allocation (a group allocation has several, granted all or none).
struct AllocRequest {
  MemoryCategory category = MemoryCategory::ndarray;
  uint64_t size_bytes = 0;
  bool zero_fill = false;
  /// The kernel ("kiln_axpy_f32") whose launch this request is made for, as the launcher says;
  /// empty outside a launch. Only FaultSpec's kernel= filter reads it. Not owned: it must outlive
  /// the allocation call.
  std::string_view kernel{};
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_ALLOC_REQUEST_H_
