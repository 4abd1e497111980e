// Helpers shared by the memory layer's tests (DeviceMemory over a MockDevice, caching on).
#ifndef KILN_MEMORY_TEST_SUPPORT_H_
#define KILN_MEMORY_TEST_SUPPORT_H_

#include <catch2/catch.hpp>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "kiln/rhi/mock_device.h"
#include "kiln/runtime/memory/device_memory.h"

namespace kiln::test::memory {

constexpr uint64_t operator""_KiB(unsigned long long n) { return n << 10; }
constexpr uint64_t operator""_MiB(unsigned long long n) { return n << 20; }
constexpr uint64_t operator""_GiB(unsigned long long n) { return n << 30; }

/// A mock with `capacity_bytes` and, optionally, a script of other processes' usage.
inline MockDeviceOptions mock_options(uint64_t capacity_bytes, std::vector<uint64_t> script = {}) {
  MockDeviceOptions options;
  options.capacity_bytes = capacity_bytes;
  options.other_process_bytes_script = std::move(script);
  return options;
}

/// A fixed limit with caching on (the default, and what these tests are about).
inline runtime::BudgetConfig cached(uint64_t limit_bytes, uint64_t reserve_bytes = 0,
                                    bool live_check = true) {
  runtime::BudgetConfig config;
  config.limit_bytes = limit_bytes;
  config.reserve_bytes = reserve_bytes;
  config.live_check = live_check;
  return config;
}

/// A DeviceMemory over `mock` with caching on; fails the test if it cannot be made.
inline std::unique_ptr<runtime::DeviceMemory> make_memory(MockDevice &mock,
                                                          runtime::BudgetConfig config) {
  REQUIRE(config.caching);
  auto memory = runtime::DeviceMemory::create(mock, config);
  REQUIRE(memory);
  return std::move(*memory);
}

/// Whether this build runs under AddressSanitizer or ThreadSanitizer: thread creation and every
/// memory access are many times slower there (AddressSanitizer also poisons the shadow of every
/// MiB-sized block the mock allocates), so stress tests do fewer rounds.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif

/// `full` rounds of a stress loop, or a two-hundredth of them under a sanitizer.
inline constexpr int stress_rounds(int full) { return kSanitized ? full / 200 : full; }

/// The bytes `memory` holds in `category` now.
inline uint64_t charged(runtime::DeviceMemory &memory, MemoryCategory category) {
  return memory.in_use_by_category()[static_cast<std::size_t>(category)];
}

}  // namespace kiln::test::memory

#endif  // KILN_MEMORY_TEST_SUPPORT_H_
