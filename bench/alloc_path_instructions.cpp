// kiln-alloc-path-instructions CASE N: runs one DeviceMemory path N times on a MockDevice, for
// bench/alloc_path_callgrind.sh, which runs it under callgrind at two N and prints the
// instructions per call (the difference over the extra calls: set-up cancels out). Instruction
// counts are deterministic, so a change's cost is seen on a noisy machine. Cases:
//   pool_hit_locked  a 64 MiB block freed and allocated again (above the thread caches' 4 MiB
//                    classes: the locked path's hit in the shared pool)
//   pool_hit_fast    a 1 MiB block freed and allocated again (the lock-free thread-cache hit)
//   refusal          a request over the limit, refused by the budget (nothing held, no eviction)
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "kiln/rhi/mock_device.h"
#include "kiln/runtime/memory/device_memory.h"

namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;

int run(std::string_view which, long n) {
  kiln::MockDeviceOptions options;
  options.capacity_bytes = 1024 * kMiB;
  kiln::MockDevice device(options);
  kiln::runtime::BudgetConfig config;
  config.limit_bytes = 256 * kMiB;
  config.reserve_bytes = 0;
  auto memory = kiln::runtime::DeviceMemory::create(device, config);
  if (!memory) return 2;
  const auto category = kiln::MemoryCategory::ndarray;
  const uint64_t size_bytes = which == "pool_hit_locked" ? 64 * kMiB
                              : which == "pool_hit_fast" ? 1 * kMiB
                              : which == "refusal"       ? 512 * kMiB
                                                         : 0;
  if (size_bytes == 0) return 2;
  const bool refusal = which == "refusal";
  long ok = 0;
  for (long i = 0; i < n; ++i) {
    auto alloc = (*memory)->allocate(category, size_bytes);
    if (alloc.has_value() != !refusal) return 3;
    if (alloc) ok += (*memory)->free(*alloc).has_value();
  }
  std::printf("%s x %ld: %ld freed\n", std::string(which).c_str(), n, ok);
  return 0;
}

}  // namespace

int main(int argc, char **argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s pool_hit_locked|pool_hit_fast|refusal N\n", argv[0]);
    return 2;
  }
  return run(argv[1], std::atol(argv[2]));
}
