// The AMDGPU backend end to end against the fake HIP runtime (test/fake_hip): its registration in
// the GPU-backend matrix (gpu_backend_matrix.h: kiln-ops cases, a hipErrorOutOfMemory sweep over
// every hipMalloc call, sticky faults at a launch, the no-device modes, recovery from a lost device)
// and the cases only AMDGPU has: the gfx code objects, ELF-only module loads, device properties.
#include <catch2/catch.hpp>

#include "gpu_backend_matrix.h"
#include "kiln/rhi/amdgpu_device.h"
#include "kiln/runtime/embedded_code.h"
#include "suite.h"
#include "test_support.h"

using namespace kiln;
using namespace kiln::test;

namespace {

#ifdef KILN_FAKE_HIP_LIBRARY
constexpr const char *kFakeHipLibrary = KILN_FAKE_HIP_LIBRARY;
#else
constexpr const char *kFakeHipLibrary = nullptr;
#endif

const GpuBackendCase &amdgpu() {
  static const GpuBackendCase backend{
      .name = "amdgpu",
      .backend = Backend::amdgpu,
      .arch = CodegenArch::amdgcn,
      .fake_library = kFakeHipLibrary,
      .driver_env = "KILN_HIP_RUNTIME",
      .fake_prefix = "kiln_fake_hip_",
      .alloc_entry = "hipMalloc",
      .launch_entry = "hipModuleLaunchKernel",
      .context_entry = "hipSetDevice",
      .device_reset_entry = "hipDeviceReset",  // by the last user of a lost device
      .module_unload_entry = "hipModuleUnload",
      .out_of_memory_code = 2,                 // hipErrorOutOfMemory
      .out_of_memory_status = "hipErrorOutOfMemory",
      .illegal_address_code = 700,
      .illegal_address_status = "hipErrorIllegalAddress",
      .unsupported_modes = {{"nodevice", "hipErrorNoDevice"}, {"stub", "hipErrorInsufficientDriver"}},
  };
  return backend;
}

}  // namespace

KILN_GPU_BACKEND_MATRIX(amdgpu, "amdgpu")

TEST_CASE("every built code object (gfx942 and gfx1201 too) loads and runs the kiln-ops cases",
          "[amdgpu][e2e]") {
  REQUIRE_FALSE(runtime::amdgcn_code_objects().empty());
  for (const runtime::AmdgcnCodeObject &object : runtime::amdgcn_code_objects()) {
    INFO(object.target);
    FakeGpu *fake = amdgpu().fake_or_skip();
  if (fake == nullptr) return;
    REQUIRE(fake->set_arch(std::string(object.target).c_str()) == 0);  // a device of that processor
    auto device = value_or_throw(create_amdgpu_device(0));
    CHECK(device->code_target() == object.target);
    const uint64_t module = value_or_throw(device->load_module(std::as_bytes(object.image)));
    CHECK(device->unload_module(module));
    ops::SuiteOptions options = amdgpu().suite_options(64_KiB);
    options.program = value_or_throw(Program::create(CodegenArch::amdgcn, object.target));
    const ops::SuiteReport report = ops::run_suite(options);
    REQUIRE_FALSE(report.setup_failure);
    CHECK(report.results.size() >= 20);
    CHECK(report.failed == 0);
    CHECK(report.refused == 0);
    CHECK(fake->call_count("hipModuleLoadData") >= 2);
    CHECK(fake->call_count("hipModuleLaunchKernel") > 0);
    CHECK(fake->held_bytes() == 0);
  }
}

TEST_CASE("the executor loads the HSACO and charges it to the ledger as code_object", "[amdgpu][e2e]") {
  FakeGpu *fake = amdgpu().fake_or_skip();
  if (fake == nullptr) return;
  auto ex = make_gpu_executor(Backend::amdgpu);
  CHECK(ex->device().name() == "amdgpu:0");
  CHECK(fake->call_count("hipModuleLoadData") == 1);
  const uint64_t code =
      ex->memory().stats().ledger.current_bytes[static_cast<std::size_t>(MemoryCategory::code_object)];
  CHECK(code == value_or_throw(Program::shared(CodegenArch::amdgcn))->code_size_bytes());
  CHECK(code > 4096);
}

TEST_CASE("an amdgpu device loads only ELF code objects; the fake runtime checks the image too",
          "[amdgpu][e2e]") {
  FakeGpu *fake = amdgpu().fake_or_skip();
  if (fake == nullptr) return;
  auto device = value_or_throw(create_amdgpu_device(0));
  const std::string ptx = ".version 7.0\n.target sm_80\n.entry kiln_fill_f32_gpu()\n";
  auto text = device->load_module(std::as_bytes(std::span(ptx.data(), ptx.size() + 1)));
  REQUIRE_FALSE(text);
  CHECK(text.error().result == RhiResult::invalid_usage);
  CHECK(fake->call_count("hipModuleLoadData") == 0);  // refused before the runtime saw it
  std::string not_amdgpu("\x7f" "ELF\x02\x01\x01", 7);
  not_amdgpu.resize(4096, '\0');  // an ELF64 header with no machine and no sections
  auto foreign = device->load_module(std::as_bytes(std::span(not_amdgpu.data(), not_amdgpu.size())));
  REQUIRE_FALSE(foreign);
  CHECK(std::string(foreign.error().driver_status) == "hipErrorInvalidImage");
  const auto image = value_or_throw(Program::shared(CodegenArch::amdgcn))->code_image();
  const uint64_t module = value_or_throw(device->load_module(image));
  CHECK(device->unload_module(module));
}

TEST_CASE("each AMD GPU gets the code object of its own gfx processor", "[amdgpu][e2e][target]") {
  for (const char *gcn_arch : {"gfx90a:sramecc+:xnack-", "gfx942:sramecc+:xnack-", "gfx1100", "gfx1201"}) {
    INFO(gcn_arch);
    FakeGpu *fake = amdgpu().fake_or_skip();
  if (fake == nullptr) return;
    REQUIRE(fake->set_arch(gcn_arch) == 0);
    const std::string processor = std::string(gcn_arch).substr(0, std::string(gcn_arch).find(':'));
    auto ex = make_gpu_executor(Backend::amdgpu);
    CHECK(static_cast<GpuDevice &>(ex->device()).code_target() == processor);
    CHECK(ex->program().target() == processor);
    CHECK(fake->last_module_target() == processor);
    auto x = value_or_throw(ex->ndarray(DataType::f64, std::vector<int64_t>{300}));
    REQUIRE(ex->fill(x, Scalar::of(0.5)));
    CHECK(value_or_throw(ex->reduce_sum(x)).f64 == 150.0);
    REQUIRE(ex->free(x));
  }
}

TEST_CASE("an AMD GPU kiln has no code object for is NotSupported naming it and the built targets",
          "[amdgpu][e2e][target]") {
  FakeGpu *fake = amdgpu().fake_or_skip();
  if (fake == nullptr) return;
  REQUIRE(fake->set_arch("gfx906:sramecc+:xnack-") == 0);  // MI50: LLVM 19 has it, kiln builds none
  ExecutorConfig config;
  config.backend = Backend::amdgpu;
  auto ex = LlvmRuntimeExecutor::create(config);
  REQUIRE_FALSE(ex);
  CHECK(classify(ex.error()) == ErrorKind::not_supported);
  CHECK_THAT(ex.error().message(), Catch::Contains("gfx906") && Catch::Contains("gfx942"));
  CHECK(fake->held_bytes() == 0);
  CHECK(fake->call_count("hipModuleLoadData") == 0);  // refused before the runtime saw an image

  // A program for another processor is refused before the runtime sees it...
  REQUIRE(fake->set_arch("gfx1100") == 0);
  const auto gfx942 = value_or_throw(Program::shared(CodegenArch::amdgcn, "gfx942"));
  auto wrong = LlvmRuntimeExecutor::create(config, gfx942);
  REQUIRE_FALSE(wrong);
  CHECK(classify(wrong.error()) == ErrorKind::not_supported);
  CHECK_THAT(wrong.error().message(), Catch::Contains("gfx942") && Catch::Contains("gfx1100"));
  CHECK(fake->call_count("hipModuleLoadData") == 0);
  CHECK(fake->held_bytes() == 0);
  // ...which would refuse it too, as the real one does.
  auto device = value_or_throw(create_amdgpu_device(0));
  auto loaded = device->load_module(gfx942->code_image());
  REQUIRE_FALSE(loaded);
  CHECK(std::string(loaded.error().driver_status) == "hipErrorNoBinaryForGpu");
}

TEST_CASE("a runtime that cannot give the device properties fails the device by name",
          "[amdgpu][e2e][target]") {
  FakeGpu *fake = amdgpu().fake_or_skip();
  if (fake == nullptr) return;
  REQUIRE(fake->inject_fault("hipGetDeviceProperties", 1, 101) == 0);  // hipErrorInvalidDevice
  auto device = create_amdgpu_device(0);
  REQUIRE_FALSE(device);
  CHECK(classify(device.error()) == ErrorKind::not_supported);
  CHECK(std::string(device.error().site) == "hipGetDeviceProperties");
  CHECK(std::string(device.error().driver_status) == "hipErrorInvalidDevice");
  CHECK(create_amdgpu_device(0));  // the next attempt works
}
