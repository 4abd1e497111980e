// The CUDA backend end to end against the fake driver (test/fake_cuda): kiln-ops cases, a driver
// out-of-memory sweep over every cuMemAlloc_v2 call, a sticky fault at a launch, stub mode.
#include <catch2/catch.hpp>

#include "fake_gpu_handle.h"
#include "kiln/rhi/cuda_device.h"
#include "kiln/rhi/gpu_device.h"
#include "suite.h"
#include "test_support.h"

using namespace kiln;
using namespace kiln::test;

namespace {

using FakeCuda = FakeGpu;

FakeCuda &fake_cuda() {
  static FakeCuda fake = FakeGpu::open(KILN_FAKE_CUDA_LIBRARY, "KILN_CUDA_DRIVER", "kiln_fake_cuda_");
  fake.reset();
  return fake;
}

ops::SuiteOptions cuda_options(uint64_t max_array_bytes) {
  ops::SuiteOptions options;
  options.config.backend = Backend::cuda;
  options.config.device_heap_bytes = 8_MiB;
  options.max_array_bytes = max_array_bytes;
  options.program = value_or_throw(Program::shared(CodegenArch::nvptx64));
  options.out = nullptr;
  return options;
}

}  // namespace

TEST_CASE("kiln-ops cases on cuda against the fake driver are all OK", "[cuda][e2e]") {
  FakeCuda &fake = fake_cuda();
  const ops::SuiteReport report = ops::run_suite(cuda_options(1_MiB));
  REQUIRE_FALSE(report.setup_failure);
  CHECK(report.results.size() >= 40);
  CHECK(report.failed == 0);
  CHECK(report.refused == 0);
  for (const auto &r : report.results) {
    INFO(r.name << ": " << r.detail);
    CHECK(r.ledger_after_bytes - r.ledger_code_bytes == r.device_live_bytes);
  }
  CHECK(fake.held_bytes() == 0);  // teardown gave everything back to the driver
}

TEST_CASE("CUDA_ERROR_OUT_OF_MEMORY at any cuMemAlloc_v2 ends OK or DeviceOutOfMemoryError",
          "[cuda][e2e][fault]") {
  FakeCuda &fake = fake_cuda();
  const ops::SuiteOptions options = cuda_options(64_KiB);
  const ops::SuiteReport clean = ops::run_suite(options);
  REQUIRE(clean.failed == 0);
  const unsigned long long calls = fake.call_count("cuMemAlloc_v2");
  REQUIRE(calls > 5);
  int refused = 0;
  for (unsigned long long k = 1; k <= calls; ++k) {
    fake.reset();
    REQUIRE(fake.inject_fault("cuMemAlloc_v2", k, 2) == 0);  // CUDA_ERROR_OUT_OF_MEMORY
    const ops::SuiteReport run = ops::run_suite(options);
    INFO("fault at cuMemAlloc_v2 call " << k);
    if (run.setup_failure) {  // the fault hit the executor's own set-up
      CHECK(classify(*run.setup_failure) == ErrorKind::device_out_of_memory);
      ++refused;
    } else {
      CHECK(run.failed == 0);
      for (const auto &r : run.results) {
        if (r.verdict == ops::Verdict::refused) {
          CHECK(r.error_name == "DeviceOutOfMemoryError");
          ++refused;
        }
        CHECK(r.ledger_after_bytes - r.ledger_cached_bytes == run.ledger_baseline_bytes);
      }
    }
    CHECK(fake.held_bytes() == 0);
  }
  CHECK(refused > 0);
}

TEST_CASE("an illegal address at a launch is DeviceLostError and later cases fail fast with it",
          "[cuda][e2e][lost]") {
  FakeCuda &fake = fake_cuda();
  ops::SuiteOptions options = cuda_options(64_KiB);
  options.filter = "/f32/tiny";
  REQUIRE(fake.inject_fault("cuLaunchKernel", 3, 700) == 0);  // CUDA_ERROR_ILLEGAL_ADDRESS
  const ops::SuiteReport report = ops::run_suite(options);
  REQUIRE_FALSE(report.setup_failure);
  CHECK(report.failed == 0);
  std::size_t first_lost = report.results.size();
  for (std::size_t i = 0; i < report.results.size(); ++i)
    if (report.results[i].verdict == ops::Verdict::refused) {
      first_lost = std::min(first_lost, i);
      CHECK(report.results[i].error_name == "DeviceLostError");
    }
  REQUIRE(first_lost < report.results.size());
  for (std::size_t i = first_lost; i < report.results.size(); ++i) {
    INFO(report.results[i].name);
    CHECK(report.results[i].verdict == ops::Verdict::refused);
    CHECK(report.results[i].error_name == "DeviceLostError");
  }
  CHECK(fake.call_count("cuLaunchKernel") == 3);  // nothing launched after the fault
}

TEST_CASE("the stub driver is NotSupported naming the library and its answer", "[cuda][e2e]") {
  FakeCuda &fake = fake_cuda();
  REQUIRE(fake.set_mode("stub") == 0);
  ExecutorConfig config;
  config.backend = Backend::cuda;
  auto ex = LlvmRuntimeExecutor::create(config);
  fake.reset();
  REQUIRE_FALSE(ex);
  CHECK(classify(ex.error()) == ErrorKind::not_supported);
  CHECK_THAT(ex.error().message(), Catch::Contains("CUDA_ERROR_STUB_LIBRARY") &&
                                       Catch::Contains("libkiln_fake_cuda.so"));
}

TEST_CASE("after a sticky fault kiln fails fast without calling the driver again", "[cuda][e2e][lost]") {
  FakeCuda &fake = fake_cuda();
  auto ex = make_gpu_executor(Backend::cuda);
  Ndarray a = upload<float>(*ex, DataType::f32, {1, 2, 3});
  REQUIRE(fake.inject_fault("cuLaunchKernel", 1, 700) == 0);
  auto faulted = ex->fill(a, Scalar::of(1.0));
  REQUIRE_FALSE(faulted);
  CHECK(classify(faulted.error()) == ErrorKind::device_lost);
  CHECK_THAT(faulted.error().message(), Catch::Contains("CUDA_ERROR_ILLEGAL_ADDRESS"));
  const unsigned long long calls = fake.call_count("cuCtxSetCurrent");
  const int64_t shape[1] = {4};
  auto b = ex->ndarray(DataType::f32, shape);
  REQUIRE_FALSE(b);
  CHECK(classify(b.error()) == ErrorKind::device_lost);
  auto sum = ex->reduce_sum(a);
  REQUIRE_FALSE(sum);
  CHECK(classify(sum.error()) == ErrorKind::device_lost);
  CHECK_THAT(sum.error().message(), Catch::Contains("lost earlier"));
  CHECK(fake.call_count("cuCtxSetCurrent") == calls);  // no driver call after the loss
}

TEST_CASE("a free the driver refuses stays charged and synchronize reports it once",
          "[cuda][e2e][free]") {
  FakeCuda &fake = fake_cuda();
  auto ex = make_gpu_executor(Backend::cuda);
  runtime::DeviceMemory &memory = ex->memory();
  auto block = value_or_throw(memory.allocate(MemoryCategory::staging, 1_MiB));
  value_or_throw(memory.free(block));  // into the pool
  const uint64_t before = memory.in_use_bytes();
  REQUIRE(fake.inject_fault("cuMemFree_v2", 1, 1) == 0);  // CUDA_ERROR_INVALID_VALUE
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
  FakeCuda &fake = fake_cuda();
  auto ex = make_gpu_executor(Backend::cuda);
  REQUIRE(ex->device().synchronize());
  const uint64_t live_before = ex->device().live_allocation_count();
  REQUIRE(fake.inject_fault("cuMemsetD8_v2", 1, 2) == 0);  // CUDA_ERROR_OUT_OF_MEMORY
  REQUIRE(fake.inject_fault("cuMemFree_v2", 1, 1) == 0);   // CUDA_ERROR_INVALID_VALUE
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
  FakeCuda &fake = fake_cuda();
  auto ex = make_gpu_executor(Backend::cuda);
  REQUIRE(fake.inject_fault("cuMemsetD8_v2", 1, 700) == 0);  // CUDA_ERROR_ILLEGAL_ADDRESS
  const unsigned long long frees_before = fake.call_count("cuMemFree_v2");
  LlvmRuntimeAllocParams params;
  params.size_bytes = 64_KiB;
  params.zero_fill = true;
  auto alloc = ex->device().allocate_runtime(params);
  REQUIRE_FALSE(alloc);
  CHECK(alloc.error().result == RhiResult::device_lost);
  CHECK(fake.call_count("cuMemFree_v2") == frees_before);  // as dealloc_memory on a lost device
  auto later = ex->device().synchronize();
  REQUIRE_FALSE(later);
  CHECK(later.error().result == RhiResult::device_lost);
  CHECK(std::string(later.error().site) != "cuMemFree_v2");  // no deferred free to report
}

TEST_CASE("a module load the driver refuses fails the executor with a named error and holds nothing",
          "[cuda][e2e]") {
  FakeCuda &fake = fake_cuda();
  REQUIRE(fake.inject_fault("cuModuleLoadData", 1, 2) == 0);  // CUDA_ERROR_OUT_OF_MEMORY
  ExecutorConfig config;
  config.backend = Backend::cuda;
  config.device_heap_bytes = 1_MiB;
  auto ex = LlvmRuntimeExecutor::create(config);
  REQUIRE_FALSE(ex);
  CHECK(classify(ex.error()) == ErrorKind::device_out_of_memory);
  CHECK_THAT(ex.error().message(), Catch::Contains("loading the kernels' code object"));
  CHECK(fake.held_bytes() == 0);  // the runtime state and heap went back with the executor
  CHECK(LlvmRuntimeExecutor::create(config));  // and the next one works
}

TEST_CASE("after a lost device a new executor recovers once the old one and its arrays let go",
          "[cuda][e2e][lost]") {
  FakeCuda &fake = fake_cuda();
  auto ex = make_gpu_executor(Backend::cuda);
  const ExecutorConfig config = ex->config();  // a copy: recreate_executor releases ex
  Ndarray a = upload<float>(*ex, DataType::f32, {1, 2, 3});
  Ndarray b = upload<float>(*ex, DataType::f32, {4, 5, 6});
  REQUIRE(fake.inject_fault("cuLaunchKernel", 1, 700) == 0);  // CUDA_ERROR_ILLEGAL_ADDRESS
  auto faulted = ex->fill(a, Scalar::of(1.0));
  REQUIRE_FALSE(faulted);
  REQUIRE(classify(faulted.error()) == ErrorKind::device_lost);

  // A live array keeps the lost context: the new executor is lost too, and says why.
  auto held = recreate_executor(ex, config);
  REQUIRE_FALSE(held);
  CHECK(classify(held.error()) == ErrorKind::device_lost);
  CHECK_THAT(held.error().message(), Catch::Contains("still hold its driver context"));
  CHECK(ex == nullptr);

  // Freed (a) or dropped (b): the context goes, and a new executor works.
  auto again = LlvmRuntimeExecutor::create(config);
  REQUIRE_FALSE(again);
  CHECK(again.error().result == RhiResult::device_lost);
  REQUIRE(ex == nullptr);
  REQUIRE(held.error().result == RhiResult::device_lost);
  a = Ndarray();
  b = Ndarray();
  REQUIRE(recreate_executor(ex, config));
  Ndarray c = upload<float>(*ex, DataType::f32, {1, 2, 3});
  REQUIRE(ex->fill(c, Scalar::of(2.0)));
  CHECK(value_or_throw(ex->reduce_sum(c)).f64 == 6.0);
}

TEST_CASE("recreate_executor releases a lost executor before making the new one", "[cuda][e2e][lost]") {
  FakeCuda &fake = fake_cuda();
  auto ex = make_gpu_executor(Backend::cuda);
  const ExecutorConfig config = ex->config();  // a copy: recreate_executor releases ex
  Ndarray a = upload<float>(*ex, DataType::f32, {1, 2, 3});
  REQUIRE(fake.inject_fault("cuLaunchKernel", 1, 700) == 0);
  REQUIRE_FALSE(ex->fill(a, Scalar::of(1.0)));
  REQUIRE(ex->free(a));  // freed, still referenced: it no longer holds the device
  REQUIRE(recreate_executor(ex, config));
  REQUIRE(ex != nullptr);
  CHECK_FALSE(ex->device().is_lost());
  Ndarray c = upload<float>(*ex, DataType::f32, {1, 2, 3});
  CHECK(value_or_throw(ex->reduce_sum(c)).f64 == 6.0);
  c = Ndarray();
  ex.reset();
  CHECK(fake.held_bytes() == 0);
}

TEST_CASE("each CUDA device gets PTX for its own compute capability", "[cuda][e2e][target]") {
  // {what the device reports, the .target kiln loads}: LLVM 19 writes up to sm_90, so a newer
  // GPU gets sm_90 PTX, which its driver JIT-compiles.
  const std::pair<const char *, const char *> cases[] = {
      {"sm_80", "sm_80"}, {"sm_86", "sm_86"}, {"sm_90", "sm_90"}, {"sm_100", "sm_90"}};
  for (const auto &[device_arch, loaded] : cases) {
    INFO(device_arch);
    FakeCuda &fake = fake_cuda();
    REQUIRE(fake.set_arch(device_arch) == 0);
    auto ex = make_gpu_executor(Backend::cuda);
    CHECK(static_cast<GpuDevice &>(ex->device()).code_target() == device_arch);
    CHECK(fake.last_module_target() == loaded);
    auto x = value_or_throw(ex->ndarray(DataType::f32, std::vector<int64_t>{1000}));
    REQUIRE(ex->fill(x, Scalar::of(2.5)));
    CHECK(value_or_throw(ex->reduce_sum(x)).f64 == 2500.0);
    REQUIRE(ex->free(x));
  }
}

TEST_CASE("PTX for a newer GPU than the device is NotSupported before the driver sees it",
          "[cuda][e2e][target]") {
  FakeCuda &fake = fake_cuda();
  REQUIRE(fake.set_arch("sm_80") == 0);
  const auto sm_90 = value_or_throw(Program::shared(CodegenArch::nvptx64, "sm_90"));
  CHECK(sm_90->target() == "sm_90");
  CHECK(value_or_throw(Program::shared(CodegenArch::nvptx64, "sm_100"))->target() == "sm_90");
  ExecutorConfig config;
  config.backend = Backend::cuda;
  auto ex = LlvmRuntimeExecutor::create(config, sm_90);
  REQUIRE_FALSE(ex);
  CHECK(classify(ex.error()) == ErrorKind::not_supported);
  CHECK_THAT(ex.error().message(), Catch::Contains("sm_90") && Catch::Contains("sm_80"));
  CHECK(fake.call_count("cuModuleLoadData") == 0);
  CHECK(fake.held_bytes() == 0);
  // Older PTX runs on a newer GPU (the driver compiles it).
  REQUIRE(fake.set_arch("sm_90") == 0);
  CHECK(LlvmRuntimeExecutor::create(config, value_or_throw(Program::shared(CodegenArch::nvptx64, "sm_80"))));
  // What the real driver answers for too-new PTX, the fake answers too: INVALID_PTX, not a
  // "not supported" that kiln could name; which is why kiln checks first.
  REQUIRE(fake.set_arch("sm_80") == 0);
  auto device = value_or_throw(create_cuda_device(0));
  auto loaded = device->load_module(sm_90->code_image());
  REQUIRE_FALSE(loaded);
  CHECK(std::string(loaded.error().driver_status) == "CUDA_ERROR_INVALID_PTX");
}

TEST_CASE("a driver that cannot say the compute capability fails the device by name, holding nothing",
          "[cuda][e2e][target]") {
  FakeCuda &fake = fake_cuda();
  REQUIRE(fake.inject_fault("cuDeviceGetAttribute", 1, 2) == 0);  // CUDA_ERROR_OUT_OF_MEMORY
  auto device = create_cuda_device(0);
  REQUIRE_FALSE(device);
  CHECK(std::string(device.error().site) == "cuDeviceGetAttribute");
  CHECK(std::string(device.error().driver_status) == "CUDA_ERROR_OUT_OF_MEMORY");
  CHECK(fake.call_count("cuDevicePrimaryCtxRetain") == 0);  // asked before a context is held
  CHECK(create_cuda_device(0));                             // the next attempt works
}
