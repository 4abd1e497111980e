#include "kiln/rhi/backend_registry.h"

#include <fmt/format.h>

namespace kiln {

// Each backend's factory, defined in its own folder (rhi/<name>/).
#define KILN_BACKEND(name, code_arch) \
  RhiExpected<std::unique_ptr<LlvmDevice>> make_##name##_device(const DeviceOptions &options);
#include "kiln/rhi/backends.inc"
#undef KILN_BACKEND

RhiExpected<std::unique_ptr<LlvmDevice>> create_device(Backend backend, const DeviceOptions &options) {
  switch (backend) {
#define KILN_BACKEND(name, code_arch) \
  case Backend::name: return make_##name##_device(options);
#include "kiln/rhi/backends.inc"
#undef KILN_BACKEND
  }
  return std::unexpected(make_failure(
      RhiResult::not_supported, std::string(to_string(backend)), "create_device",
      fmt::format("the {} backend is not built into this kiln", to_string(backend))));
}

}  // namespace kiln
