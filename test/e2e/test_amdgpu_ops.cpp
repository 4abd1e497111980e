// The AMDGPU backend end to end against the fake HIP runtime (test/fake_hip): kiln-ops cases, a
// hipErrorOutOfMemory sweep over every hipMalloc call, a sticky fault at a launch, and the
// no-device modes. The same checks as test_cuda_ops.cpp, through the shared fake core.
#include <catch2/catch.hpp>

#include "fake_gpu_handle.h"
#include "kiln/rhi/amdgpu_device.h"
#include "kiln/runtime/embedded_code.h"
#include "suite.h"
#include "test_support.h"

using namespace kiln;
using namespace kiln::test;

namespace {

constexpr int kHipErrorOutOfMemory = 2;
constexpr int kHipErrorIllegalAddress = 700;

FakeGpu &fake_hip() {
  static FakeGpu fake = FakeGpu::open(KILN_FAKE_HIP_LIBRARY, "KILN_HIP_RUNTIME", "kiln_fake_hip_");
  fake.reset();
  return fake;
}

ops::SuiteOptions amdgpu_options(uint64_t max_array_bytes) {
  ops::SuiteOptions options;
  options.config.backend = Backend::amdgpu;
  options.config.device_heap_bytes = 8_MiB;
  options.max_array_bytes = max_array_bytes;
  options.program = value_or_throw(Program::shared(CodegenArch::amdgcn));
  options.out = nullptr;
  return options;
}

}  // namespace

TEST_CASE("kiln-ops cases on amdgpu against the fake HIP runtime are all OK", "[amdgpu][e2e]") {
  FakeGpu &fake = fake_hip();
  const ops::SuiteReport report = ops::run_suite(amdgpu_options(1_MiB));
  REQUIRE_FALSE(report.setup_failure);
  CHECK(report.results.size() >= 40);
  CHECK(report.failed == 0);
  CHECK(report.refused == 0);
  for (const auto &r : report.results) {
    INFO(r.name << ": " << r.detail);
    CHECK(r.verdict == ops::Verdict::ok);
    CHECK(r.ledger_after_bytes - r.ledger_code_bytes == r.device_live_bytes);
  }
  CHECK(fake.call_count("hipModuleLaunchKernel") > 0);
  CHECK(fake.held_bytes() == 0);  // teardown gave everything back to the runtime
}

TEST_CASE("every built code object (gfx942 and gfx1201 too) loads and runs the kiln-ops cases",
          "[amdgpu][e2e]") {
  REQUIRE_FALSE(runtime::amdgcn_code_objects().empty());
  for (const runtime::AmdgcnCodeObject &object : runtime::amdgcn_code_objects()) {
    INFO(object.target);
    FakeGpu &fake = fake_hip();
    REQUIRE(fake.set_arch(std::string(object.target).c_str()) == 0);  // a device of that processor
    auto device = value_or_throw(create_amdgpu_device(0));
    CHECK(device->code_target() == object.target);
    const uint64_t module = value_or_throw(device->load_module(std::as_bytes(object.image)));
    CHECK(device->unload_module(module));
    ops::SuiteOptions options = amdgpu_options(64_KiB);
    options.program = value_or_throw(Program::create(CodegenArch::amdgcn, object.target));
    const ops::SuiteReport report = ops::run_suite(options);
    REQUIRE_FALSE(report.setup_failure);
    CHECK(report.results.size() >= 20);
    CHECK(report.failed == 0);
    CHECK(report.refused == 0);
    CHECK(fake.call_count("hipModuleLoadData") >= 2);
    CHECK(fake.call_count("hipModuleLaunchKernel") > 0);
    CHECK(fake.held_bytes() == 0);
  }
}

TEST_CASE("the executor loads the HSACO and charges it to the ledger as code_object", "[amdgpu][e2e]") {
  FakeGpu &fake = fake_hip();
  auto ex = make_gpu_executor(Backend::amdgpu);
  CHECK(ex->device().name() == "amdgpu:0");
  CHECK(fake.call_count("hipModuleLoadData") == 1);
  const uint64_t code =
      ex->memory().stats().ledger.current_bytes[static_cast<std::size_t>(MemoryCategory::code_object)];
  CHECK(code == value_or_throw(Program::shared(CodegenArch::amdgcn))->code_size_bytes());
  CHECK(code > 4096);
}

TEST_CASE("hipErrorOutOfMemory at any hipMalloc ends OK or DeviceOutOfMemoryError",
          "[amdgpu][e2e][fault]") {
  FakeGpu &fake = fake_hip();
  const ops::SuiteOptions options = amdgpu_options(64_KiB);
  const ops::SuiteReport clean = ops::run_suite(options);
  REQUIRE(clean.failed == 0);
  const unsigned long long calls = fake.call_count("hipMalloc");
  REQUIRE(calls > 5);
  int refused = 0;
  for (unsigned long long k = 1; k <= calls; ++k) {
    fake.reset();
    REQUIRE(fake.inject_fault("hipMalloc", k, kHipErrorOutOfMemory) == 0);
    const ops::SuiteReport run = ops::run_suite(options);
    INFO("fault at hipMalloc call " << k);
    if (run.setup_failure) {  // the fault hit the executor's own set-up
      CHECK(classify(*run.setup_failure) == ErrorKind::device_out_of_memory);
      CHECK(std::string(run.setup_failure->driver_status) == "hipErrorOutOfMemory");
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

TEST_CASE("an illegal address at a launch is DeviceLostError and later cases fail fast",
          "[amdgpu][e2e][lost]") {
  FakeGpu &fake = fake_hip();
  ops::SuiteOptions options = amdgpu_options(64_KiB);
  options.filter = "/f32/tiny";
  REQUIRE(fake.inject_fault("hipModuleLaunchKernel", 3, kHipErrorIllegalAddress) == 0);
  const ops::SuiteReport report = ops::run_suite(options);
  REQUIRE_FALSE(report.setup_failure);
  CHECK(report.failed == 0);
  std::size_t first_lost = report.results.size();
  for (std::size_t i = 0; i < report.results.size(); ++i)
    if (report.results[i].verdict == ops::Verdict::refused) first_lost = std::min(first_lost, i);
  REQUIRE(first_lost < report.results.size());
  CHECK(first_lost > 0);
  for (std::size_t i = first_lost; i < report.results.size(); ++i) {
    INFO(report.results[i].name);
    CHECK(report.results[i].verdict == ops::Verdict::refused);
    CHECK(report.results[i].error_name == "DeviceLostError");
  }
  CHECK(fake.call_count("hipModuleLaunchKernel") == 3);  // nothing launched after the fault
}

TEST_CASE("after a sticky HIP fault kiln fails fast without calling the runtime again",
          "[amdgpu][e2e][lost]") {
  FakeGpu &fake = fake_hip();
  auto ex = make_gpu_executor(Backend::amdgpu);
  Ndarray a = upload<float>(*ex, DataType::f32, {1, 2, 3});
  REQUIRE(fake.inject_fault("hipModuleLaunchKernel", 1, kHipErrorIllegalAddress) == 0);
  auto faulted = ex->fill(a, Scalar::of(1.0));
  REQUIRE_FALSE(faulted);
  CHECK(classify(faulted.error()) == ErrorKind::device_lost);
  CHECK_THAT(faulted.error().message(), Catch::Contains("hipErrorIllegalAddress"));
  const unsigned long long calls = fake.call_count("hipSetDevice");
  const int64_t shape[1] = {4};
  auto b = ex->ndarray(DataType::f32, shape);
  REQUIRE_FALSE(b);
  CHECK(classify(b.error()) == ErrorKind::device_lost);
  auto sum = ex->reduce_sum(a);
  REQUIRE_FALSE(sum);
  CHECK(classify(sum.error()) == ErrorKind::device_lost);
  CHECK_THAT(sum.error().message(), Catch::Contains("lost earlier"));
  CHECK(fake.call_count("hipSetDevice") == calls);  // no runtime call after the loss
}

TEST_CASE("a HIP runtime with no device is NotSupported naming the library and its answer",
          "[amdgpu][e2e]") {
  FakeGpu &fake = fake_hip();
  ExecutorConfig config;
  config.backend = Backend::amdgpu;
  for (const char *mode : {"nodevice", "stub"}) {
    INFO(mode);
    fake.reset();
    REQUIRE(fake.set_mode(mode) == 0);
    auto ex = LlvmRuntimeExecutor::create(config);
    REQUIRE_FALSE(ex);
    CHECK(classify(ex.error()) == ErrorKind::not_supported);
    CHECK_THAT(ex.error().message(),
               Catch::Contains(std::string(mode) == "stub" ? "hipErrorInsufficientDriver" : "hipErrorNoDevice") &&
                   Catch::Contains("libkiln_fake_hip.so"));
  }
  fake.reset();
}

TEST_CASE("an amdgpu device loads only ELF code objects; the fake runtime checks the image too",
          "[amdgpu][e2e]") {
  FakeGpu &fake = fake_hip();
  auto device = value_or_throw(create_amdgpu_device(0));
  const std::string ptx = ".version 7.0\n.target sm_80\n.entry kiln_fill_f32_gpu()\n";
  auto text = device->load_module(std::as_bytes(std::span(ptx.data(), ptx.size() + 1)));
  REQUIRE_FALSE(text);
  CHECK(text.error().result == RhiResult::invalid_usage);
  CHECK(fake.call_count("hipModuleLoadData") == 0);  // refused before the runtime saw it
  std::string not_amdgpu("\x7f" "ELF\x02\x01\x01", 7);
  not_amdgpu.resize(4096, '\0');  // an ELF64 header with no machine and no sections
  auto foreign = device->load_module(std::as_bytes(std::span(not_amdgpu.data(), not_amdgpu.size())));
  REQUIRE_FALSE(foreign);
  CHECK(std::string(foreign.error().driver_status) == "hipErrorInvalidImage");
  const auto image = value_or_throw(Program::shared(CodegenArch::amdgcn))->code_image();
  const uint64_t module = value_or_throw(device->load_module(image));
  CHECK(device->unload_module(module));
}

TEST_CASE("after a lost HIP device a new executor recovers: the last user resets the device",
          "[amdgpu][e2e][lost]") {
  FakeGpu &fake = fake_hip();
  auto ex = make_gpu_executor(Backend::amdgpu);
  const ExecutorConfig config = ex->config();  // a copy: recreate_executor releases ex
  Ndarray a = upload<float>(*ex, DataType::f32, {1, 2, 3});
  Ndarray b = upload<float>(*ex, DataType::f32, {4, 5, 6});
  REQUIRE(fake.inject_fault("hipModuleLaunchKernel", 1, kHipErrorIllegalAddress) == 0);
  REQUIRE_FALSE(ex->fill(a, Scalar::of(1.0)));
  REQUIRE(ex->device().is_lost());

  auto held = recreate_executor(ex, config);  // b is live: the device cannot be reset yet
  REQUIRE_FALSE(held);
  CHECK(classify(held.error()) == ErrorKind::device_lost);
  CHECK_THAT(held.error().message(), Catch::Contains("still hold its driver context"));

  REQUIRE(ex == nullptr);
  a = Ndarray();
  b = Ndarray();  // the last user: hipDeviceReset
  CHECK(fake.call_count("hipDeviceReset") == 1);
  REQUIRE(recreate_executor(ex, config));
  Ndarray c = upload<float>(*ex, DataType::f32, {1, 2, 3});
  REQUIRE(ex->fill(c, Scalar::of(2.0)));
  CHECK(value_or_throw(ex->reduce_sum(c)).f64 == 6.0);
  c = Ndarray();
  ex.reset();
  CHECK(fake.held_bytes() == 0);
}

TEST_CASE("each AMD GPU gets the code object of its own gfx processor", "[amdgpu][e2e][target]") {
  for (const char *gcn_arch : {"gfx90a:sramecc+:xnack-", "gfx942:sramecc+:xnack-", "gfx1100", "gfx1201"}) {
    INFO(gcn_arch);
    FakeGpu &fake = fake_hip();
    REQUIRE(fake.set_arch(gcn_arch) == 0);
    const std::string processor = std::string(gcn_arch).substr(0, std::string(gcn_arch).find(':'));
    auto ex = make_gpu_executor(Backend::amdgpu);
    CHECK(static_cast<GpuDevice &>(ex->device()).code_target() == processor);
    CHECK(ex->program().target() == processor);
    CHECK(fake.last_module_target() == processor);
    auto x = value_or_throw(ex->ndarray(DataType::f64, std::vector<int64_t>{300}));
    REQUIRE(ex->fill(x, Scalar::of(0.5)));
    CHECK(value_or_throw(ex->reduce_sum(x)).f64 == 150.0);
    REQUIRE(ex->free(x));
  }
}

TEST_CASE("an AMD GPU kiln has no code object for is NotSupported naming it and the built targets",
          "[amdgpu][e2e][target]") {
  FakeGpu &fake = fake_hip();
  REQUIRE(fake.set_arch("gfx906:sramecc+:xnack-") == 0);  // MI50: LLVM 19 has it, kiln builds none
  ExecutorConfig config;
  config.backend = Backend::amdgpu;
  auto ex = LlvmRuntimeExecutor::create(config);
  REQUIRE_FALSE(ex);
  CHECK(classify(ex.error()) == ErrorKind::not_supported);
  CHECK_THAT(ex.error().message(), Catch::Contains("gfx906") && Catch::Contains("gfx942"));
  CHECK(fake.held_bytes() == 0);
  CHECK(fake.call_count("hipModuleLoadData") == 0);  // refused before the runtime saw an image

  // A program for another processor is refused before the runtime sees it...
  REQUIRE(fake.set_arch("gfx1100") == 0);
  const auto gfx942 = value_or_throw(Program::shared(CodegenArch::amdgcn, "gfx942"));
  auto wrong = LlvmRuntimeExecutor::create(config, gfx942);
  REQUIRE_FALSE(wrong);
  CHECK(classify(wrong.error()) == ErrorKind::not_supported);
  CHECK_THAT(wrong.error().message(), Catch::Contains("gfx942") && Catch::Contains("gfx1100"));
  CHECK(fake.call_count("hipModuleLoadData") == 0);
  CHECK(fake.held_bytes() == 0);
  // ...which would refuse it too, as the real one does.
  auto device = value_or_throw(create_amdgpu_device(0));
  auto loaded = device->load_module(gfx942->code_image());
  REQUIRE_FALSE(loaded);
  CHECK(std::string(loaded.error().driver_status) == "hipErrorNoBinaryForGpu");
}

TEST_CASE("a runtime that cannot give the device properties fails the device by name",
          "[amdgpu][e2e][target]") {
  FakeGpu &fake = fake_hip();
  REQUIRE(fake.inject_fault("hipGetDeviceProperties", 1, 101) == 0);  // hipErrorInvalidDevice
  auto device = create_amdgpu_device(0);
  REQUIRE_FALSE(device);
  CHECK(classify(device.error()) == ErrorKind::not_supported);
  CHECK(std::string(device.error().site) == "hipGetDeviceProperties");
  CHECK(std::string(device.error().driver_status) == "hipErrorInvalidDevice");
  CHECK(create_amdgpu_device(0));  // the next attempt works
}
