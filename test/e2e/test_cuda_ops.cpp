// The CUDA backend end to end against the fake driver (test/fake_cuda): its registration in the
// GPU-backend matrix (gpu_backend_matrix.h: kiln-ops cases, a driver out-of-memory sweep over every
// cuMemAlloc_v2 call, sticky faults at a launch, stub mode, recovery from a lost device) and the
// cases only CUDA has: frees and zero-fills the driver refuses, module loads, PTX targets.
#include <catch2/catch.hpp>

#include "gpu_backend_matrix.h"
#include "kiln/rhi/cuda_device.h"
#include "kiln/rhi/gpu_device.h"
#include "test_support.h"

using namespace kiln;
using namespace kiln::test;

namespace {

#ifdef KILN_FAKE_CUDA_LIBRARY
constexpr const char *kFakeCudaLibrary = KILN_FAKE_CUDA_LIBRARY;
#else
constexpr const char *kFakeCudaLibrary = nullptr;
#endif

const GpuBackendCase &cuda() {
  static const GpuBackendCase backend{
      .name = "cuda",
      .backend = Backend::cuda,
      .arch = CodegenArch::nvptx64,
      .fake_library = kFakeCudaLibrary,
      .driver_env = "KILN_CUDA_DRIVER",
      .fake_prefix = "kiln_fake_cuda_",
      .alloc_entry = "cuMemAlloc_v2",
      .launch_entry = "cuLaunchKernel",
      .context_entry = "cuCtxSetCurrent",
      .device_reset_entry = nullptr,  // the primary context goes with its last user
      .module_unload_entry = "cuModuleUnload",
      .out_of_memory_code = 2,        // CUDA_ERROR_OUT_OF_MEMORY
      .out_of_memory_status = "CUDA_ERROR_OUT_OF_MEMORY",
      .illegal_address_code = 700,
      .illegal_address_status = "CUDA_ERROR_ILLEGAL_ADDRESS",
      .unsupported_modes = {{"nodevice", "reports 0 device(s)"}, {"stub", "CUDA_ERROR_STUB_LIBRARY"}},
  };
  return backend;
}

}  // namespace

KILN_GPU_BACKEND_MATRIX(cuda, "cuda")

TEST_CASE("a free the driver refuses stays charged and synchronize reports it once",
          "[cuda][e2e][free]") {
  FakeGpu *fake = cuda().fake_or_skip();
  if (fake == nullptr) return;
  auto ex = make_gpu_executor(Backend::cuda);
  runtime::DeviceMemory &memory = ex->memory();
  auto block = value_or_throw(memory.allocate(MemoryCategory::staging, 1_MiB));
  value_or_throw(memory.free(block));  // into the pool
  const uint64_t before = memory.in_use_bytes();
  REQUIRE(fake->inject_fault("cuMemFree_v2", 1, 1) == 0);  // CUDA_ERROR_INVALID_VALUE
  CHECK(memory.release_cached() == 0);                    // the device did not let go
  CHECK(memory.in_use_bytes() == before);        // so the ledger keeps the bytes
  auto reported = ex->device().synchronize();
  REQUIRE_FALSE(reported);
  CHECK(std::string(reported.error().driver_status) == "CUDA_ERROR_INVALID_VALUE");
  CHECK(ex->device().synchronize());  // reported once
}

TEST_CASE("a refused zero-fill is the answer; a free refused while cleaning up is reported by "
          "synchronize",
          "[cuda][e2e][free]") {
  FakeGpu *fake = cuda().fake_or_skip();
  if (fake == nullptr) return;
  auto ex = make_gpu_executor(Backend::cuda);
  REQUIRE(ex->device().synchronize());
  const uint64_t live_before = ex->device().live_allocation_count();
  REQUIRE(fake->inject_fault("cuMemsetD8_v2", 1, 2) == 0);  // CUDA_ERROR_OUT_OF_MEMORY
  REQUIRE(fake->inject_fault("cuMemFree_v2", 1, 1) == 0);   // CUDA_ERROR_INVALID_VALUE
  LlvmRuntimeAllocParams params;
  params.size_bytes = 64_KiB;
  params.zero_fill = true;
  auto alloc = ex->device().allocate_runtime(params);
  REQUIRE_FALSE(alloc);
  CHECK(std::string(alloc.error().site) == "cuMemsetD8_v2");  // the first failure is the answer
  CHECK(ex->device().live_allocation_count() == live_before);
  auto reported = ex->device().synchronize();  // the free that failed while cleaning up
  REQUIRE_FALSE(reported);
  CHECK(std::string(reported.error().site) == "cuMemFree_v2");
  CHECK(std::string(reported.error().driver_status) == "CUDA_ERROR_INVALID_VALUE");
  CHECK(ex->device().synchronize());  // reported once
}

TEST_CASE("a zero-fill that loses the device frees nothing more: the memory went with it",
          "[cuda][e2e][free]") {
  FakeGpu *fake = cuda().fake_or_skip();
  if (fake == nullptr) return;
  auto ex = make_gpu_executor(Backend::cuda);
  REQUIRE(fake->inject_fault("cuMemsetD8_v2", 1, 700) == 0);  // CUDA_ERROR_ILLEGAL_ADDRESS
  const unsigned long long frees_before = fake->call_count("cuMemFree_v2");
  LlvmRuntimeAllocParams params;
  params.size_bytes = 64_KiB;
  params.zero_fill = true;
  auto alloc = ex->device().allocate_runtime(params);
  REQUIRE_FALSE(alloc);
  CHECK(alloc.error().result == RhiResult::device_lost);
  CHECK(fake->call_count("cuMemFree_v2") == frees_before);  // as dealloc_memory on a lost device
  auto later = ex->device().synchronize();
  REQUIRE_FALSE(later);
  CHECK(later.error().result == RhiResult::device_lost);
  CHECK(std::string(later.error().site) != "cuMemFree_v2");  // no deferred free to report
}

TEST_CASE("a module load the driver refuses fails the executor with a named error and holds nothing",
          "[cuda][e2e]") {
  FakeGpu *fake = cuda().fake_or_skip();
  if (fake == nullptr) return;
  REQUIRE(fake->inject_fault("cuModuleLoadData", 1, 2) == 0);  // CUDA_ERROR_OUT_OF_MEMORY
  ExecutorConfig config;
  config.backend = Backend::cuda;
  config.device_heap_bytes = 1_MiB;
  auto ex = LlvmRuntimeExecutor::create(config);
  REQUIRE_FALSE(ex);
  CHECK(classify(ex.error()) == ErrorKind::device_out_of_memory);
  CHECK_THAT(ex.error().message(), Catch::Contains("loading the kernels' code object"));
  CHECK(fake->held_bytes() == 0);  // the runtime state and heap went back with the executor
  CHECK(LlvmRuntimeExecutor::create(config));  // and the next one works
}

TEST_CASE("each CUDA device gets PTX for its own compute capability", "[cuda][e2e][target]") {
  // {what the device reports, the .target kiln loads}: LLVM 19 writes up to sm_90, so a newer
  // GPU gets sm_90 PTX, which its driver JIT-compiles.
  const std::pair<const char *, const char *> cases[] = {
      {"sm_80", "sm_80"}, {"sm_86", "sm_86"}, {"sm_90", "sm_90"}, {"sm_100", "sm_90"}};
  for (const auto &[device_arch, loaded] : cases) {
    INFO(device_arch);
    FakeGpu *fake = cuda().fake_or_skip();
    if (fake == nullptr) return;
    REQUIRE(fake->set_arch(device_arch) == 0);
    auto ex = make_gpu_executor(Backend::cuda);
    CHECK(static_cast<GpuDevice &>(ex->device()).code_target() == device_arch);
    CHECK(fake->last_module_target() == loaded);
    auto x = value_or_throw(ex->ndarray(DataType::f32, std::vector<int64_t>{1000}));
    REQUIRE(ex->fill(x, Scalar::of(2.5)));
    CHECK(value_or_throw(ex->reduce_sum(x)).f64 == 2500.0);
    REQUIRE(ex->free(x));
  }
}

TEST_CASE("PTX for a newer GPU than the device is NotSupported before the driver sees it",
          "[cuda][e2e][target]") {
  FakeGpu *fake = cuda().fake_or_skip();
  if (fake == nullptr) return;
  REQUIRE(fake->set_arch("sm_80") == 0);
  const auto sm_90 = value_or_throw(Program::shared(CodegenArch::nvptx64, "sm_90"));
  CHECK(sm_90->target() == "sm_90");
  CHECK(value_or_throw(Program::shared(CodegenArch::nvptx64, "sm_100"))->target() == "sm_90");
  ExecutorConfig config;
  config.backend = Backend::cuda;
  auto ex = LlvmRuntimeExecutor::create(config, sm_90);
  REQUIRE_FALSE(ex);
  CHECK(classify(ex.error()) == ErrorKind::not_supported);
  CHECK_THAT(ex.error().message(), Catch::Contains("sm_90") && Catch::Contains("sm_80"));
  CHECK(fake->call_count("cuModuleLoadData") == 0);
  CHECK(fake->held_bytes() == 0);
  // Older PTX runs on a newer GPU (the driver compiles it).
  REQUIRE(fake->set_arch("sm_90") == 0);
  CHECK(LlvmRuntimeExecutor::create(config, value_or_throw(Program::shared(CodegenArch::nvptx64, "sm_80"))));
  // What the real driver answers for too-new PTX, the fake answers too: INVALID_PTX, not a
  // "not supported" that kiln could name; which is why kiln checks first.
  REQUIRE(fake->set_arch("sm_80") == 0);
  auto device = value_or_throw(create_cuda_device(0));
  auto loaded = device->load_module(sm_90->code_image());
  REQUIRE_FALSE(loaded);
  CHECK(std::string(loaded.error().driver_status) == "CUDA_ERROR_INVALID_PTX");
}

TEST_CASE("a driver that cannot say the compute capability fails the device by name, holding nothing",
          "[cuda][e2e][target]") {
  FakeGpu *fake = cuda().fake_or_skip();
  if (fake == nullptr) return;
  REQUIRE(fake->inject_fault("cuDeviceGetAttribute", 1, 2) == 0);  // CUDA_ERROR_OUT_OF_MEMORY
  auto device = create_cuda_device(0);
  REQUIRE_FALSE(device);
  CHECK(std::string(device.error().site) == "cuDeviceGetAttribute");
  CHECK(std::string(device.error().driver_status) == "CUDA_ERROR_OUT_OF_MEMORY");
  CHECK(fake->call_count("cuDevicePrimaryCtxRetain") == 0);  // asked before a context is held
  CHECK(create_cuda_device(0));                             // the next attempt works
}

TEST_CASE("injected fault kinds are the same named errors on the fake CUDA driver, holding nothing",
          "[cuda][e2e][fault_kinds]") {
  FakeGpu *fake = cuda().fake_or_skip();
  if (fake == nullptr) return;
  auto ex = make_gpu_executor(Backend::cuda);
  Ndarray y = upload<float>(*ex, DataType::f32, {1.0f, 2.0f});
  const uint64_t ledger_before = ledger_bytes(*ex);

  // kind=launch: the fill launch fails before cuLaunchKernel, RuntimeFaultError, not sticky.
  REQUIRE(ex->arm_fault(value_or_throw(runtime::FaultSpec::parse("kind=launch,kernel=fill"))));
  const unsigned long long launches_before = fake->call_count("cuLaunchKernel");
  auto failed = ex->fill(y, Scalar::of(3.0));
  REQUIRE_FALSE(failed);
  CHECK(classify(failed.error()) == ErrorKind::runtime_error);
  CHECK(failed.error().injected);
  CHECK_THAT(failed.error().message(), Catch::Contains("kiln_fill_f32"));
  CHECK(fake->call_count("cuLaunchKernel") == launches_before);
  CHECK(ledger_bytes(*ex) == ledger_before);
  CHECK_FALSE(ex->device().is_lost());

  // kind=heap on the same device: DeviceHeapExhaustedError.
  REQUIRE(ex->arm_fault(value_or_throw(runtime::FaultSpec::parse("kind=heap,kernel=compact_positive"))));
  auto compacted = ex->compact_positive(y);
  REQUIRE_FALSE(compacted);
  CHECK(classify(compacted.error()) == ErrorKind::device_heap_exhausted);
  CHECK(ledger_bytes(*ex) == ledger_before);

  // kind=lost: DeviceLostError, and later calls fail fast without asking the driver.
  lose_the_device_by_injection(*ex);
  ex->memory().fault_plan().clear();
  const unsigned long long copies_before = fake->call_count("cuMemcpyDtoH_v2");
  std::vector<float> out(2);
  auto read = ex->read(y, std::as_writable_bytes(std::span<float>(out)));
  REQUIRE_FALSE(read);
  CHECK(classify(read.error()) == ErrorKind::device_lost);
  CHECK(fake->call_count("cuMemcpyDtoH_v2") == copies_before);

  // A new executor, once the arrays let go, works.
  value_or_throw(ex->free(y));
  REQUIRE(recreate_executor(ex, ex->config()));
  CHECK(download<float>(*ex, upload<float>(*ex, DataType::f32, {5.0f})) == std::vector<float>{5.0f});
}
