// One allocation request to a device's memory: the unit the fault plan, the budget and the
// caching pool decide on.
#ifndef KILN_RUNTIME_MEMORY_ALLOC_REQUEST_H_
#define KILN_RUNTIME_MEMORY_ALLOC_REQUEST_H_

#include <cstdint>

#include "kiln/rhi/result.h"

namespace kiln::runtime {

/// One member of an allocation (a group allocation has several, granted all or none).
struct AllocRequest {
  MemoryCategory category = MemoryCategory::ndarray;
  uint64_t size_bytes = 0;
  bool zero_fill = false;
};

}  // namespace kiln::runtime

#endif  // KILN_RUNTIME_MEMORY_ALLOC_REQUEST_H_
