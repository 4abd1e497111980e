// The GPU-backend matrix's bodies (gpu_backend_matrix.h): each runs against the fake driver of the
// backend it is given, through its entry-point and answer names, so one body covers every backend.
#include "gpu_backend_matrix.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>

#include "test_support.h"

namespace kiln::test {

FakeGpu *GpuBackendCase::fake_or_skip() const {
  struct Opened {
    std::optional<FakeGpu> fake;
    std::string why;
  };
  static std::map<std::string, Opened> opened;  // one handle per backend for the process
  auto [it, inserted] = opened.try_emplace(name);
  Opened &o = it->second;
  if (inserted) {
    if (fake_library == nullptr)
      o.why = std::string("the fake ") + name + " driver is not built";
    else
      o.fake = FakeGpu::try_open(fake_library, driver_env, fake_prefix, &o.why);
  }
  if (!o.fake) {
    WARN(name << " skipped: " << o.why);
    return nullptr;
  }
  o.fake->reset();
  return &*o.fake;
}

ops::SuiteOptions GpuBackendCase::suite_options(uint64_t max_array_bytes) const {
  ops::SuiteOptions options;
  options.config.backend = backend;
  options.config.device_heap_bytes = 8_MiB;
  options.max_array_bytes = max_array_bytes;
  options.program = value_or_throw(Program::shared(arch));
  options.out = nullptr;
  return options;
}

void lose_the_device_by_injection(LlvmRuntimeExecutor &ex) {
  REQUIRE(ex.arm_fault(value_or_throw(runtime::FaultSpec::parse("kind=lost,nth=1"))));
  const int64_t shape[1] = {16};
  auto lost = ex.ndarray(DataType::f32, shape);
  REQUIRE_FALSE(lost);
  CHECK(classify(lost.error()) == ErrorKind::device_lost);
  CHECK(lost.error().injected);
  REQUIRE(ex.device().is_lost());
}

namespace gpu_matrix {

void ops_cases_all_ok(const GpuBackendCase &b) {
  FakeGpu *fake = b.fake_or_skip();
  if (fake == nullptr) return;
  const ops::SuiteReport report = ops::run_suite(b.suite_options(1_MiB));
  REQUIRE_FALSE(report.setup_failure);
  CHECK(report.results.size() >= 40);
  CHECK(report.failed == 0);
  CHECK(report.refused == 0);
  for (const auto &r : report.results) {
    INFO(r.name << ": " << r.detail);
    CHECK(r.verdict == ops::Verdict::ok);
    CHECK(r.ledger_after_bytes - r.ledger_code_bytes == r.device_live_bytes);
  }
  CHECK(fake->call_count(b.launch_entry) > 0);
  CHECK(fake->held_bytes() == 0);  // teardown gave everything back to the driver
}

void driver_oom_at_every_allocation(const GpuBackendCase &b) {
  FakeGpu *fake = b.fake_or_skip();
  if (fake == nullptr) return;
  const ops::SuiteOptions options = b.suite_options(64_KiB);
  const ops::SuiteReport clean = ops::run_suite(options);
  REQUIRE(clean.failed == 0);
  const unsigned long long calls = fake->call_count(b.alloc_entry);
  REQUIRE(calls > 5);
  int refused = 0;
  for (unsigned long long k = 1; k <= calls; ++k) {
    fake->reset();
    REQUIRE(fake->inject_fault(b.alloc_entry, k, b.out_of_memory_code) == 0);
    const ops::SuiteReport run = ops::run_suite(options);
    INFO("fault at " << b.alloc_entry << " call " << k);
    if (run.setup_failure) {  // the fault hit the executor's own set-up
      CHECK(classify(*run.setup_failure) == ErrorKind::device_out_of_memory);
      CHECK(std::string(run.setup_failure->driver_status) == b.out_of_memory_status);
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
    CHECK(fake->held_bytes() == 0);
  }
  CHECK(refused > 0);
}

// Growth asks the driver for a request's size class; the driver's "no" (out of memory, or a
// sticky fault that loses the device) is still about the request: allocating, its category and
// the bytes the caller asked for (GpuDevice::allocated builds it with them).
void driver_answer_names_the_request(const GpuBackendCase &b) {
  FakeGpu *fake = b.fake_or_skip();
  if (fake == nullptr) return;
  auto ex = make_gpu_executor(b.backend);
  runtime::DeviceMemory &memory = ex->memory();
  const uint64_t size_bytes = 5_MiB + 1;  // grown at a larger size class
  REQUIRE(fake->inject_fault(b.alloc_entry, 1, b.out_of_memory_code) == 0);
  const auto refused = memory.allocate(MemoryCategory::staging, size_bytes);
  REQUIRE_FALSE(refused);
  CHECK(refused.error().oom_source == OomSource::driver);
  CHECK(std::string(refused.error().driver_status) == b.out_of_memory_status);
  CHECK((refused.error().allocating && refused.error().category == MemoryCategory::staging));
  CHECK(refused.error().requested_bytes == size_bytes);

  REQUIRE(fake->inject_fault(b.alloc_entry, 1, b.illegal_address_code) == 0);
  const auto lost = memory.allocate(MemoryCategory::staging, size_bytes);
  REQUIRE_FALSE(lost);
  CHECK(lost.error().result == RhiResult::device_lost);
  CHECK(std::string(lost.error().driver_status) == b.illegal_address_status);
  CHECK((lost.error().allocating && lost.error().requested_bytes == size_bytes));
  CHECK(ex->device().is_lost());
  ex.reset();
}

void illegal_address_at_a_launch(const GpuBackendCase &b) {
  FakeGpu *fake = b.fake_or_skip();
  if (fake == nullptr) return;
  ops::SuiteOptions options = b.suite_options(64_KiB);
  options.filter = "/f32/tiny";
  REQUIRE(fake->inject_fault(b.launch_entry, 3, b.illegal_address_code) == 0);
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
  CHECK(first_lost > 0);
  for (std::size_t i = first_lost; i < report.results.size(); ++i) {
    INFO(report.results[i].name);
    CHECK(report.results[i].verdict == ops::Verdict::refused);
    CHECK(report.results[i].error_name == "DeviceLostError");
  }
  CHECK(fake->call_count(b.launch_entry) == 3);  // nothing launched after the fault
}

void sticky_fault_fails_fast(const GpuBackendCase &b) {
  FakeGpu *fake = b.fake_or_skip();
  if (fake == nullptr) return;
  auto ex = make_gpu_executor(b.backend);
  Ndarray a = upload<float>(*ex, DataType::f32, {1, 2, 3});
  REQUIRE(fake->inject_fault(b.launch_entry, 1, b.illegal_address_code) == 0);
  auto faulted = ex->fill(a, Scalar::of(1.0));
  REQUIRE_FALSE(faulted);
  CHECK(classify(faulted.error()) == ErrorKind::device_lost);
  CHECK_THAT(faulted.error().message(), Catch::Contains(b.illegal_address_status));
  const unsigned long long calls = fake->call_count(b.context_entry);
  const int64_t shape[1] = {4};
  auto c = ex->ndarray(DataType::f32, shape);
  REQUIRE_FALSE(c);
  CHECK(classify(c.error()) == ErrorKind::device_lost);
  auto sum = ex->reduce_sum(a);
  REQUIRE_FALSE(sum);
  CHECK(classify(sum.error()) == ErrorKind::device_lost);
  CHECK_THAT(sum.error().message(), Catch::Contains("lost earlier"));
  CHECK(fake->call_count(b.context_entry) == calls);  // no driver call after the loss
}

void no_device_is_not_supported(const GpuBackendCase &b) {
  FakeGpu *fake = b.fake_or_skip();
  if (fake == nullptr) return;
  ExecutorConfig config;
  config.backend = b.backend;
  REQUIRE_FALSE(b.unsupported_modes.empty());
  for (const auto &[mode, answer] : b.unsupported_modes) {
    INFO(mode);
    fake->reset();
    REQUIRE(fake->set_mode(mode) == 0);
    auto ex = LlvmRuntimeExecutor::create(config);
    fake->reset();
    REQUIRE_FALSE(ex);
    CHECK(classify(ex.error()) == ErrorKind::not_supported);
    const std::string library = std::string(b.fake_library).substr(std::string(b.fake_library).rfind('/') + 1);
    CHECK_THAT(ex.error().message(), Catch::Contains(answer) && Catch::Contains(library));
  }
}

void lost_device_recovers_once_arrays_let_go(const GpuBackendCase &b) {
  FakeGpu *fake = b.fake_or_skip();
  if (fake == nullptr) return;
  auto ex = make_gpu_executor(b.backend);
  const ExecutorConfig config = ex->config();  // a copy: recreate_executor releases ex
  Ndarray a = upload<float>(*ex, DataType::f32, {1, 2, 3});
  Ndarray c = upload<float>(*ex, DataType::f32, {4, 5, 6});
  REQUIRE(fake->inject_fault(b.launch_entry, 1, b.illegal_address_code) == 0);
  auto faulted = ex->fill(a, Scalar::of(1.0));
  REQUIRE_FALSE(faulted);
  REQUIRE(classify(faulted.error()) == ErrorKind::device_lost);
  REQUIRE(ex->device().is_lost());

  // A live array keeps the lost context: the new executor is lost too, and says why.
  auto held = recreate_executor(ex, config);
  REQUIRE_FALSE(held);
  CHECK(classify(held.error()) == ErrorKind::device_lost);
  CHECK_THAT(held.error().message(), Catch::Contains("still hold its driver context"));
  CHECK(ex == nullptr);

  auto again = LlvmRuntimeExecutor::create(config);  // still held: still lost
  REQUIRE_FALSE(again);
  CHECK(again.error().result == RhiResult::device_lost);
  REQUIRE(ex == nullptr);
  // Freed or dropped, the last user lets the context go (HIP: the device is reset).
  a = Ndarray();
  c = Ndarray();
  if (b.device_reset_entry != nullptr) CHECK(fake->call_count(b.device_reset_entry) == 1);
  REQUIRE(recreate_executor(ex, config));
  Ndarray d = upload<float>(*ex, DataType::f32, {1, 2, 3});
  REQUIRE(ex->fill(d, Scalar::of(2.0)));
  CHECK(value_or_throw(ex->reduce_sum(d)).f64 == 6.0);
  d = Ndarray();
  ex.reset();
  CHECK(fake->held_bytes() == 0);
}

void recreate_releases_a_lost_executor_first(const GpuBackendCase &b) {
  FakeGpu *fake = b.fake_or_skip();
  if (fake == nullptr) return;
  auto ex = make_gpu_executor(b.backend);
  const ExecutorConfig config = ex->config();  // a copy: recreate_executor releases ex
  Ndarray a = upload<float>(*ex, DataType::f32, {1, 2, 3});
  REQUIRE(fake->inject_fault(b.launch_entry, 1, b.illegal_address_code) == 0);
  REQUIRE_FALSE(ex->fill(a, Scalar::of(1.0)));
  REQUIRE(ex->free(a));  // freed, still referenced: it no longer holds the device
  REQUIRE(recreate_executor(ex, config));
  REQUIRE(ex != nullptr);
  CHECK_FALSE(ex->device().is_lost());
  Ndarray c = upload<float>(*ex, DataType::f32, {1, 2, 3});
  CHECK(value_or_throw(ex->reduce_sum(c)).f64 == 6.0);
  c = Ndarray();
  ex.reset();
  CHECK(fake->held_bytes() == 0);
}

// An injected loss is a test of the user's DeviceLostError handling, not a real fault: the
// device refuses new work, but kiln still gives its memory and module back to the driver (a real
// sticky fault would make those calls fail), and HIP's last user does not reset the device (that
// would destroy other libraries' memory on a device that is fine).
void injected_loss_gives_everything_back(const GpuBackendCase &b) {
  FakeGpu *fake = b.fake_or_skip();
  if (fake == nullptr) return;
  const size_t held_before = fake->held_bytes();
  auto ex = make_gpu_executor(b.backend);
  Ndarray a = upload<float>(*ex, DataType::f32, {1, 2, 3});
  REQUIRE(fake->held_bytes() > held_before);
  lose_the_device_by_injection(*ex);

  const unsigned long long unloads = fake->call_count(b.module_unload_entry);
  const unsigned long long resets =
      b.device_reset_entry != nullptr ? fake->call_count(b.device_reset_entry) : 0;
  a = Ndarray();
  ex.reset();
  CHECK(fake->held_bytes() == held_before);
  CHECK(fake->call_count(b.module_unload_entry) == unloads + 1);
  if (b.device_reset_entry != nullptr) CHECK(fake->call_count(b.device_reset_entry) == resets);
  CHECK(fake->call_count(b.alloc_entry) > 0);
}

namespace {

/// Sets the fake's KILN_FAKE_<API>_<suffix> variables to `settings` and resets it; unsets them
/// (and resets again) when it goes away, so later cases see one device.
class FakeSettings {
 public:
  FakeSettings(const GpuBackendCase &b, FakeGpu &fake,
               const std::vector<std::pair<std::string, std::string>> &settings)
      : fake_(fake) {
    std::string prefix = b.fake_prefix;  // kiln_fake_cuda_ -> KILN_FAKE_CUDA_
    std::transform(prefix.begin(), prefix.end(), prefix.begin(),
                   [](char c) { return static_cast<char>(std::toupper(static_cast<unsigned char>(c))); });
    for (const auto &[suffix, value] : settings) {
      names_.push_back(prefix + suffix);
      setenv(names_.back().c_str(), value.c_str(), 1);
    }
    fake_.reset();
  }
  ~FakeSettings() {
    for (const std::string &name : names_) unsetenv(name.c_str());
    fake_.reset();
  }
  FakeSettings(const FakeSettings &) = delete;
  FakeSettings &operator=(const FakeSettings &) = delete;

 private:
  FakeGpu &fake_;
  std::vector<std::string> names_;
};

}  // namespace

void two_devices_at_once(const GpuBackendCase &b) {
  FakeGpu *fake = b.fake_or_skip();
  if (fake == nullptr) return;
  const FakeSettings two(b, *fake, {{"DEVICES", "2"}, {"CAPACITY_MB", "512,128"}});
  ExecutorConfig config;
  config.backend = b.backend;
  config.device_heap_bytes = 1_MiB;
  auto first = value_or_throw(LlvmRuntimeExecutor::create(config));
  config.device_ordinal = 1;
  auto second = value_or_throw(LlvmRuntimeExecutor::create(config));
  CHECK(first->device().name() == std::string(b.name) + ":0");
  CHECK(second->device().name() == std::string(b.name) + ":1");

  // Ops on both, interleaved: each executor makes its own device current before each call.
  const std::vector<int64_t> shape{1000};
  Ndarray x0 = value_or_throw(first->ndarray(DataType::i64, shape));
  Ndarray x1 = value_or_throw(second->ndarray(DataType::i64, shape));
  REQUIRE(first->fill(x0, Scalar::of_int(2)));
  REQUIRE(second->fill(x1, Scalar::of_int(3)));
  REQUIRE(first->axpy(Scalar::of_int(1), x0, x0));
  CHECK(value_or_throw(first->reduce_sum(x0)).i64 == 4000);
  CHECK(value_or_throw(second->reduce_sum(x1)).i64 == 3000);
  const uint64_t held0 = fake->device_held_bytes(0);
  const uint64_t held1 = fake->device_held_bytes(1);
  CHECK(held0 > 0);
  CHECK(held1 > 0);

  // Out of memory on device 1 names it and its own figures (128 MiB); device 0 is untouched.
  const std::vector<int64_t> big{int64_t{200} << 17};  // 200 MiB of i64
  auto refused = second->ndarray(DataType::i64, big);
  REQUIRE_FALSE(refused);
  CHECK(is_out_of_memory(classify(refused.error())));
  const std::string message = refused.error().message();
  INFO(message);
  CHECK_THAT(message, Catch::Contains(std::string(b.name) + ":1"));
  // (the executor's own launch buffers, "argument_buffer 512 B, result_buffer 512.00 KiB", are
  // in what kiln holds: device 0's total, 512.00 MiB, must not be)
  CHECK_THAT(message, Catch::Contains("of 128.00 MiB") && !Catch::Contains("512.00 MiB"));
  CHECK(fake->device_held_bytes(0) == held0);
  CHECK(fake->device_held_bytes(1) == held1);
  // Device 0 (512 MiB) takes what device 1 refused.
  Ndarray on_first = value_or_throw(first->ndarray(DataType::i64, big));
  CHECK(fake->device_held_bytes(0) >= held0 + 200_MiB);
  CHECK(fake->device_held_bytes(1) == held1);
  REQUIRE(first->free(on_first));

  // There is no device 2 of 2.
  config.device_ordinal = 2;
  auto missing = LlvmRuntimeExecutor::create(config);
  REQUIRE_FALSE(missing);
  CHECK(classify(missing.error()) == ErrorKind::not_supported);
  CHECK_THAT(missing.error().message(),
             Catch::Contains("reports 2 device(s)") && Catch::Contains(std::string(b.name) + ":2"));
  REQUIRE(first->free(x0));
  REQUIRE(second->free(x1));
  first.reset();
  second.reset();
  CHECK(fake->held_bytes() == 0);
}

}  // namespace gpu_matrix
}  // namespace kiln::test
