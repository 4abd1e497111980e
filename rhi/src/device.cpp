#include <fmt/format.h>

#include "kiln/rhi/device.h"

namespace kiln {

namespace {

constexpr Backend kBackends[] = {
#define KILN_BACKEND(name, code_arch) Backend::name,
#include "kiln/rhi/backends.inc"
#undef KILN_BACKEND
};

}  // namespace

std::string_view to_string(Backend backend) {
  switch (backend) {
#define KILN_BACKEND(name, code_arch) \
  case Backend::name: return #name;
#include "kiln/rhi/backends.inc"
#undef KILN_BACKEND
  }
  return "unknown";
}

RhiExpected<Backend> parse_backend(std::string_view name) {
  std::string known;
  for (Backend b : kBackends) {
    if (name == to_string(b)) return b;
    known += fmt::format("{}{}", known.empty() ? "" : ", ", to_string(b));
  }
  return std::unexpected(invalid_usage(
      "kiln", "parse_backend",
      fmt::format("unknown backend '{}'; kiln knows {}", name, known)));
}

RhiResult LlvmDevice::get_memory_info(uint64_t *free_bytes, uint64_t *total_bytes) {
  auto info = memory_info();
  if (!info) {
    const RhiResult result = info.error().result;
    set_last_failure(std::move(info).error());
    return result;
  }
  *free_bytes = info->free_bytes;
  *total_bytes = info->total_bytes;
  return RhiResult::success;
}

}  // namespace kiln
