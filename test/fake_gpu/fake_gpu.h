// The core the fake GPU drivers share (libkiln_fake_cuda.so, libkiln_fake_hip.so): configuration
// from KILN_FAKE_<API>_* (or the control API), the fault plan per entry point, call counters,
// a sticky error per device, device memory over host memory, modules and functions, and kernel
// launches that run host-compiled builds of runtime/device/kiln_runtime.cpp. An API layer
// (test/fake_cuda/fake_driver.cpp, test/fake_hip/fake_runtime.cpp) defines dialect() — its
// entry points, its result codes and names — and the exported C entry points, each a few lines
// over the operations below. One State per library, guarded by one mutex; an entry point holds
// the lock for the whole call (a launch included), so a fake is one in-order stream.
#ifndef KILN_TEST_FAKE_GPU_FAKE_GPU_H_
#define KILN_TEST_FAKE_GPU_FAKE_GPU_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/runtime/kernel_abi.h"
#include "kiln/runtime/user_kernel_abi.h"

#define KILN_FAKE_GPU_EXPORT extern "C" __attribute__((visibility("default")))

namespace kiln::fake_gpu {

struct State;

struct NamedCode {
  int code;
  const char *name;
};

/// What makes a fake CUDA driver or a fake HIP runtime of the shared core.
struct Dialect {
  const char *title;       ///< "kiln fake CUDA driver": the prefix of stderr lines
  const char *env_prefix;  ///< "KILN_FAKE_CUDA_": CAPACITY_MB, OTHER_MB, FAULTS, MODE follow
  const char *init_entry;  ///< "cuInit": fails when the configuration is malformed
  const char *alloc_entry; ///< "cuMemAlloc_v2": named in launch-check messages
  std::span<const std::string_view> entry_points;
  std::span<const NamedCode> codes;  ///< every code the fake knows, success included
  int success, invalid_value, out_of_memory, not_initialized, invalid_context, stub,
      invalid_handle, not_found, not_supported, illegal_address;
  bool (*is_sticky)(int code);
  /// Whether the calling thread may use device memory now (CUDA: a current context).
  bool (*has_current)(const State &state);
  /// Called with the lock held by kiln_fake_<api>_reset, after the state was reset.
  void (*on_reset)();
  /// The ordinal of the calling thread's device (CUDA: its current context's; HIP: its
  /// hipSetDevice's, 0 until then), or -1 when it has none. Memory operations act on it.
  int (*current_device)(const State &state);
  /// The processor the device reports unless KILN_FAKE_<API>_ARCH says otherwise ("sm_80",
  /// "gfx90a"), and the check of such a value (set_arch and the environment refuse others).
  const char *default_arch;
  bool (*is_valid_arch)(std::string_view arch);
};

/// Defined by the API layer linked into the library.
const Dialect &dialect();

enum class Mode { normal, stub, nodevice };

/// The ops of KILN_FOR_EACH_KERNEL, for the launch-time memory checks.
enum class Op { fill, copy, axpy, reduce_sum, matmul, compact_positive };

/// One block of a launch run on the host by the emulating context (fake_kernels.cpp).
struct EmulatedBlock;
/// Runs block `block` of a launch: the GPU entry point's body (runtime/device/gpu_kernels.h).
using BlockKernelFn = void (*)(EmulatedBlock &block, KilnRuntime *runtime,
                               const KilnKernelArgs *args);

/// One host-compiled kernel that a GPU entry point name stands for.
struct HostKernel {
  const char *gpu_name;         ///< kiln_<op>_<dtype>_gpu
  BlockKernelFn block_kernel;   ///< kiln_gpu::<op>_gpu<dtype> with the emulating context
  Op op;
  std::size_t element_bytes;
};

/// The 24 kernels (fake_kernels.cpp); nullptr if `gpu_name` is none of them.
const HostKernel *find_host_kernel(std::string_view gpu_name);

struct Fault {
  uint64_t at_call = 0;  ///< the entry point's call count that fails; 0 = every call
  int result = 0;
};

struct Allocation {
  void *host = nullptr;
  std::size_t size_bytes = 0;
};

/// A user kernel's code (a PTX image ending in runtime::user_module_comment): the user's IR, run
/// as kiln runs it on the CPU (runtime::CpuJit::create_user, compiled at the first launch), one
/// call of the range kernel per index of the emulated grid-stride loop.
struct UserCode {
  std::string ir;
  std::string entry;
  std::vector<kiln::runtime::UserValueType> params;
  std::mutex mutex;                         ///< guards the two below (blocks run on several threads)
  std::shared_ptr<void> jit;                ///< the runtime::CpuJit, type-erased
  KilnKernelFn range_kernel = nullptr;
};

struct Module;
struct Function {
  Module *module = nullptr;
  const HostKernel *kernel = nullptr;  ///< one of kiln's 24, or null for a user kernel's entry
  UserCode *user = nullptr;            ///< a user kernel's code (module->user)
};
struct Module {
  std::shared_ptr<UserCode> user;  ///< set when the image is a user kernel's
  std::size_t charged_bytes = 0;
  std::string target;  ///< the processor the image was built for ("sm_90", "gfx942")
  std::set<std::string, std::less<>> entries;  ///< the entry point names of the code image
  std::map<std::string, std::unique_ptr<Function>, std::less<>> functions;
};

/// The most devices a fake offers (KILN_FAKE_<API>_DEVICES).
constexpr int kMaxDevices = 8;

/// One device of a fake: its memory, the code loaded on it, its primary context, its sticky error
/// and counters.
struct Device {
  std::size_t capacity_bytes = std::size_t{1024} << 20;
  std::vector<std::size_t> other_script{0};  ///< other processes' usage, one per memory-info call
  std::size_t other_index = 0;               ///< next script entry memory-info consumes
  std::size_t other_bytes = 0;               ///< the value last reported (what allocation sees)
  int context_retain_count = 0;  ///< CUDA's primary context (the HIP layer has none)
  /// Whether the device has a context now: CUDA's primary context while retained; HIP's implicit
  /// one from the first call that uses the device until hipDeviceReset.
  bool context_live = false;
  uint64_t contexts_created = 0;  ///< contexts made on the device since the last reset
  /// The sticky error of the device's context (a dialect code; 0, success, when none): every call
  /// that acts on the device answers it, until the context is destroyed or the fake reset. Calls
  /// on other devices, and calls that act on none, never see it (as a real driver's per context).
  int sticky_error = 0;
  std::map<uint64_t, Allocation> allocations;
  std::size_t held_bytes = 0;
  std::size_t high_water_bytes = 0;
  std::size_t module_bytes = 0;
  uint64_t oom_count = 0;
  uint64_t launch_count = 0;
  std::map<const Module *, std::unique_ptr<Module>> modules;

  /// Frees every allocation and module (the context went away, or a reset).
  void release_device_memory();
  /// Makes the device's context if it has none, counting it in contexts_created.
  void create_context();
  /// Destroys the device's context: frees every allocation and module and forgets the sticky
  /// error, so that the next context starts clean (CUDA's last primary-context release,
  /// hipDeviceReset).
  void destroy_context();
  /// Free device memory now: capacity - held - modules - other processes, never below 0.
  [[nodiscard]] std::size_t free_bytes() const;
  /// True if [address, address + size_bytes) lies inside one live allocation.
  [[nodiscard]] bool device_range_ok(uint64_t address, uint64_t size_bytes) const;
};

/// Everything a fake knows. Access only through lock_state().
struct State {
  // configuration
  Mode mode = Mode::normal;
  std::string config_error;  ///< a malformed variable: the init entry point fails
  std::string arch;          ///< the processor every device reports (dialect().default_arch)

  // driver state
  bool initialized = false;
  std::vector<Device> devices = std::vector<Device>(1);  ///< KILN_FAKE_<API>_DEVICES of them
  std::map<std::string, uint64_t, std::less<>> call_counts;
  std::map<std::string, std::vector<Fault>, std::less<>> faults;
  std::size_t high_water_bytes = 0;  ///< the most bytes held on all devices together
  std::string last_module_target;  ///< the target of the module loaded last ("" before any)
  std::string pause_entry;  ///< the next call of this entry waits, holding the lock (a test hook)
  unsigned pause_ms = 0;    ///< for how long

  /// The sticky error of the lowest ordinal that has one, or 0 (success) when no device has one.
  [[nodiscard]] int first_sticky_error() const;
  /// The number of devices (cuDeviceGetCount's answer in normal mode).
  [[nodiscard]] int device_count() const { return static_cast<int>(devices.size()); }
  /// Device `ordinal`, or nullptr when there is none such.
  [[nodiscard]] Device *device(int ordinal);
  /// The calling thread's device (dialect().current_device); only called once the entry point
  /// checked Needs::context, so there is one.
  [[nodiscard]] Device &current();
  [[nodiscard]] const Device &current() const;
  /// Frees every allocation and module of every device.
  void release_device_memory();
  /// Re-reads the KILN_FAKE_<API>_* environment into the configuration.
  void load_environment();
  /// The current device's free bytes and range check (Device::free_bytes, device_range_ok).
  [[nodiscard]] std::size_t free_bytes() const { return current().free_bytes(); }
  [[nodiscard]] bool device_range_ok(uint64_t address, uint64_t size_bytes) const {
    return current().device_range_ok(address, size_bytes);
  }
  /// The fault planned for this call of `entry` (whose count was just incremented), or success.
  [[nodiscard]] int planned_fault(std::string_view entry);
  /// Adds a fault `nth_call` calls of `entry` from now; false if `entry` is unknown.
  bool add_fault(std::string_view entry, uint64_t nth_call, int result);
  /// A counter summed over the devices (`field` a Device member such as &Device::held_bytes).
  template <class T>
  [[nodiscard]] T total(T Device::*field) const {
    T sum{};
    for (const Device &d : devices) sum += d.*field;
    return sum;
  }
};

/// The state, locked for the lifetime of the returned guard; created (and the environment read)
/// on first use.
struct LockedState {
  std::unique_lock<std::mutex> lock;
  State *state;
  State *operator->() const { return state; }
};
LockedState lock_state();

/// A test hook that holds the state lock inside a call, so that a test can fork (or do anything
/// else) while a driver call is in progress: after pause_in(entry, hold_ms) the next call of that
/// entry sets paused() and waits hold_ms milliseconds, holding the lock, before it goes on (a
/// timer, not a resume call: a thread that forks may hold locks a resuming thread would need).
/// paused() takes no lock.
void pause_in(std::string_view entry, unsigned hold_ms);
[[nodiscard]] bool paused();

/// Resets the state to a freshly loaded library's (the caller holds the lock).
void reset_state(State &state);
bool is_entry_point(std::string_view name);
/// The dialect's name of `code`, or nullptr.
const char *error_name(int code);
/// Parses a code given as a number or one of the dialect's names; false if neither.
bool parse_result(std::string_view text, int *result);
bool parse_mode(std::string_view text, Mode *mode);

// --- what every entry point does first ---------------------------------------------------------

enum class Needs {
  nothing,   ///< works before initialization
  init,      ///< needs initialization
  context,   ///< needs initialization and dialect().has_current; acts on the current device
  teardown,  ///< needs initialization; answers even after a sticky error (it destroys the bad context)
  select,    ///< needs initialization; only selects the calling thread's device, so it answers
             ///< even after that device's sticky error (HIP's hipSetDevice)
};

/// The device a call acts on (Call's `on_device`), besides an ordinal it names.
constexpr int kOnNoDevice = -1;      ///< none: cuInit, cuDeviceGetCount; no sticky error reaches it
constexpr int kOnCurrentDevice = -2;  ///< the calling thread's device (dialect().current_device)

/// Counts the call, then sets `answer` when the call must return at once: stub mode, the sticky
/// error of the device it acts on (not for teardown or select), an injected fault, not
/// initialized, no current context.
struct Call {
  LockedState state;
  int answer;
  bool done;
  int device;  ///< the ordinal the call acts on, or kOnNoDevice (also for an ordinal the fake lacks)
  /// `on_device`: the ordinal the call names (cuDeviceGet, cuDevicePrimaryCtxRetain,
  /// hipSetDevice...), kOnCurrentDevice, or kOnNoDevice; a Needs::context call acts on the current
  /// device whatever it says. A Needs::context call that goes on makes the current device's
  /// context if it has none (HIP's implicit context; CUDA's was made by the retain).
  Call(const char *entry, Needs needs, int on_device = kOnNoDevice);
  /// Returns `code`, making it the sticky error of the device the call acts on if it is one
  /// (a call that acts on no device poisons nothing).
  int result(int code);
};

/// The first lines of every entry point: KILN_FAKE_BEGIN for a call that acts on no device or on
/// the current one (Needs::context), KILN_FAKE_BEGIN_ON for one that names device `on_device`.
#define KILN_FAKE_BEGIN(entry, needs) KILN_FAKE_BEGIN_ON(entry, needs, ::kiln::fake_gpu::kOnNoDevice)
#define KILN_FAKE_BEGIN_ON(entry, needs, on_device)       \
  ::kiln::fake_gpu::Call call(entry, needs, on_device);   \
  if (call.done) return call.result(call.answer)

// --- the shared work of the entry points, answering dialect codes --------------------------------

int memory_info(State &state, std::size_t *free_bytes, std::size_t *total_bytes);
int allocate(State &state, std::size_t size_bytes, uint64_t *address);
int free_allocation(State &state, uint64_t address);
int copy_to_device(State &state, uint64_t dst, const void *src, std::size_t size_bytes);
int copy_to_host(State &state, void *dst, uint64_t src, std::size_t size_bytes);
int copy_device(State &state, uint64_t dst, uint64_t src, std::size_t size_bytes);
int memset8(State &state, uint64_t dst, unsigned char value, std::size_t count);
/// Adds a parsed module charging `size_bytes` of device memory; out_of_memory when it does not fit.
int add_module(State &state, std::unique_ptr<Module> module, std::size_t size_bytes, Module **handle);
int unload_module(State &state, Module *module);
/// The function `name` of `module`: invalid_handle (unknown module), not_found (not an entry of
/// the image, or not one of kiln's 24 kernels).
int get_function(State &state, Module *module, const char *name, Function **function);
/// Validates a launch as both drivers do and runs it to completion: invalid_handle (unknown
/// function, a stream), invalid_value (0 or oversized dimensions, > 48 KiB shared memory, null
/// params), not_supported (y/z > 1, extra); then the launch memory check (illegal_address) and
/// the tasks.
int launch(State &state, const Function *function, unsigned grid_x, unsigned grid_y, unsigned grid_z,
           unsigned block_x, unsigned block_y, unsigned block_z, unsigned shared_bytes,
           const void *stream, void **params, void **extra);

}  // namespace kiln::fake_gpu

#endif  // KILN_TEST_FAKE_GPU_FAKE_GPU_H_
