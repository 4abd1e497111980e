// Memory another library owns (DLPack import): LlvmDevice::register_external and
// LlvmRuntimeExecutor::wrap_external. Kernels use it in place, nothing is charged to the ledger,
// the owner's release runs exactly once, and a refused wrap leaves the memory to its owner.
#include <catch2/catch.hpp>

#include <cstdint>
#include <span>
#include <vector>

#include "test_support.h"

using namespace kiln;
using namespace kiln::test;

namespace {
const int64_t kShape4[1] = {4};

uint64_t address_of(std::vector<float> &v) { return reinterpret_cast<uint64_t>(v.data()); }

/// Host floats another library owns, and how many times the owner's release ran.
struct Owner {
  std::vector<float> floats;
  int releases = 0;

  /// wrap_external of f32 `shape` at `address`, with this owner's release.
  RhiExpected<Ndarray> wrap_in(LlvmRuntimeExecutor &ex, uint64_t address, std::span<const int64_t> shape = kShape4) {
    return ex.wrap_external(DataType::f32, shape, address, [this] { ++releases; });
  }
};
}  // namespace

TEST_CASE("a wrapped external buffer is used in place and released once when the last handle goes",
          "[executor][external]") {
  auto ex = make_executor();
  const uint64_t ledger = ledger_bytes(*ex);
  const uint64_t live = ex->device().live_allocation_count();
  Owner owner{{1, 2, 3, 4}};
  {
    auto a = owner.wrap_in(*ex, address_of(owner.floats));
    REQUIRE(a);
    CHECK(*a->device_address("test") == address_of(owner.floats));
    CHECK(ledger_bytes(*ex) == ledger);  // not kiln's memory: not charged
    CHECK(ex->device().live_allocation_count() == live);
    REQUIRE(ex->fill(*a, Scalar::of(7.0)));
    CHECK(owner.floats == std::vector<float>{7, 7, 7, 7});
    Ndarray copy = *a;  // handles share the array: one release
  }
  CHECK(owner.releases == 1);
}

TEST_CASE("free of a wrapped buffer releases it once; a second free is InvalidUsage",
          "[executor][external]") {
  auto ex = make_executor();
  Owner owner{std::vector<float>(4, 0.0f)};
  auto a = owner.wrap_in(*ex, address_of(owner.floats));
  REQUIRE(a);
  REQUIRE(ex->free(*a));
  CHECK(owner.releases == 1);
  CHECK(classify(ex->free(*a).error()) == ErrorKind::invalid_usage);
  a = RhiExpected<Ndarray>(Ndarray());
  CHECK(owner.releases == 1);
}

TEST_CASE("a misaligned or null external address is InvalidUsage and is not released",
          "[executor][external][bad-input]") {
  auto ex = make_executor();
  Owner owner{std::vector<float>(8, 0.0f)};
  auto misaligned = owner.wrap_in(*ex, address_of(owner.floats) + 2);
  REQUIRE_FALSE(misaligned);
  CHECK(classify(misaligned.error()) == ErrorKind::invalid_usage);
  CHECK_THAT(misaligned.error().message(), Catch::Contains("not aligned"));
  auto null = owner.wrap_in(*ex, 0);
  REQUIRE_FALSE(null);
  CHECK(classify(null.error()) == ErrorKind::invalid_usage);
  CHECK_THAT(null.error().message(), Catch::Contains("null pointer") && !Catch::Contains("aligned"));
  const int64_t negative[1] = {-1};
  CHECK_FALSE(owner.wrap_in(*ex, address_of(owner.floats), negative));
  CHECK(owner.releases == 0);  // the caller still owns the memory
}

TEST_CASE("dealloc_memory refuses an external entry; unregister_external removes it",
          "[external]") {
  auto ex = make_executor();
  LlvmDevice &device = ex->device();
  std::vector<float> owner(4, 0.0f);
  auto alloc = device.register_external(address_of(owner), 16);
  REQUIRE(alloc);
  auto refused = device.dealloc_memory(*alloc);
  REQUIRE_FALSE(refused);
  CHECK(classify(refused.error()) == ErrorKind::invalid_usage);
  CHECK(*device.device_address(*alloc) == address_of(owner));  // still registered
  REQUIRE(device.unregister_external(*alloc));
  CHECK_FALSE(device.device_address(*alloc));
  CHECK_FALSE(device.unregister_external(*alloc));
  CHECK_FALSE(device.register_external(address_of(owner), 0));
}
