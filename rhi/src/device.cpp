#include <charconv>

#include <fmt/format.h>

#include "kiln/rhi/device.h"
#include "kiln/rhi/user_text.h"

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
      fmt::format("unknown backend {}; kiln knows {}", quote_user_text(name), known)));
}

RhiExpected<DeviceName> parse_device_name(std::string_view name) {
  const std::size_t colon = name.find(':');
  KILN_ASSIGN_OR_RETURN(const Backend backend, parse_backend(name.substr(0, colon)));
  DeviceName parsed{.backend = backend};
  if (colon == std::string_view::npos) return parsed;
  const std::string_view digits = name.substr(colon + 1);
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), parsed.ordinal);
  if (digits.empty() || digits.size() > 4 || ec != std::errc() || end != digits.data() + digits.size() ||
      digits.front() == '-' || digits.front() == '+')
    return std::unexpected(invalid_usage(
        "kiln", "parse_device_name",
        fmt::format("{} is not a device name: after '{}:' comes a device ordinal from 0 to 9999",
                    quote_user_text(name), to_string(backend))));
  return parsed;
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
