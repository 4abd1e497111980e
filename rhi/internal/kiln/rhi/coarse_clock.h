// CLOCK_MONOTONIC_COARSE in nanoseconds: the clock kiln dates reused readings with. Reading it is
// a load from the vDSO's page (steady_clock may have to read a hardware or paravirtual clock, far
// slower on a VM); it advances once per kernel tick (1 to 10 ms, depending on the kernel's HZ).
#ifndef KILN_RHI_COARSE_CLOCK_H_
#define KILN_RHI_COARSE_CLOCK_H_

#include <time.h>

#include <cstdint>

namespace kiln {

[[nodiscard]] inline int64_t coarse_now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

/// How far apart the clock's readings are (one kernel tick), in ns; asked once.
[[nodiscard]] inline int64_t coarse_resolution_ns() {
  static const int64_t resolution_ns = [] {
    timespec ts{};
    if (clock_getres(CLOCK_MONOTONIC_COARSE, &ts) != 0) return int64_t{10'000'000};  // HZ=100
    return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  }();
  return resolution_ns;
}

}  // namespace kiln

#endif  // KILN_RHI_COARSE_CLOCK_H_
