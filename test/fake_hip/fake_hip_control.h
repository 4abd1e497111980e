// Control API of the fake HIP runtime (libkiln_fake_hip.so), for tests that load the fake in
// their own process. The same functions, with the same meaning, as the fake CUDA driver's
// (test/fake_cuda/fake_cuda_control.h) — both are generated from the shared core
// (test/fake_gpu/fake_control.inc) — named kiln_fake_hip_* and speaking hipError_t:
//   entry points are those of rhi/amdgpu/hip_runtime.inc; results are hipError_t numbers;
//   modes are "normal", "stub" (every call returns hipErrorInsufficientDriver, 35) and
//   "nodevice" (hipInit succeeds, hipGetDeviceCount gives 0 and hipErrorNoDevice, hipSetDevice
//   hipErrorInvalidDevice); sticky results are 700, 719, 710, 709, 702, 214, 53, each kept by the
//   device that raised it (a memory, module, launch or synchronize call on the calling thread's
//   device, or hipGetDeviceProperties of it) and answered by that device's calls only, until
//   hipDeviceReset on it or a reset. hipSetDevice, a selection, answers even for that device.
//   A device's context (counted by kiln_fake_hip_device_contexts) is made by the first
//   memory, module, launch or synchronize call on it, and again after hipDeviceReset.
// Resolve each with dlsym() on the handle kiln (or the test) dlopen()ed. See
// test/fake_hip/README.md.
#ifndef KILN_TEST_FAKE_HIP_CONTROL_H_
#define KILN_TEST_FAKE_HIP_CONTROL_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

void kiln_fake_hip_reset(void);
void kiln_fake_hip_set_capacity_bytes(size_t capacity_bytes);
void kiln_fake_hip_set_other_process_bytes(size_t other_bytes);
int kiln_fake_hip_inject_fault(const char *entry, unsigned long long nth_call, int result);
int kiln_fake_hip_set_mode(const char *mode);
unsigned long long kiln_fake_hip_call_count(const char *entry);
size_t kiln_fake_hip_held_bytes(void);
size_t kiln_fake_hip_high_water_bytes(void);
size_t kiln_fake_hip_allocation_count(void);
size_t kiln_fake_hip_module_bytes(void);
unsigned long long kiln_fake_hip_oom_count(void);
int kiln_fake_hip_sticky_error(void);
unsigned long long kiln_fake_hip_launch_count(void);
int kiln_fake_hip_pause_in(const char *entry, unsigned hold_ms);
int kiln_fake_hip_paused(void);
/// The device's gcnArchName ("gfx942:sramecc+:xnack-"), as KILN_FAKE_HIP_ARCH; hipModuleLoadData
/// refuses a code object for another gfx processor (hipErrorNoBinaryForGpu). -1 if malformed.
int kiln_fake_hip_set_arch(const char *arch);
/// The gfx processor of the code object loaded last ("gfx942"; "" before any); as CUDA's.
size_t kiln_fake_hip_last_module_target(char *target, size_t length);

/// Why the environment read at load or by the last reset was refused (the message also printed
/// on stderr: "KILN_FAKE_HIP_FAULTS item '...' is not ..."; hipInit then fails), "" when it
/// was accepted: copied NUL-terminated into `text` (at most length - 1 characters); returns its
/// length. For callers that configure the fake through the environment and then reset it.
size_t kiln_fake_hip_config_error(char *text, size_t length);

/// The number of devices (KILN_FAKE_HIP_DEVICES), and one device's own counters and capacity (0
/// for an ordinal the fake lacks); the counters above sum over the devices.
int kiln_fake_hip_device_count(void);
size_t kiln_fake_hip_device_held_bytes(int device);
size_t kiln_fake_hip_device_high_water_bytes(int device);
size_t kiln_fake_hip_device_capacity_bytes(int device);
unsigned long long kiln_fake_hip_device_oom_count(int device);
unsigned long long kiln_fake_hip_device_launch_count(int device);
unsigned long long kiln_fake_hip_device_contexts(int device);
int kiln_fake_hip_device_sticky_error(int device);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // KILN_TEST_FAKE_HIP_CONTROL_H_
