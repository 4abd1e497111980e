#include "kiln/rhi/gpu_device.h"

#include <fmt/format.h>

namespace kiln {

RhiStatus GpuDevice::check(int code, const char *site, const AllocationFigures *allocation) {
  auto status = to_status(code, site, allocation);
  if (!status && status.error().result == RhiResult::device_lost) mark_lost(status.error());
  return status;
}

RhiStatus GpuDevice::enter(const char *site) {
  KILN_RETURN_IF_ERROR(check_alive(site));
  if (crossed_fork())
    return std::unexpected(failure(
        RhiResult::not_supported, site,
        fmt::format("{} was opened in the parent of this forked process and a GPU driver context "
                    "does not cross fork(); initialize kiln again in this process (kiln.init) "
                    "or use the spawn start method",
                    name())));
  return make_current();
}

RhiStatus GpuDevice::enter_to_release(const char *site) {
  if (is_lost() && !resources_lost()) {  // an injected loss: the driver still holds it all
    if (crossed_fork()) return enter(site);
    return make_current();
  }
  return enter(site);
}

RhiExpected<uint64_t> GpuDevice::allocated(int code, const char *site, uint64_t address,
                                           const LlvmRuntimeAllocParams &params) {
  const AllocationFigures figures = params.figures();
  KILN_RETURN_IF_ERROR(check(code, site, &figures));
  return address;
}

void GpuDevice::unload_all_modules(const char *site) {
  if (resources_lost() || crossed_fork() || !enter_to_release(site)) return;
  std::lock_guard lock(modules_mutex_);
  for (auto &[id, module] : modules_) (void)module_unload(module.handle);
  modules_.clear();
}

RhiStatus GpuDevice::synchronize() {
  KILN_RETURN_IF_ERROR(take_deferred_failure());
  KILN_RETURN_IF_ERROR(enter(names_.synchronize));
  return check(device_synchronize(), names_.synchronize);
}

RhiExpected<uint64_t> GpuDevice::load_module(std::span<const std::byte> image) {
  KILN_RETURN_IF_ERROR(enter(names_.module_load));
  KILN_RETURN_IF_ERROR(validate_image(image));
  Handle handle = nullptr;
  KILN_RETURN_IF_ERROR(check(module_load(&handle, image.data()), names_.module_load));
  std::lock_guard lock(modules_mutex_);
  modules_.emplace(next_module_, Module{handle, {}});
  return next_module_++;
}

RhiStatus GpuDevice::unload_module(uint64_t module) {
  Handle handle = nullptr;
  {
    std::lock_guard lock(modules_mutex_);
    auto it = modules_.find(module);
    if (it == modules_.end())
      return std::unexpected(failure(RhiResult::invalid_usage, names_.module_unload,
                                     fmt::format("module {} is not loaded", module)));
    handle = it->second.handle;
    modules_.erase(it);
  }
  if (resources_lost()) return {};  // the module went with the device
  KILN_RETURN_IF_ERROR(enter_to_release(names_.module_unload));
  return check(module_unload(handle), names_.module_unload);
}

RhiExpected<GpuDevice::Handle> GpuDevice::function(uint64_t module, const std::string &kernel) {
  std::lock_guard lock(modules_mutex_);
  auto it = modules_.find(module);
  if (it == modules_.end())
    return std::unexpected(failure(RhiResult::invalid_usage, names_.launch,
                                   fmt::format("module {} is not loaded", module)));
  auto &functions = it->second.functions;
  if (auto f = functions.find(kernel); f != functions.end()) return f->second;
  Handle handle = nullptr;
  auto status = check(module_get_function(&handle, it->second.handle, kernel.c_str()), names_.get_function);
  if (!status) {
    status.error().detail += fmt::format(" for kernel {}", kernel);
    return std::unexpected(std::move(status).error());
  }
  functions.emplace(kernel, handle);
  return handle;
}

RhiStatus GpuDevice::launch_kernel(uint64_t module, const std::string &kernel, unsigned grid_x,
                                         unsigned block_x, std::span<void *> params) {
  KILN_RETURN_IF_ERROR(enter(names_.launch));
  KILN_ASSIGN_OR_RETURN(const Handle handle, function(module, kernel));
  KILN_RETURN_IF_ERROR(check(launch(handle, grid_x, block_x, params.data()), names_.launch));
  return check(device_synchronize(), names_.synchronize);
}

}  // namespace kiln
