// Devices as objects (DESIGN.md, "Devices are objects"): two executors of one process, on devices
// 0 and 1 of the fake CUDA driver and of the fake HIP runtime, share nothing a device owns. One
// device's budget refusal, sticky fault or launches leave the other as it was, and opening one
// device makes no driver context on the other. Each case runs once per fake driver.
#include <catch2/catch.hpp>

#include <barrier>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "fake_gpu_handle.h"
#include "test_support.h"

using namespace kiln;
using namespace kiln::test;

namespace {

/// One GPU backend and the names its fake driver gives what these tests use.
struct FakeBackend {
  Backend backend;
  const char *name;          ///< "cuda": its devices are "cuda:0", "cuda:1"
  const char *library;       ///< the fake's path
  const char *driver_env;    ///< the variable kiln's loader reads: KILN_CUDA_DRIVER, KILN_HIP_RUNTIME
  const char *prefix;        ///< the fake's control API prefix: "kiln_fake_cuda_"
  const char *devices_env;   ///< the fake's device count: KILN_FAKE_CUDA_DEVICES
  const char *launch_entry;  ///< cuLaunchKernel, hipModuleLaunchKernel
};

constexpr int kIllegalAddress = 700;  // CUDA_ERROR_ILLEGAL_ADDRESS, hipErrorIllegalAddress: sticky

const FakeBackend kFakeCuda{Backend::cuda,         "cuda",           KILN_FAKE_CUDA_LIBRARY,
                            "KILN_CUDA_DRIVER",    "kiln_fake_cuda_", "KILN_FAKE_CUDA_DEVICES",
                            "cuLaunchKernel"};
const FakeBackend kFakeHip{Backend::amdgpu,       "amdgpu",          KILN_FAKE_HIP_LIBRARY,
                           "KILN_HIP_RUNTIME",    "kiln_fake_hip_",  "KILN_FAKE_HIP_DEVICES",
                           "hipModuleLaunchKernel"};

/// The fake driver of `b` with two devices (1 GiB each), reset, kiln's loader pointed at it; one
/// device again, reset, when it goes away. Make it before the executors, so that it outlives them.
class TwoDeviceFake {
 public:
  explicit TwoDeviceFake(const FakeBackend &b) : b_(b), fake_(opened(b)) {
    setenv(b.driver_env, b.library, 1);  // other tests may point it elsewhere
    setenv(b.devices_env, "2", 1);
    fake_.reset();
  }
  ~TwoDeviceFake() {
    unsetenv(b_.devices_env);
    fake_.reset();
  }
  TwoDeviceFake(const TwoDeviceFake &) = delete;
  TwoDeviceFake &operator=(const TwoDeviceFake &) = delete;
  FakeGpu *operator->() const { return &fake_; }

 private:
  /// The fake's handle, opened once per process (dlopen refcounts it: kiln's loader shares it).
  static FakeGpu &opened(const FakeBackend &b) {
    static FakeGpu cuda = FakeGpu::open(kFakeCuda.library, kFakeCuda.driver_env, kFakeCuda.prefix);
    static FakeGpu hip = FakeGpu::open(kFakeHip.library, kFakeHip.driver_env, kFakeHip.prefix);
    return b.backend == Backend::cuda ? cuda : hip;
  }

  const FakeBackend &b_;
  FakeGpu &fake_;
};

/// An executor on device `ordinal` of `b` with a 1 MiB device heap and budget `limit_bytes`
/// (unset: the device's ceiling); throws the named error if it cannot be made.
std::unique_ptr<LlvmRuntimeExecutor> open_device(const FakeBackend &b, int ordinal,
                                                 std::optional<uint64_t> limit_bytes = std::nullopt) {
  ExecutorConfig config;
  config.backend = b.backend;
  config.device_ordinal = ordinal;
  config.device_heap_bytes = 1_MiB;
  config.budget.limit_bytes = limit_bytes;
  return value_or_throw(LlvmRuntimeExecutor::create(config));
}

/// "cuda:1": what kiln calls device `ordinal` of `b`.
std::string device_name(const FakeBackend &b, int ordinal) {
  return std::string(b.name) + ":" + std::to_string(ordinal);
}

}  // namespace

TEST_CASE("two devices' executors in one process each refuse at their own budget only",
          "[devices][budget]") {
  const FakeBackend &b = *GENERATE(&kFakeCuda, &kFakeHip);
  INFO(b.name);
  TwoDeviceFake fake(b);
  // Both budgets 48 MiB. Each executor's own buffers, heap and code take a few MiB of it, so
  // one 24 MiB array fits a device and a second does not. Were the budget (or its ledger) shared,
  // device 1's array would leave device 0 no room for its own.
  constexpr uint64_t kLimitBytes = 48_MiB;
  const int64_t k24MiB[1] = {int64_t{6} << 20};  // f32
  auto ex0 = open_device(b, 0, kLimitBytes);
  auto ex1 = open_device(b, 1, kLimitBytes);
  REQUIRE(ex0->memory().limit_bytes() == kLimitBytes);
  REQUIRE(ex1->memory().limit_bytes() == kLimitBytes);
  REQUIRE(ex0->memory().in_use_bytes() < 24_MiB);
  REQUIRE(ex1->memory().in_use_bytes() < 24_MiB);

  Ndarray on1 = value_or_throw(ex1->ndarray(DataType::f32, k24MiB));
  const size_t held0 = fake->device_held_bytes(0);
  const uint64_t in_use0 = ex0->memory().in_use_bytes();
  auto refused1 = ex1->ndarray(DataType::f32, k24MiB);
  REQUIRE_FALSE(refused1);
  CHECK(classify(refused1.error()) == ErrorKind::budget_exceeded);
  CHECK(refused1.error().oom_source == OomSource::budget);
  CHECK(refused1.error().device == device_name(b, 1));
  CHECK(fake->device_held_bytes(0) == held0);  // device 1's refusal asked nothing of device 0
  CHECK(ex0->memory().in_use_bytes() == in_use0);

  // Device 0 allocates, launches and reads back with device 1 at its limit.
  Ndarray on0 = value_or_throw(ex0->ndarray(DataType::f32, k24MiB));
  REQUIRE(ex0->fill(on0, Scalar::of(2.0)));
  CHECK(value_or_throw(ex0->reduce_sum(on0)).f64 == 2.0 * static_cast<double>(k24MiB[0]));

  // And the other way round: device 0 at its limit refuses, device 1 goes on once it has room.
  auto refused0 = ex0->ndarray(DataType::f32, k24MiB);
  REQUIRE_FALSE(refused0);
  CHECK(classify(refused0.error()) == ErrorKind::budget_exceeded);
  CHECK(refused0.error().device == device_name(b, 0));
  REQUIRE(ex1->free(on1));
  Ndarray again1 = value_or_throw(ex1->ndarray(DataType::f32, k24MiB));
  REQUIRE(ex1->fill(again1, Scalar::of(3.0)));
  CHECK(value_or_throw(ex1->reduce_sum(again1)).f64 == 3.0 * static_cast<double>(k24MiB[0]));
  CHECK(value_or_throw(ex0->reduce_sum(on0)).f64 == 2.0 * static_cast<double>(k24MiB[0]));
}

TEST_CASE("a sticky fault on device 1 loses executor 1 only: executor 0 allocates, launches and "
          "reads back, before and after executor 1 lets go",
          "[devices][lost]") {
  const FakeBackend &b = *GENERATE(&kFakeCuda, &kFakeHip);
  INFO(b.name);
  TwoDeviceFake fake(b);
  auto ex0 = open_device(b, 0);
  auto ex1 = open_device(b, 1);
  Ndarray x0 = upload<float>(*ex0, DataType::f32, {1, 2, 3, 4});
  Ndarray x1 = upload<float>(*ex1, DataType::f32, {1, 2, 3, 4});

  REQUIRE(fake->inject_fault(b.launch_entry, 1, kIllegalAddress) == 0);  // the next launch: on 1
  auto faulted = ex1->fill(x1, Scalar::of(5.0));
  REQUIRE_FALSE(faulted);
  CHECK(classify(faulted.error()) == ErrorKind::device_lost);
  CHECK(faulted.error().device == device_name(b, 1));
  CHECK(ex1->device().is_lost());
  CHECK(fake->device_sticky_error(1) == kIllegalAddress);
  CHECK(fake->device_sticky_error(0) == 0);

  // Executor 0 works on: a new array, launches, reads.
  CHECK_FALSE(ex0->device().is_lost());
  Ndarray y0 = upload<float>(*ex0, DataType::f32, {10, 20, 30, 40});
  REQUIRE(ex0->fill(x0, Scalar::of(2.0)));
  REQUIRE(ex0->axpy(Scalar::of(3.0), x0, y0));
  CHECK(download<float>(*ex0, y0) == std::vector<float>{16, 26, 36, 46});
  CHECK(value_or_throw(ex0->reduce_sum(y0)).f64 == 124.0);
  CHECK(fake->device_sticky_error(0) == 0);

  // Executor 1 stays lost.
  const int64_t shape[1] = {4};
  auto later = ex1->ndarray(DataType::f32, shape);
  REQUIRE_FALSE(later);
  CHECK(classify(later.error()) == ErrorKind::device_lost);

  // Letting executor 1 go destroys device 1's context (CUDA: its last release; HIP:
  // hipDeviceReset after hipSetDevice(1), with device 0 current on this thread before): device
  // 0 keeps its memory and its arrays' contents.
  const size_t held0 = fake->device_held_bytes(0);
  x1 = Ndarray();
  ex1.reset();
  CHECK(fake->device_sticky_error(1) == 0);
  CHECK(fake->device_held_bytes(0) == held0);
  CHECK(download<float>(*ex0, y0) == std::vector<float>{16, 26, 36, 46});
  REQUIRE(ex0->fill(x0, Scalar::of(1.0)));
  CHECK(value_or_throw(ex0->reduce_sum(x0)).f64 == 4.0);

  // Device 1 recovers with a new executor.
  ex1 = open_device(b, 1);
  Ndarray z1 = upload<float>(*ex1, DataType::f32, {1, 2, 3});
  CHECK(value_or_throw(ex1->reduce_sum(z1)).f64 == 6.0);
}

TEST_CASE("two threads launch on two devices' executors at once and both make progress",
          "[devices]") {
  const FakeBackend &b = *GENERATE(&kFakeCuda, &kFakeHip);
  INFO(b.name);
  TwoDeviceFake fake(b);
  std::unique_ptr<LlvmRuntimeExecutor> executors[2] = {open_device(b, 0), open_device(b, 1)};
  const unsigned long long launches_before[2] = {fake->device_launch_count(0),
                                                 fake->device_launch_count(1)};

  // Each round, each thread fills its array and sums it (launches on its own device), then waits
  // for the other: neither can be a round ahead, so the two run at once whatever the scheduler
  // does. A thread that fails drops out of the barrier, so the other never waits for it.
  constexpr int kRounds = 8;
  constexpr int64_t kElements = 4096;
  std::barrier round_end(2);
  struct Progress {
    int rounds_done = 0;
    std::string failure;  // Catch2 assertions are not thread-safe: checked after the join
  };
  Progress progress[2];
  const auto work = [&](int d) {
    LlvmRuntimeExecutor &ex = *executors[d];
    Progress &p = progress[d];
    const int64_t shape[1] = {kElements};
    auto x = ex.ndarray(DataType::i64, shape);
    for (int round = 0; round < kRounds && p.failure.empty(); ++round) {
      // One value per device and round: a launch on the other device, or a stale result, shows.
      const int64_t value = (d + 1) * 1000 + round;
      RhiStatus filled = x ? ex.fill(*x, Scalar::of_int(value)) : RhiStatus(std::unexpected(x.error()));
      RhiExpected<Scalar> sum = filled ? ex.reduce_sum(*x) : std::unexpected(filled.error());
      if (!sum) p.failure = sum.error().message();
      else if (sum->i64 != kElements * value)
        p.failure = "round " + std::to_string(round) + " summed " + std::to_string(sum->i64);
      else
        ++p.rounds_done;
      if (!p.failure.empty()) round_end.arrive_and_drop();
      else round_end.arrive_and_wait();
    }
  };
  {
    std::jthread first(work, 0), second(work, 1);
  }
  for (int d = 0; d < 2; ++d) {
    INFO("device " << d);
    CHECK(progress[d].failure == "");
    CHECK(progress[d].rounds_done == kRounds);
    // A fill and at least one reduction launch per round, each on its own device.
    CHECK(fake->device_launch_count(d) - launches_before[d] >= 2 * kRounds);
  }
}

TEST_CASE("opening device 1 of 2 makes no driver context on device 0", "[devices]") {
  const FakeBackend &b = *GENERATE(&kFakeCuda, &kFakeHip);
  INFO(b.name);
  TwoDeviceFake fake(b);
  {
    auto ex1 = open_device(b, 1);
    Ndarray x = upload<float>(*ex1, DataType::f32, {1, 2, 3});
    REQUIRE(ex1->fill(x, Scalar::of(4.0)));
    CHECK(value_or_throw(ex1->reduce_sum(x)).f64 == 12.0);
    CHECK(fake->device_contexts(1) == 1);
    CHECK(fake->device_contexts(0) == 0);
    CHECK(fake->device_held_bytes(0) == 0);
    CHECK(fake->device_launch_count(0) == 0);
  }
  CHECK(fake->device_contexts(0) == 0);  // nor did its teardown make one
  // The count does count: opening device 0 makes its context.
  auto ex0 = open_device(b, 0);
  CHECK(fake->device_contexts(0) == 1);
}
