// OOM observers may not allocate on the memory they observe (DeviceMemory enforces it: the
// observer's thread is refused with invalid_usage, even for a block its own thread cache holds);
// they may free there and allocate elsewhere, and the thread's fast path comes back after them.
#include <catch2/catch.hpp>

#include <cstdint>
#include <optional>
#include <string>

#include "kiln/rhi/mock_device.h"
#include "kiln/runtime/memory/device_memory.h"
#include "memory_test_support.h"

using namespace kiln;
using namespace kiln::test::memory;

TEST_CASE("an OOM observer that allocates on its own memory is refused", "[observer][oom]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(64_MiB));
  auto victim = memory->allocate(MemoryCategory::ndarray, 48_MiB);
  REQUIRE(victim);
  // A small block in this thread's cache, freed last (lock-free, leaving the headroom to take it
  // again): a pool hit the fast path would serve without a lock.
  for (int i = 0; i < 2; ++i) {
    auto small = memory->allocate(MemoryCategory::ndarray, 1_KiB);
    REQUIRE(small);
    REQUIRE(memory->free(*small));
  }
  REQUIRE(memory->stats().lock_free_hits == 1);

  std::optional<RhiExpected<DeviceAllocation>> inside;
  const uint64_t id = memory->add_oom_observer([&](const Failure &) {
    inside = memory->allocate(MemoryCategory::ndarray, 1_KiB);
    REQUIRE(memory->free(*victim));  // freeing is what observers are for
  });
  auto big = memory->allocate(MemoryCategory::ndarray, 32_MiB);
  REQUIRE(big);  // the observer freed the victim: retried and granted
  REQUIRE(inside.has_value());
  REQUIRE_FALSE(*inside);
  const Failure &refused = inside->error();
  CHECK(refused.result == RhiResult::invalid_usage);
  CHECK(std::string_view(refused.site) == "DeviceMemory::check_not_observing");
  CHECK(refused.message().find("OOM observer") != std::string::npos);
  CHECK(memory->remove_oom_observer(id));

  // After the observers, this thread's pool hits are lock-free again (the first call binds the
  // thread's cache anew on the locked path).
  const uint64_t lock_free_before = memory->stats().lock_free_hits;
  for (int i = 0; i < 2; ++i) {
    auto again = memory->allocate(MemoryCategory::ndarray, 1_KiB);
    REQUIRE(again);
    REQUIRE(memory->free(*again));
  }
  CHECK(memory->stats().lock_free_hits == lock_free_before + 1);
  REQUIRE(memory->free(*big));
}

TEST_CASE("an OOM observer may allocate on another device's memory", "[observer][oom]") {
  MockDevice mock(mock_options(1_GiB));
  MockDevice other_mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(8_MiB));
  auto other = make_memory(other_mock, cached(8_MiB));
  std::optional<RhiExpected<DeviceAllocation>> elsewhere;
  const uint64_t id = memory->add_oom_observer(
      [&](const Failure &) { elsewhere = other->allocate(MemoryCategory::ndarray, 1_MiB); });
  CHECK_FALSE(memory->allocate(MemoryCategory::ndarray, 16_MiB));
  REQUIRE(elsewhere.has_value());
  REQUIRE(*elsewhere);
  REQUIRE(other->free(**elsewhere));
  CHECK(memory->remove_oom_observer(id));
  // Outside the observer this thread allocates on the observed memory as before.
  auto after = memory->allocate(MemoryCategory::ndarray, 1_MiB);
  REQUIRE(after);
  REQUIRE(memory->free(*after));
}

TEST_CASE("nested observers: A's observer refused on B, whose observer allocates on A",
          "[observer][oom]") {
  MockDevice mock_a(mock_options(1_GiB));
  MockDevice mock_b(mock_options(1_GiB));
  auto a = make_memory(mock_a, cached(8_MiB));
  auto b = make_memory(mock_b, cached(8_MiB));
  std::optional<RhiExpected<DeviceAllocation>> on_a_from_b;
  int a_calls = 0;
  const uint64_t id_a = a->add_oom_observer([&](const Failure &) {
    ++a_calls;
    CHECK_FALSE(b->allocate(MemoryCategory::ndarray, 16_MiB));  // refused on B: B's observer runs
  });
  const uint64_t id_b = b->add_oom_observer(
      [&](const Failure &) { on_a_from_b = a->allocate(MemoryCategory::ndarray, 1_MiB); });
  CHECK_FALSE(a->allocate(MemoryCategory::ndarray, 16_MiB));
  CHECK(a_calls == 1);  // never re-entered
  REQUIRE(on_a_from_b.has_value());
  REQUIRE_FALSE(*on_a_from_b);
  CHECK(on_a_from_b->error().result == RhiResult::invalid_usage);
  CHECK(std::string_view(on_a_from_b->error().site) == "DeviceMemory::check_not_observing");
  CHECK(a->remove_oom_observer(id_a));
  CHECK(b->remove_oom_observer(id_b));
}

TEST_CASE("a free inside an observer keeps the block in its thread's cache", "[observer][oom]") {
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(8_MiB));
  auto small = memory->allocate(MemoryCategory::ndarray, 1_KiB);
  REQUIRE(small);
  const uint64_t id = memory->add_oom_observer([&](const Failure &) { REQUIRE(memory->free(*small)); });
  CHECK_FALSE(memory->allocate(MemoryCategory::ndarray, 16_MiB));
  CHECK(memory->remove_oom_observer(id));
  // The freed block went to this thread's cache (not the shared pool): the retry after the
  // observer bound the fast path again, so the next allocation of its size is a lock-free hit.
  const uint64_t lock_free_before = memory->stats().lock_free_hits;
  auto again = memory->allocate(MemoryCategory::ndarray, 1_KiB);
  REQUIRE(again);
  CHECK(memory->stats().lock_free_hits == lock_free_before + 1);
  REQUIRE(memory->free(*again));
}

TEST_CASE("an OOM observer may not charge the memory it observes either", "[observer][oom]") {
  // A charge (JIT code objects) takes budget as an allocation does: refused inside an observer,
  // with nothing charged; uncharge and a charge after the observers are fine.
  MockDevice mock(mock_options(1_GiB));
  auto memory = make_memory(mock, cached(16_MiB));
  std::optional<RhiStatus> inside;
  const uint64_t id = memory->add_oom_observer([&](const Failure &) {
    inside = memory->charge(MemoryCategory::code_object, 1_KiB);
  });
  CHECK_FALSE(memory->allocate(MemoryCategory::ndarray, 32_MiB));
  REQUIRE(inside.has_value());
  REQUIRE_FALSE(*inside);
  CHECK(inside->error().result == RhiResult::invalid_usage);
  CHECK(std::string_view(inside->error().site) == "DeviceMemory::check_not_observing");
  CHECK(charged(*memory, MemoryCategory::code_object) == 0);
  CHECK(memory->remove_oom_observer(id));
  REQUIRE(memory->charge(MemoryCategory::code_object, 1_KiB));
  CHECK(charged(*memory, MemoryCategory::code_object) == 1_KiB);
  memory->uncharge(MemoryCategory::code_object, 1_KiB);
}
