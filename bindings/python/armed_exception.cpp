// The armed C++ exception of the bindings' testing hook (armed_exception.h).
#include "armed_exception.h"

#include <atomic>
#include <future>
#include <new>
#include <system_error>

namespace kiln::python {
namespace {

/// site in the low byte, kind in the next; 0 (none) when nothing is armed.
std::atomic<uint16_t> g_armed{0};

}  // namespace

void arm_cpp_exception(ArmedSite site, ArmedKind kind) {
  g_armed.store(static_cast<uint16_t>(static_cast<uint16_t>(site) | static_cast<uint16_t>(kind) << 8),
                std::memory_order_relaxed);
}

void throw_if_armed(ArmedSite site) {
  uint16_t armed = g_armed.load(std::memory_order_relaxed);
  if ((armed & 0xff) != static_cast<uint16_t>(site) || site == ArmedSite::none) [[likely]]
    return;
  if (!g_armed.compare_exchange_strong(armed, 0)) return;  // another thread took it
  throw_cpp_exception_of(static_cast<ArmedKind>(armed >> 8));
}

void throw_cpp_exception_of(ArmedKind kind) {
  switch (kind) {
    case ArmedKind::future_error: throw std::future_error(std::future_errc::no_state);
    case ArmedKind::system_error:
      throw std::system_error(std::make_error_code(std::errc::resource_unavailable_try_again));
    case ArmedKind::bad_alloc: break;
  }
  throw std::bad_alloc();
}

}  // namespace kiln::python
