// The GPU status-mapping matrix: the behaviours every backend's one driver-code -> RhiResult table
// must keep (rhi/cuda/cuda_status.cpp, rhi/amdgpu/hip_status.cpp), one body each, run once per
// backend. A backend registers itself in its own file (test_cuda_status.cpp,
// test_hip_status.cpp) by describing its codes in a GpuStatusTable and writing
// KILN_GPU_STATUS_MATRIX(fn, "tag"); that file also holds the cases only it has (its loader).
#ifndef KILN_TEST_UNIT_GPU_STATUS_MATRIX_H_
#define KILN_TEST_UNIT_GPU_STATUS_MATRIX_H_

#include <string>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "kiln/executor/errors.h"
#include "kiln/rhi/result.h"

namespace kiln::test {

/// One backend's driver codes as the matrix checks them (codes are the driver's numbers).
struct GpuStatusTable {
  const char *device;  // "cuda:0"
  const char *site;    // the entry point named in mapped failures: "cuTest"
  /// The backend's mapping: to_rhi(nullptr, code, site, device).
  RhiStatus (*to_rhi)(int code, const char *site, const char *device);
  int success;
  std::pair<int, const char *> out_of_memory;           // its code and name
  std::vector<int> sticky;                              // device_lost
  std::vector<std::pair<int, const char *>> sticky_names;
  std::vector<int> absent;                              // no driver or device: not_supported
  std::vector<std::pair<int, const char *>> absent_names;
  std::vector<std::pair<int, const char *>> errors;     // error with the name (invalid value...)
  const char *not_allocating_site;  // an entry whose out-of-memory allocates nothing (a copy)

  /// The Failure `code` maps to (fails the test when it maps to success).
  [[nodiscard]] Failure map(int code) const {
    auto status = to_rhi(code, site, device);
    REQUIRE_FALSE(status);
    return status.error();
  }
};

namespace gpu_status_matrix {

inline void success_maps_to_success(const GpuStatusTable &t) {
  CHECK(t.to_rhi(t.success, t.site, t.device));
}

inline void out_of_memory_is_a_driver_out_of_memory(const GpuStatusTable &t) {
  const Failure f = t.map(t.out_of_memory.first);
  CHECK(f.result == RhiResult::out_of_memory);
  CHECK(f.oom_source == OomSource::driver);
  CHECK(std::string(f.driver_status) == t.out_of_memory.second);
  CHECK(classify(f) == ErrorKind::device_out_of_memory);
}

inline void sticky_faults_are_device_lost(const GpuStatusTable &t) {
  REQUIRE_FALSE(t.sticky.empty());
  for (int code : t.sticky) {
    INFO("code " << code);
    CHECK(t.map(code).result == RhiResult::device_lost);
    CHECK(classify(t.map(code)) == ErrorKind::device_lost);
  }
  for (const auto &[code, name] : t.sticky_names) CHECK(std::string(t.map(code).driver_status) == name);
}

inline void absent_drivers_and_devices_are_not_supported(const GpuStatusTable &t) {
  REQUIRE_FALSE(t.absent.empty());
  for (int code : t.absent) {
    INFO("code " << code);
    CHECK(t.map(code).result == RhiResult::not_supported);
  }
  for (const auto &[code, name] : t.absent_names) CHECK(std::string(t.map(code).driver_status) == name);
}

inline void other_codes_are_errors_with_their_name(const GpuStatusTable &t) {
  REQUIRE_FALSE(t.errors.empty());
  for (const auto &[code, name] : t.errors) {
    INFO("code " << code);
    CHECK(t.map(code).result == RhiResult::error);
    CHECK(std::string(t.map(code).driver_status) == name);
  }
  const Failure unknown = t.map(12345);
  CHECK(unknown.result == RhiResult::error);
  CHECK_THAT(unknown.message(), Catch::Contains("12345") && Catch::Contains(t.site));
}

inline void out_of_memory_outside_an_allocation_is_no_allocation_of_0_B(const GpuStatusTable &t) {
  auto status = t.to_rhi(t.out_of_memory.first, t.not_allocating_site, t.device);
  REQUIRE_FALSE(status);
  CHECK_FALSE(status.error().allocating);
  CHECK_THAT(status.error().message(),
             Catch::StartsWith(std::string(t.device) + " ran out of memory in " + t.not_allocating_site) &&
                 !Catch::Contains("0 B") && !Catch::Contains("ndarray"));
}

}  // namespace gpu_status_matrix
}  // namespace kiln::test

/// Registers the matrix for the table `table_fn()` returns, each case tagged [`tag`][status].
#define KILN_GPU_STATUS_MATRIX(table_fn, tag)                                                      \
  TEST_CASE(tag ": the driver's success maps to success", "[" tag "][status]") {                   \
    ::kiln::test::gpu_status_matrix::success_maps_to_success(table_fn());                          \
  }                                                                                                \
  TEST_CASE(tag ": the driver's out-of-memory is a driver out_of_memory", "[" tag "][status]") {   \
    ::kiln::test::gpu_status_matrix::out_of_memory_is_a_driver_out_of_memory(table_fn());          \
  }                                                                                                \
  TEST_CASE(tag ": sticky faults are device_lost", "[" tag "][status]") {                          \
    ::kiln::test::gpu_status_matrix::sticky_faults_are_device_lost(table_fn());                    \
  }                                                                                                \
  TEST_CASE(tag ": absent drivers and devices are not_supported", "[" tag "][status]") {           \
    ::kiln::test::gpu_status_matrix::absent_drivers_and_devices_are_not_supported(table_fn());     \
  }                                                                                                \
  TEST_CASE(tag ": a driver code is error with its name, invalid value too (kiln checked the "     \
                "values)",                                                                         \
            "[" tag "][status]") {                                                                 \
    ::kiln::test::gpu_status_matrix::other_codes_are_errors_with_their_name(table_fn());           \
  }                                                                                                \
  TEST_CASE(tag ": out-of-memory from a call that allocates nothing is no allocation of 0 B",      \
            "[" tag "][status]") {                                                                 \
    ::kiln::test::gpu_status_matrix::out_of_memory_outside_an_allocation_is_no_allocation_of_0_B(  \
        table_fn());                                                                               \
  }

#endif  // KILN_TEST_UNIT_GPU_STATUS_MATRIX_H_
