// Control API of the fake CUDA driver (libkiln_fake_cuda.so), for tests that load the fake in
// their own process. Resolve each function with dlsym() on the same handle kiln (or the test)
// dlopen()ed, e.g.
//
//   void *fake = dlopen("/path/to/libkiln_fake_cuda.so", RTLD_NOW | RTLD_LOCAL);
//   auto reset = reinterpret_cast<kiln_fake_cuda_reset_fn>(dlsym(fake, "kiln_fake_cuda_reset"));
//
// The same settings are available from the environment (read when the library first needs its
// state, normally at cuInit, and again by kiln_fake_cuda_reset); see test/fake_cuda/README.md.
// Every function is thread-safe. Sizes are in bytes; call counts start at 0 after a reset.
#ifndef KILN_TEST_FAKE_CUDA_CONTROL_H_
#define KILN_TEST_FAKE_CUDA_CONTROL_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/// Back to the state of a freshly loaded library: frees every allocation, module and context,
/// forgets faults, counters and every device's sticky error, un-initializes (cuInit is needed again) and
/// re-reads the KILN_FAKE_CUDA_* environment. Call it with no kiln CUDA device open: handles and
/// device pointers handed out before are invalid afterwards.
void kiln_fake_cuda_reset(void);

/// Every device's memory capacity (what cuMemGetInfo_v2 reports as total). Default 1 GiB
/// (KILN_FAKE_CUDA_CAPACITY_MB). Memory already held stays held, even if over the new capacity.
void kiln_fake_cuda_set_capacity_bytes(size_t capacity_bytes);

/// Memory other processes use from now on (replaces any KILN_FAKE_CUDA_OTHER_MB script):
/// lowers the free memory cuMemGetInfo_v2 reports and what cuMemAlloc_v2 can get.
void kiln_fake_cuda_set_other_process_bytes(size_t other_bytes);

/// Makes the `nth_call`-th call of entry point `entry` counted from now (1 = the next call)
/// return `result` instead of doing its work; nth_call 0 makes every call from now on fail.
/// Several faults may be pending, for one or several entry points. A sticky result (700,
/// 714-719, 214) returned by a call that acts on device k (through the calling thread's current
/// context, or naming k: cuDeviceGet, cuDeviceGetName, cuDeviceGetAttribute,
/// cuDevicePrimaryCtxRetain, cuCtxSetCurrent) makes every later call on device k return it, as a
/// real driver's context does; calls on other devices, and calls on none (cuInit,
/// cuDriverGetVersion, cuDeviceGetCount, cuGetErrorName), go on as before. The error stays until
/// device k's last cuDevicePrimaryCtxRelease_v2 (which still answers) or a reset. Returned by a
/// call that acts on no device, a sticky result poisons nothing.
/// Returns 0, or -1 if `entry` is not an entry point of rhi/cuda/cuda_driver.inc.
int kiln_fake_cuda_inject_fault(const char *entry, unsigned long long nth_call, int result);

/// "normal" (default), "stub" (every call returns CUDA_ERROR_STUB_LIBRARY, like the CUDA
/// toolkit's stub libcuda) or "nodevice" (cuInit succeeds, cuDeviceGetCount gives 0, cuDeviceGet
/// returns CUDA_ERROR_NO_DEVICE). Same as KILN_FAKE_CUDA_MODE. Returns 0, or -1 (unchanged) for
/// an unknown mode.
int kiln_fake_cuda_set_mode(const char *mode);

/// Calls of entry point `entry` since the last reset (every call counts, failed ones too);
/// 0 for a name that is not an entry point.
unsigned long long kiln_fake_cuda_call_count(const char *entry);

/// Bytes currently allocated with cuMemAlloc_v2 and not freed (loaded modules not included).
size_t kiln_fake_cuda_held_bytes(void);

/// The largest kiln_fake_cuda_held_bytes() since the last reset.
size_t kiln_fake_cuda_high_water_bytes(void);

/// Number of live cuMemAlloc_v2 allocations.
size_t kiln_fake_cuda_allocation_count(void);

/// Device memory used by loaded modules (each charges the size of its PTX image).
size_t kiln_fake_cuda_module_bytes(void);

/// Number of cuMemAlloc_v2 calls the capacity refused with CUDA_ERROR_OUT_OF_MEMORY
/// (injected faults not included).
unsigned long long kiln_fake_cuda_oom_count(void);

/// The sticky error of the lowest-numbered device that has one (on a one-device fake: the error
/// every call on the device now returns), or 0 (CUDA_SUCCESS) if no device has one. One
/// device's: kiln_fake_cuda_device_sticky_error.
int kiln_fake_cuda_sticky_error(void);

/// Number of kernel launches that ran (injected or refused launches not included).
unsigned long long kiln_fake_cuda_launch_count(void);

/// Makes the device report processor `arch`, "sm_<major><minor>" (sm_80, sm_90, sm_100), as
/// KILN_FAKE_CUDA_ARCH does: cuDeviceGetAttribute answers its compute capability, and
/// cuModuleLoadData refuses PTX for a newer SM version (CUDA_ERROR_INVALID_PTX). Returns 0,
/// or -1 for NULL or a malformed value.
int kiln_fake_cuda_set_arch(const char *arch);

/// The `.target` of the PTX module loaded last since the last reset ("sm_90"; "" before any):
/// copied NUL-terminated into `target` (at most length - 1 characters); returns its length.
size_t kiln_fake_cuda_last_module_target(char *target, size_t length);

/// The number of devices the fake offers (KILN_FAKE_CUDA_DEVICES, 1 to 8; default 1). The
/// counters above sum over the devices (high_water_bytes: the most held on all at once).
int kiln_fake_cuda_device_count(void);

/// Device `device`'s own counters (the ones above, for that device alone) and capacity; 0 for an
/// ordinal the fake does not have.
size_t kiln_fake_cuda_device_held_bytes(int device);
size_t kiln_fake_cuda_device_high_water_bytes(int device);
size_t kiln_fake_cuda_device_capacity_bytes(int device);
unsigned long long kiln_fake_cuda_device_oom_count(int device);
unsigned long long kiln_fake_cuda_device_launch_count(int device);
/// Primary contexts made on device `device` since the last reset: a cuDevicePrimaryCtxRetain
/// that found none retained counts one (the last release destroys it; a later retain makes and
/// counts another). 0: nothing ever made a context on the device.
unsigned long long kiln_fake_cuda_device_contexts(int device);
/// Device `device`'s sticky error (the CUresult its calls now return), or 0 (CUDA_SUCCESS).
int kiln_fake_cuda_device_sticky_error(int device);

typedef void (*kiln_fake_cuda_reset_fn)(void);
typedef void (*kiln_fake_cuda_set_capacity_bytes_fn)(size_t);
typedef void (*kiln_fake_cuda_set_other_process_bytes_fn)(size_t);
typedef int (*kiln_fake_cuda_inject_fault_fn)(const char *, unsigned long long, int);
typedef int (*kiln_fake_cuda_set_mode_fn)(const char *);
typedef unsigned long long (*kiln_fake_cuda_call_count_fn)(const char *);
typedef size_t (*kiln_fake_cuda_bytes_fn)(void);
typedef unsigned long long (*kiln_fake_cuda_count_fn)(void);
typedef int (*kiln_fake_cuda_sticky_error_fn)(void);
typedef int (*kiln_fake_cuda_device_sticky_error_fn)(int);
typedef unsigned long long (*kiln_fake_cuda_device_contexts_fn)(int);

/// A test hook: the next call of `entry` (e.g. "cuLaunchKernel") sets kiln_fake_cuda_paused()
/// and then waits hold_ms milliseconds inside the driver, holding its lock, before it goes on.
/// For tests that fork or exit while a driver call is in progress. Returns 0, or -1 for NULL.
int kiln_fake_cuda_pause_in(const char *entry, unsigned hold_ms);
int kiln_fake_cuda_paused(void);

/// Why the environment read at load or by the last reset was refused (the message also printed
/// on stderr: "KILN_FAKE_CUDA_FAULTS item '...' is not ..."; cuInit then fails), "" when it
/// was accepted: copied NUL-terminated into `text` (at most length - 1 characters); returns its
/// length. For callers that configure the fake through the environment and then reset it.
size_t kiln_fake_cuda_config_error(char *text, size_t length);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // KILN_TEST_FAKE_CUDA_CONTROL_H_
