// The backend registry (rhi/include/kiln/rhi/backend_registry.h): every backend kiln lists is made
// by its own factory with the options meant for it, and a backend without one is NotSupported.
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fake_gpu_handle.h"
#include "kiln/rhi/backend_registry.h"
#include "kiln/rhi/mock_device.h"
#include "kiln/rhi/teardown_failures.h"
#include "kiln/rhi/user_text.h"

using kiln::Backend;
using kiln::DeviceOptions;
using kiln::RhiResult;

TEST_CASE("the registry makes cpu and mock devices of the asked backend", "[rhi][registry]") {
  for (Backend backend : {Backend::cpu, Backend::mock}) {
    auto device = kiln::create_device(backend);
    REQUIRE(device);
    CHECK((*device)->backend() == backend);
    CHECK((*device)->name() == kiln::to_string(backend));
    CHECK((*device)->host_addressable());
  }
}

TEST_CASE("the mock factory is given the mock options", "[rhi][registry]") {
  DeviceOptions options;
  options.mock.capacity_bytes = 3ull << 20;
  options.mock.other_process_bytes_script = {1ull << 20};
  auto device = kiln::create_device(Backend::mock, options);
  REQUIRE(device);
  auto info = (*device)->memory_info();
  REQUIRE(info);
  CHECK(info->total_bytes == 3ull << 20);
  CHECK(info->free_bytes == 2ull << 20);
}

TEST_CASE("a GPU factory is given the ordinal", "[rhi][registry]") {
  static kiln::test::FakeGpu fake =
      kiln::test::FakeGpu::open(KILN_FAKE_CUDA_LIBRARY, "KILN_CUDA_DRIVER", "kiln_fake_cuda_");
  setenv("KILN_CUDA_DRIVER", KILN_FAKE_CUDA_LIBRARY, 1);  // other tests may point it elsewhere
  fake.reset();
  auto first = kiln::create_device(Backend::cuda);
  REQUIRE(first);
  CHECK((*first)->name() == "cuda:0");
  first->reset();
  DeviceOptions options;
  options.ordinal = 7;  // the fake driver has one device
  auto missing = kiln::create_device(Backend::cuda, options);
  REQUIRE_FALSE(missing);
  CHECK(missing.error().result == RhiResult::not_supported);
  CHECK_THAT(missing.error().message(), Catch::Contains("no CUDA device 7"));
}

TEST_CASE("a backend without a factory is NotSupported, never a crash", "[rhi][registry]") {
  auto device = kiln::create_device(static_cast<Backend>(200));
  REQUIRE_FALSE(device);
  CHECK(device.error().result == RhiResult::not_supported);
  CHECK_THAT(device.error().message(), Catch::Contains("is not built into this kiln"));
}

TEST_CASE("backend names come from the one list", "[rhi][registry]") {
  for (Backend backend : {Backend::cpu, Backend::mock, Backend::cuda, Backend::amdgpu}) {
    auto parsed = kiln::parse_backend(kiln::to_string(backend));
    REQUIRE(parsed);
    CHECK(*parsed == backend);
  }
  auto unknown = kiln::parse_backend("tpu");
  REQUIRE_FALSE(unknown);
  CHECK_THAT(unknown.error().message(),
             Catch::Contains("unknown backend 'tpu'; kiln knows cpu, mock, cuda, amdgpu"));
}

TEST_CASE("cpu and mock have only device 0: another ordinal is invalid usage", "[rhi][registry]") {
  for (Backend backend : {Backend::cpu, Backend::mock}) {
    DeviceOptions options;
    options.ordinal = 1;
    auto device = kiln::create_device(backend, options);
    REQUIRE_FALSE(device);
    CHECK(device.error().result == RhiResult::invalid_usage);
    CHECK_THAT(device.error().message(),
               Catch::Contains("has one device") && Catch::Contains(std::string(kiln::to_string(backend)) + ":1"));
  }
}

TEST_CASE("a device name is a backend and an optional ordinal", "[rhi][registry]") {
  const auto parsed = [](const char *name) { return kiln::parse_device_name(name); };
  REQUIRE(parsed("cuda"));
  CHECK(parsed("cuda")->backend == Backend::cuda);
  CHECK(parsed("cuda")->ordinal == 0);
  REQUIRE(parsed("amdgpu:3"));
  CHECK(parsed("amdgpu:3")->backend == Backend::amdgpu);
  CHECK(parsed("amdgpu:3")->ordinal == 3);
  CHECK(parsed("cpu:0")->backend == Backend::cpu);
  for (const char *bad : {"cuda:", "cuda:x", "cuda:-1", "cuda:+1", "cuda:1:2", "cuda:10000", "cuda: 1"}) {
    INFO(bad);
    auto refused = parsed(bad);
    REQUIRE_FALSE(refused);
    CHECK(refused.error().result == RhiResult::invalid_usage);
    CHECK_THAT(refused.error().message(), Catch::Contains("is not a device name"));
  }
  auto unknown = parsed("tpu:1");
  REQUIRE_FALSE(unknown);
  CHECK_THAT(unknown.error().message(), Catch::Contains("unknown backend 'tpu'"));
}

TEST_CASE("a device name is echoed as passed: a NUL or a newline cannot cut or bend it", "[rhi][registry]") {
  using namespace std::string_view_literals;
  auto nul = kiln::parse_device_name("cpu\0x"sv);
  REQUIRE_FALSE(nul);
  CHECK_THAT(nul.error().message(), Catch::Contains("unknown backend 'cpu\\x00x'"));
  auto ordinal = kiln::parse_device_name("cuda:1\n'"sv);
  REQUIRE_FALSE(ordinal);
  CHECK_THAT(ordinal.error().message(), Catch::Contains("'cuda:1\\n\\'' is not a device name"));
  CHECK(kiln::quote_user_text("a\\b\x7f\xc3") == "'a\\\\b\\x7f\\xc3'");
}

TEST_CASE("a failed device teardown is recorded until taken, the newest 64 kept", "[rhi][registry]") {
  (void)kiln::take_teardown_failures();  // whatever an earlier test left
  kiln::record_teardown_failure("cuda:0: first");
  kiln::record_teardown_failure("cuda:1: second");
  CHECK(kiln::take_teardown_failures() == std::vector<std::string>{"cuda:0: first", "cuda:1: second"});
  CHECK(kiln::take_teardown_failures().empty());  // taken once
  for (int i = 0; i < 70; ++i) kiln::record_teardown_failure(std::to_string(i));
  const std::vector<std::string> kept = kiln::take_teardown_failures();
  REQUIRE(kept.size() == 64);
  CHECK(kept.front() == "6");
  CHECK(kept.back() == "69");
}
