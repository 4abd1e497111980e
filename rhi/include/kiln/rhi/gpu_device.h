// GpuDevice: what the CUDA and HIP backends share beyond LlvmDevice. Both drive a dlopen'ed
// driver whose calls answer an int code (CUresult, hipError_t), load code objects as modules,
// look kernels up by name and launch them 1-D. This class owns the module table and the
// per-module function cache, the check()/enter() shape (map a code with the backend's one status
// function; a device_lost answer marks the device lost; every call fails fast once it is) and the
// module / launch / synchronize sequences. A backend supplies the driver calls.
#ifndef KILN_RHI_GPU_DEVICE_H_
#define KILN_RHI_GPU_DEVICE_H_

#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "kiln/rhi/device.h"
#include "kiln/rhi/fork_hooks.h"

namespace kiln {

/// A device with its own memory and its own kernels, loaded as code objects (PTX, HSACO).
/// Thread-safe.
class GpuDevice : public LlvmDevice {
 public:
  /// The driver's names for the entry points behind the shared sequences (used as Failure sites).
  struct EntryNames {
    const char *module_load;    ///< "cuModuleLoadData", "hipModuleLoadData"
    const char *module_unload;
    const char *get_function;
    const char *launch;
    const char *synchronize;
  };

  [[nodiscard]] bool host_addressable() const final { return false; }

  /// The processor this device runs code for, read from the driver when the device was made:
  /// "sm_<major><minor>" from the CUDA compute capability ("sm_90" on an H100/H200), or the gfx
  /// processor of HIP's gcnArchName without its feature suffix ("gfx942" for
  /// "gfx942:sramecc+:xnack-"). The executor compiles or picks its code object for it.
  [[nodiscard]] std::string_view code_target() const { return code_target_; }

  /// Loads a code object; returns a module id. Errors: invalid_usage (not an image of this
  /// backend's kind: PTX text for CUDA, an AMDGPU ELF for HIP), error (the driver rejected the
  /// image, e.g. CUDA_ERROR_INVALID_PTX), not_supported (no binary for this GPU),
  /// out_of_memory, device_lost.
  [[nodiscard]] RhiExpected<uint64_t> load_module(std::span<const std::byte> image);
  /// Unloads a module. Errors: invalid_usage (unknown id).
  [[nodiscard]] RhiStatus unload_module(uint64_t module);
  /// Launches `kernel` of `module` on grid_x blocks of block_x threads with `params` (pointers to
  /// each argument's value) and waits for it. A sticky fault marks the device lost and returns
  /// device_lost; every later call fails fast with it.
  [[nodiscard]] RhiStatus launch_kernel(uint64_t module, const std::string &kernel, unsigned grid_x,
                                        unsigned block_x, std::span<void *> params);
  RhiStatus synchronize() final;

 protected:
  using Handle = void *;  ///< CUmodule / hipModule_t, CUfunction / hipFunction_t: all pointers

  /// `code_target`: the processor the driver reported ("sm_90", "gfx942"); see code_target().
  GpuDevice(std::string name, EntryNames names, std::string code_target)
      : LlvmDevice(std::move(name)), names_(names), code_target_(std::move(code_target)) {}

  /// Maps a driver answer with the backend's status function; device_lost marks the device lost.
  /// `allocation`: the call was that allocation (its failure reports it).
  [[nodiscard]] RhiStatus check(int code, const char *site,
                                const AllocationFigures *allocation = nullptr);
  /// Fails fast on a lost device, or with not_supported in a process forked after the device
  /// was made (a driver context does not cross fork()); then makes the device current on the
  /// calling thread.
  [[nodiscard]] RhiStatus enter(const char *site);
  /// enter() for a release (free, module unload): after an injected loss it enters anyway, since
  /// the driver still holds what is released; a real loss fails as enter() does.
  [[nodiscard]] RhiStatus enter_to_release(const char *site);
  /// Whether this process was forked from the one that made the device: the driver's context
  /// belongs to the parent, and no driver call may be made with it here (not even a release).
  [[nodiscard]] bool crossed_fork() const { return fork_generation() != fork_generation_; }
  /// The result of an allocation call that answered `code` with `address`: the address, or the
  /// failure with the request's category and size.
  [[nodiscard]] RhiExpected<uint64_t> allocated(int code, const char *site, uint64_t address,
                                                const LlvmRuntimeAllocParams &params);
  /// Unloads every module still loaded, unless its resources are lost or it cannot be entered. For the
  /// derived destructor (virtual calls do not reach it from ours).
  void unload_all_modules(const char *site);

  // --- the backend's driver ---------------------------------------------------------------------
  /// The backend's ONE mapping of a driver code to an RhiResult (cuda::to_rhi, hip::to_rhi);
  /// `allocation`: the call was that allocation (its failure reports it), or null.
  [[nodiscard]] virtual RhiStatus to_status(int code, const char *site,
                                            const AllocationFigures *allocation) = 0;
  /// Makes this device current on the calling thread (cuCtxSetCurrent, hipSetDevice), via check().
  [[nodiscard]] virtual RhiStatus make_current() = 0;
  /// invalid_usage when `image` cannot be this backend's code object (checked before the driver).
  [[nodiscard]] virtual RhiStatus validate_image(std::span<const std::byte> image) = 0;
  [[nodiscard]] virtual int module_load(Handle *module, const void *image) = 0;
  [[nodiscard]] virtual int module_unload(Handle module) = 0;
  [[nodiscard]] virtual int module_get_function(Handle *function, Handle module, const char *name) = 0;
  /// A 1-D launch on the default stream, no shared memory; params as the driver takes them.
  [[nodiscard]] virtual int launch(Handle function, unsigned grid_x, unsigned block_x, void **params) = 0;
  [[nodiscard]] virtual int device_synchronize() = 0;

 private:
  struct Module {
    Handle handle;
    std::unordered_map<std::string, Handle> functions;
  };
  [[nodiscard]] RhiExpected<Handle> function(uint64_t module, const std::string &kernel);

  EntryNames names_;
  const std::string code_target_;
  const uint64_t fork_generation_ = fork_generation();  // the process the context belongs to
  std::mutex modules_mutex_;
  uint64_t next_module_ = 1;
  std::unordered_map<uint64_t, Module> modules_;
};

}  // namespace kiln

#endif  // KILN_RHI_GPU_DEVICE_H_
