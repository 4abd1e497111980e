// Internal state of the fake CUDA driver: configuration (environment or control API), the fault
// plan, the call counters, device memory over host memory, modules and functions. One instance
// per process, guarded by one mutex; the entry points in fake_driver.cpp hold the lock for the
// whole call (a kernel launch included), so the fake behaves as one in-order stream.
#ifndef KILN_TEST_FAKE_CUDA_FAKE_STATE_H_
#define KILN_TEST_FAKE_CUDA_FAKE_STATE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "cuda_types.h"
#include "kiln/runtime/kernel_abi.h"

namespace kiln::fake_cuda {

enum class Mode { normal, stub, nodevice };

/// The ops of KILN_FOR_EACH_KERNEL, for the launch-time memory checks.
enum class Op { fill, copy, axpy, reduce_sum, matmul, compact_positive };

/// One host-compiled kernel that a GPU entry point name stands for.
struct HostKernel {
  const char *gpu_name;      ///< kiln_<op>_<dtype>_gpu
  KilnKernelFn range_kernel;  ///< kiln_<op>_<dtype>, compiled for the host into this library
  Op op;
  std::size_t element_bytes;
};

/// The 24 kernels (fake_kernels.cpp); nullptr if `gpu_name` is none of them.
const HostKernel *find_host_kernel(std::string_view gpu_name);

struct Fault {
  uint64_t at_call = 0;  ///< the entry point's call count that fails; 0 = every call
  CUresult result = 0;
};

struct Allocation {
  void *host = nullptr;
  std::size_t size_bytes = 0;
};

}  // namespace kiln::fake_cuda

// The opaque handle types of cuda_types.h, defined by the fake.
struct CUctx_st {
  int retain_count = 0;
};
struct CUfunc_st {
  CUmodule module = nullptr;
  const kiln::fake_cuda::HostKernel *kernel = nullptr;
};
struct CUmod_st {
  std::size_t charged_bytes = 0;
  std::set<std::string, std::less<>> entries;  ///< the .entry names of the PTX
  std::map<std::string, std::unique_ptr<CUfunc_st>, std::less<>> functions;
};

namespace kiln::fake_cuda {

/// Everything the fake knows. Access only through lock().
struct State {
  // configuration
  Mode mode = Mode::normal;
  std::size_t capacity_bytes = std::size_t{1024} << 20;
  std::vector<std::size_t> other_script{0};  ///< other processes' usage, one per cuMemGetInfo_v2
  std::size_t other_index = 0;               ///< next script entry cuMemGetInfo_v2 consumes
  std::size_t other_bytes = 0;               ///< the value last reported (what allocation sees)
  std::string config_error;  ///< a malformed KILN_FAKE_CUDA_* variable: cuInit fails

  // driver state
  bool initialized = false;
  CUresult sticky_error = 0;
  std::map<std::string, uint64_t, std::less<>> call_counts;
  std::map<std::string, std::vector<Fault>, std::less<>> faults;
  CUctx_st primary_context;
  std::map<CUdeviceptr, Allocation> allocations;
  std::size_t held_bytes = 0;
  std::size_t high_water_bytes = 0;
  std::size_t module_bytes = 0;
  uint64_t oom_count = 0;
  uint64_t launch_count = 0;
  std::map<CUmodule, std::unique_ptr<CUmod_st>> modules;

  /// Frees every allocation and module (the primary context went away, or a reset).
  void release_device_memory();
  /// Re-reads the KILN_FAKE_CUDA_* environment into the configuration.
  void load_environment();
  /// Free device memory now: capacity - held - modules - other processes, never below 0.
  [[nodiscard]] std::size_t free_bytes() const;
  /// True if [address, address + size_bytes) lies inside one live allocation.
  [[nodiscard]] bool device_range_ok(uint64_t address, uint64_t size_bytes) const;
  /// The fault planned for this call of `entry` (whose count was just incremented), or 0.
  [[nodiscard]] CUresult planned_fault(std::string_view entry);
  /// Adds a fault `nth_call` calls of `entry` from now; false if `entry` is unknown.
  bool add_fault(std::string_view entry, uint64_t nth_call, CUresult result);
};

/// The state, locked for the lifetime of the returned guard. The state is created (and the
/// environment read) on first use.
struct LockedState {
  std::unique_lock<std::mutex> lock;
  State *state;
  State *operator->() const { return state; }
};
LockedState lock_state();

/// Resets the state to a freshly loaded library's (the caller holds the lock).
void reset_state(State &state);

/// True for an entry point name of rhi/cuda/cuda_driver.inc.
bool is_entry_point(std::string_view name);

/// CUDA_ERROR_* name of `result`, or nullptr if the fake does not know it.
const char *error_name(CUresult result);

/// Parses a CUresult given as a number or a CUDA_ERROR_* / CUDA_SUCCESS name; false if neither.
bool parse_result(std::string_view text, CUresult *result);

/// Sticky faults: after one is returned, the context is unusable and every call returns it.
bool is_sticky(CUresult result);

/// The context current on this thread (cuCtxSetCurrent), or nullptr.
CUcontext &current_context();

}  // namespace kiln::fake_cuda

#endif  // KILN_TEST_FAKE_CUDA_FAKE_STATE_H_
