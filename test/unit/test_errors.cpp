// The one mapping from RhiResult + detail to named errors, and the messages.
#include <catch2/catch.hpp>

#include "kiln/executor/errors.h"

using namespace kiln;

namespace {
Failure oom(OomSource source) {
  Failure f = make_failure(RhiResult::out_of_memory, "cuda:0", "cuMemAlloc_v2", "");
  f.oom_source = source;
  f.requested_bytes = 4ull << 30;
  f.driver_status = "CUDA_ERROR_OUT_OF_MEMORY";
  return f;
}

template <class E>
void check_throws_as(Failure f, ErrorKind kind) {
  try {
    throw_error(f);
  } catch (const E &e) {
    CHECK(e.kind() == kind);
    Failure advised = f;  // what() advises with the C++ API's knobs
    advise(advised, kCppKnobs);
    CHECK(std::string(e.what()) == advised.message());
    CHECK(e.failure().advice == advised.advice);
    CHECK(e.failure().requested_bytes == f.requested_bytes);
    return;
  } catch (...) {
  }
  FAIL("throw_error did not throw " << error_name(kind));
}
}  // namespace

TEST_CASE("each out-of-memory source maps to its own named error", "[errors]") {
  CHECK(classify(oom(OomSource::driver)) == ErrorKind::device_out_of_memory);
  CHECK(classify(oom(OomSource::budget)) == ErrorKind::budget_exceeded);
  CHECK(classify(oom(OomSource::device_heap)) == ErrorKind::device_heap_exhausted);
  CHECK(classify(oom(OomSource::host)) == ErrorKind::host_out_of_memory);
  for (auto kind : {ErrorKind::device_out_of_memory, ErrorKind::budget_exceeded,
                    ErrorKind::device_heap_exhausted, ErrorKind::host_out_of_memory})
    CHECK(is_out_of_memory(kind));
}

TEST_CASE("each other RhiResult maps to exactly one named error", "[errors]") {
  CHECK(classify(make_failure(RhiResult::invalid_usage, "cpu", "x", "bad")) == ErrorKind::invalid_usage);
  CHECK(classify(make_failure(RhiResult::not_supported, "cpu", "x", "no")) == ErrorKind::not_supported);
  CHECK(classify(make_failure(RhiResult::device_lost, "cpu", "x", "lost")) == ErrorKind::device_lost);
  CHECK(classify(make_failure(RhiResult::error, "cpu", "x", "?")) == ErrorKind::runtime_error);
  CHECK_FALSE(is_out_of_memory(ErrorKind::invalid_usage));
  CHECK_FALSE(is_out_of_memory(ErrorKind::device_lost));
}

TEST_CASE("throw_error throws the named class, and every OOM kind is an OutOfMemoryError", "[errors]") {
  check_throws_as<DeviceOutOfMemoryError>(oom(OomSource::driver), ErrorKind::device_out_of_memory);
  check_throws_as<BudgetExceededError>(oom(OomSource::budget), ErrorKind::budget_exceeded);
  check_throws_as<DeviceHeapExhaustedError>(oom(OomSource::device_heap), ErrorKind::device_heap_exhausted);
  check_throws_as<HostOutOfMemoryError>(oom(OomSource::host), ErrorKind::host_out_of_memory);
  for (auto source : {OomSource::driver, OomSource::budget, OomSource::device_heap, OomSource::host})
    check_throws_as<OutOfMemoryError>(oom(source), classify(oom(source)));
  check_throws_as<InvalidUsageError>(make_failure(RhiResult::invalid_usage, "cpu", "s", "d"),
                                     ErrorKind::invalid_usage);
  check_throws_as<NotSupportedError>(make_failure(RhiResult::not_supported, "cpu", "s", "d"),
                                     ErrorKind::not_supported);
  check_throws_as<DeviceLostError>(make_failure(RhiResult::device_lost, "cpu", "s", "d"),
                                   ErrorKind::device_lost);
  check_throws_as<RuntimeFaultError>(make_failure(RhiResult::error, "cpu", "s", "d"),
                                     ErrorKind::runtime_error);
}

TEST_CASE("a driver out-of-memory message names the bytes, the driver status and what to do", "[errors]") {
  Failure f = oom(OomSource::driver);
  f.detail = "ndarray f32[1073741824]";
  f.has_memory = true;
  f.memory.free_bytes = 3ull << 30;
  f.memory.total_bytes = 80ull << 30;
  f.memory.device_read = true;
  f.memory.in_use_bytes[static_cast<int>(MemoryCategory::ndarray)] = 70ull << 30;
  f.add_context("running axpy");
  const std::string m = describe(f);
  CHECK_THAT(m, Catch::StartsWith("DeviceOutOfMemoryError: cuda:0 could not allocate 4.00 GiB for ndarray f32[1073741824]"));
  CHECK_THAT(m, Catch::Contains("CUDA_ERROR_OUT_OF_MEMORY") && Catch::Contains("3.00 GiB free of 80.00 GiB") &&
                    Catch::Contains("ndarray 70.00 GiB") && Catch::Contains("KILN_POOL_LIMIT_MB") &&
                    Catch::Contains("while running axpy"));
}

TEST_CASE("a budget refusal's message says how old a reused device reading is", "[errors]") {
  Failure f = oom(OomSource::budget);
  f.has_memory = true;
  f.memory.free_bytes = 3ull << 30;
  f.memory.total_bytes = 80ull << 30;
  f.memory.device_read = true;
  f.memory.limit_bytes = 1ull << 30;
  CHECK_THAT(f.message(), Catch::Contains("3.00 GiB free of 80.00 GiB;") &&
                              !Catch::Contains("ms before"));
  f.memory.live_age_ms = 4;
  CHECK_THAT(f.message(), Catch::Contains("3.00 GiB free of 80.00 GiB (read up to 4 ms before);"));
}

TEST_CASE("value_or_throw returns the value or throws the named error", "[errors]") {
  CHECK(value_or_throw(RhiExpected<int>(7)) == 7);
  CHECK_THROWS_AS(value_or_throw(RhiExpected<int>(std::unexpected(oom(OomSource::budget)))),
                  BudgetExceededError);
  CHECK_THROWS_AS(value_or_throw(RhiStatus(std::unexpected(make_failure(RhiResult::invalid_usage, "", "", "x")))),
                  InvalidUsageError);
}

TEST_CASE("format_bytes picks a readable unit", "[errors]") {
  CHECK(format_bytes(64) == "64 B");
  CHECK(format_bytes(512ull << 20) == "512.00 MiB");
  CHECK(format_bytes(4ull << 30) == "4.00 GiB");
}

TEST_CASE("every message ends its first part with the site that refused", "[errors]") {
  Failure budget = oom(OomSource::budget);
  budget.site = "MemoryBudget::reserve";
  CHECK_THAT(budget.message(), Catch::Contains("[at MemoryBudget::reserve]"));
  const Failure lost = make_failure(RhiResult::device_lost, "cuda:0", "cuLaunchKernel", "fault");
  CHECK_THAT(lost.message(), Catch::Contains("[at cuLaunchKernel]"));
  Failure no_site = make_failure(RhiResult::error, "cpu", "", "x");
  CHECK_THAT(no_site.message(), !Catch::Contains("[at"));
}

TEST_CASE("device-heap exhaustion advises the heap's size, never the budget's knob", "[errors]") {
  Failure f = oom(OomSource::device_heap);
  f.category = MemoryCategory::runtime_heap;
  f.driver_status = "";
  f.has_memory = true;
  f.memory.limit_bytes = 1ull << 30;
  const std::string m = f.message();
  CAPTURE(m);
  CHECK_THAT(m, !Catch::Contains("KILN_POOL_LIMIT_MB") && !Catch::Contains("free arrays"));
  CHECK_THAT(m, Catch::Contains("heap"));
}

TEST_CASE("a refusal by live free memory gives the free bytes, the reserve and what is usable",
          "[errors]") {
  Failure f = oom(OomSource::budget);
  f.driver_status = "";
  f.requested_bytes = 80ull << 20;
  f.has_memory = true;
  f.memory.free_bytes = 100ull << 20;
  f.memory.total_bytes = 1ull << 30;
  f.memory.device_read = true;
  f.budget_check = BudgetCheck::live_free;
  f.memory.reserve_bytes = 40ull << 20;  // only live refusals carry a reserve
  f.memory.limit_bytes = 1ull << 30;     // the limit had room: it did not refuse
  const std::string m = f.message();
  CAPTURE(m);
  // The figures that explain the decision: 80 MiB > 100 MiB free - 40 MiB reserve = 60 MiB.
  CHECK_THAT(m, Catch::Contains(format_bytes(40ull << 20)) && Catch::Contains(format_bytes(60ull << 20)));
  f.budget_check = BudgetCheck::limit;  // a limit refusal: the budget's room is what explains it
  f.memory.reserve_bytes = 0;
  f.memory.in_use_bytes[static_cast<int>(MemoryCategory::ndarray)] = 1000ull << 20;
  CHECK_THAT(f.message(), Catch::Contains(format_bytes(24ull << 20)));  // 1 GiB - 1000 MiB left
}

TEST_CASE("format_bytes moves to the next unit at exactly 1024", "[errors]") {
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1.00 KiB");
  CHECK(format_bytes(1ull << 20) == "1.00 MiB");
  CHECK(format_bytes(1ull << 30) == "1.00 GiB");
}
