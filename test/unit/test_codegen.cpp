// The device runtime module, JIT-compiled for the host: every kernel for every dtype against a
// host reference, the device heap allocator and its errors, the JIT's lookup errors, and the
// CPU thread pool.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "kiln/rhi/result.h"
#include "kiln/runtime/cpu_jit.h"
#include "kiln/runtime/embedded_code.h"
#include "kiln/runtime/kernel_abi.h"
#include "kiln/runtime/thread_pool.h"

using kiln::RhiResult;
using kiln::runtime::CpuJit;
using kiln::runtime::ThreadPool;

namespace {

CpuJit &shared_jit() {
  static std::unique_ptr<CpuJit> jit = [] {
    auto created = CpuJit::create();
    if (!created) FAIL("CpuJit::create failed: " << created.error().detail);
    return std::move(created).value();
  }();
  return *jit;
}

template <class T>
std::string dtype_name() {
  if constexpr (std::is_same_v<T, float>) return "f32";
  if constexpr (std::is_same_v<T, double>) return "f64";
  if constexpr (std::is_same_v<T, int32_t>) return "i32";
  if constexpr (std::is_same_v<T, int64_t>) return "i64";
}

template <class T>
KilnKernelFn kernel(const std::string &op) {
  auto fn = shared_jit().lookup_kernel("kiln_" + op + "_" + dtype_name<T>());
  REQUIRE(fn);
  return *fn;
}

template <class T>
uint64_t address_of(T *ptr) {
  return reinterpret_cast<uint64_t>(ptr);
}

template <class T>
void set_scalar(KilnKernelArgs *args, double value) {
  if constexpr (std::is_floating_point_v<T>) {
    args->scalar_f64 = value;
  } else {
    args->scalar_i64 = static_cast<int64_t>(value);
  }
}

/// Runs `fn` on [0, num_elements) split into `num_tasks` contiguous chunks, on the pool.
void launch(KilnKernelFn fn, KilnRuntime *rt, KilnKernelArgs *args, int64_t num_elements,
            int64_t num_tasks) {
  args->num_tasks = num_tasks;
  static ThreadPool pool(4);
  pool.parallel_for(num_tasks, [&](int64_t task) {
    const int64_t begin = num_elements * task / num_tasks;
    const int64_t end = num_elements * (task + 1) / num_tasks;
    fn(rt, args, begin, end, task);
  });
}

/// Wrapping reference arithmetic, mirroring the device runtime's.
template <class T>
T ref_axpy(T alpha, T x, T y) {
  if constexpr (std::is_floating_point_v<T>) {
    return alpha * x + y;
  } else {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(alpha) * static_cast<U>(x) + static_cast<U>(y));
  }
}

template <class T>
std::vector<T> iota_values(int64_t n, int64_t offset) {
  std::vector<T> values(n);
  for (int64_t i = 0; i < n; ++i) values[i] = static_cast<T>(i + offset);
  return values;
}

struct HostHeap {
  explicit HostHeap(uint64_t size_bytes) : storage(size_bytes / 8 + 16) {
    rt.heap_base = (address_of(storage.data()) + 63) & ~uint64_t{63};
    rt.heap_size_bytes = size_bytes;
  }
  std::vector<uint64_t> storage;
  KilnRuntime rt{};
};

}  // namespace

TEST_CASE("the embedded host runtime is LLVM bitcode", "[codegen]") {
  const auto bytes = kiln::runtime::host_runtime_bitcode();
  REQUIRE(bytes.size() > 4);
  CHECK(bytes[0] == 'B');
  CHECK(bytes[1] == 'C');
  CHECK(bytes[2] == 0xC0);
  CHECK(bytes[3] == 0xDE);
}

TEST_CASE("the JIT compiles the runtime eagerly and reports its code size", "[codegen]") {
  CHECK(shared_jit().code_size_bytes() > 0);
}

TEST_CASE("CpuJit::create is safe from several threads", "[codegen]") {
  std::atomic<int> created{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&] {
      auto jit = CpuJit::create();
      if (jit && (*jit)->lookup_kernel("kiln_fill_f32")) ++created;
    });
  }
  for (auto &thread : threads) thread.join();
  CHECK(created == 2);
}

TEST_CASE("an unknown kernel name is invalid usage", "[codegen]") {
  for (const char *name : {"kiln_fill_f16", "kiln_axpy", "", "runtime_memory_allocate_aligned"}) {
    auto fn = shared_jit().lookup_kernel(name);
    REQUIRE_FALSE(fn);
    CHECK(fn.error().result == RhiResult::invalid_usage);
    CHECK(fn.error().device == "cpu");
    CHECK(std::string(fn.error().site) == "CpuJit::lookup_kernel");
    CHECK(fn.error().detail.find("'" + std::string(name) + "'") != std::string::npos);
  }
}

TEMPLATE_TEST_CASE("fill writes the scalar over [begin, end)", "[codegen]", float, double, int32_t,
                   int64_t) {
  std::vector<TestType> out(103, TestType(-1));
  KilnKernelArgs args{};
  args.ptr[0] = address_of(out.data());
  set_scalar<TestType>(&args, 42);
  KilnRuntime rt{};
  launch(kernel<TestType>("fill"), &rt, &args, 100, 3);  // leaves the last 3 untouched
  for (int i = 0; i < 100; ++i) REQUIRE(out[i] == TestType(42));
  for (int i = 100; i < 103; ++i) REQUIRE(out[i] == TestType(-1));
  CHECK(rt.error_code == KILN_DEVICE_OK);
}

TEMPLATE_TEST_CASE("copy copies src to dst", "[codegen]", float, double, int32_t, int64_t) {
  const auto src = iota_values<TestType>(77, -30);
  std::vector<TestType> dst(77, TestType(0));
  KilnKernelArgs args{};
  args.ptr[0] = address_of(dst.data());
  args.ptr[1] = address_of(src.data());
  KilnRuntime rt{};
  launch(kernel<TestType>("copy"), &rt, &args, 77, 4);
  CHECK(dst == src);
}

TEMPLATE_TEST_CASE("axpy computes y = alpha * x + y", "[codegen]", float, double, int32_t,
                   int64_t) {
  const auto x = iota_values<TestType>(65, -20);
  auto y = iota_values<TestType>(65, 5);
  const auto y_before = y;
  KilnKernelArgs args{};
  args.ptr[0] = address_of(y.data());
  args.ptr[1] = address_of(x.data());
  set_scalar<TestType>(&args, 3);
  KilnRuntime rt{};
  launch(kernel<TestType>("axpy"), &rt, &args, 65, 2);
  for (int i = 0; i < 65; ++i) REQUIRE(y[i] == ref_axpy<TestType>(3, x[i], y_before[i]));
}

TEMPLATE_TEST_CASE("integer axpy wraps on overflow", "[codegen]", int32_t, int64_t) {
  const TestType big = std::numeric_limits<TestType>::max();
  std::vector<TestType> x{big, big - 1, std::numeric_limits<TestType>::min(), 7};
  std::vector<TestType> y{big, 1, -1, 0};
  const auto y_before = y;
  KilnKernelArgs args{};
  args.ptr[0] = address_of(y.data());
  args.ptr[1] = address_of(x.data());
  args.scalar_i64 = 5;
  KilnRuntime rt{};
  launch(kernel<TestType>("axpy"), &rt, &args, 4, 1);
  for (int i = 0; i < 4; ++i) REQUIRE(y[i] == ref_axpy<TestType>(5, x[i], y_before[i]));
}

TEMPLATE_TEST_CASE("reduce_sum writes one partial per task", "[codegen]", float, double, int32_t,
                   int64_t) {
  const auto x = iota_values<TestType>(90, -17);
  std::vector<KilnTaskResult> slots(3, KilnTaskResult{});
  KilnKernelArgs args{};
  args.ptr[0] = address_of(x.data());
  args.result_buffer = address_of(slots.data());
  KilnRuntime rt{};
  launch(kernel<TestType>("reduce_sum"), &rt, &args, 90, 3);
  for (int task = 0; task < 3; ++task) {
    int64_t expected = 0;
    for (int i = task * 30; i < (task + 1) * 30; ++i) expected += static_cast<int64_t>(x[i]);
    if constexpr (std::is_floating_point_v<TestType>) {
      CHECK(std::bit_cast<double>(slots[task].value_bits) == static_cast<double>(expected));
    } else {
      CHECK(std::bit_cast<int64_t>(slots[task].value_bits) == expected);
    }
  }
}

TEST_CASE("reduce_sum of i32 accumulates in 64 bits", "[codegen]") {
  const std::vector<int32_t> x(4, std::numeric_limits<int32_t>::max());
  KilnTaskResult slot{};
  KilnKernelArgs args{};
  args.ptr[0] = address_of(x.data());
  args.result_buffer = address_of(&slot);
  KilnRuntime rt{};
  launch(kernel<int32_t>("reduce_sum"), &rt, &args, 4, 1);
  CHECK(std::bit_cast<int64_t>(slot.value_bits) == 4 * int64_t{std::numeric_limits<int32_t>::max()});
}

TEMPLATE_TEST_CASE("matmul 5x7x3 matches the host reference", "[codegen]", float, double, int32_t,
                   int64_t) {
  const int m = 5, n = 7, k = 3;
  const auto a = iota_values<TestType>(m * k, -4);
  const auto b = iota_values<TestType>(k * n, -9);
  std::vector<TestType> c(m * n, TestType(99));  // garbage the kernel must overwrite
  KilnKernelArgs args{};
  args.ptr[0] = address_of(c.data());
  args.ptr[1] = address_of(a.data());
  args.ptr[2] = address_of(b.data());
  args.dims[0] = m;
  args.dims[1] = n;
  args.dims[2] = k;
  KilnRuntime rt{};
  launch(kernel<TestType>("matmul"), &rt, &args, m, 2);
  for (int i = 0; i < m; ++i) {
    for (int j = 0; j < n; ++j) {
      TestType expected = 0;
      for (int p = 0; p < k; ++p) expected += a[i * k + p] * b[p * n + j];
      REQUIRE(c[i * n + j] == expected);
    }
  }
}

TEMPLATE_TEST_CASE("compact_positive keeps positive elements in order", "[codegen]", float, double,
                   int32_t, int64_t) {
  std::vector<TestType> x(40);
  for (int i = 0; i < 40; ++i) x[i] = static_cast<TestType>((i * 7) % 11 - 5);
  for (int i = 30; i < 40; ++i) x[i] = static_cast<TestType>(-i);  // task 3 keeps nothing
  HostHeap heap(4096);
  std::vector<KilnTaskResult> slots(4, KilnTaskResult{});
  KilnKernelArgs args{};
  args.ptr[0] = address_of(x.data());
  args.num_elements = 40;
  args.result_buffer = address_of(slots.data());
  launch(kernel<TestType>("compact_positive"), &heap.rt, &args, 40, 4);

  REQUIRE(heap.rt.error_code == KILN_DEVICE_OK);
  std::vector<TestType> expected, actual;
  std::copy_if(x.begin(), x.end(), std::back_inserter(expected), [](TestType v) { return v > 0; });
  for (const KilnTaskResult &slot : slots) {
    if (slot.count == 0) {
      CHECK(slot.address == 0);
      continue;
    }
    CHECK(slot.address % 64 == 0);
    CHECK(slot.address >= heap.rt.heap_base);
    CHECK(slot.address + slot.count * sizeof(TestType) <= heap.rt.heap_base + heap.rt.heap_used_bytes);
    const auto *block = reinterpret_cast<const TestType *>(slot.address);
    actual.insert(actual.end(), block, block + slot.count);
  }
  CHECK(slots[3].count == 0);
  CHECK(actual == expected);
}

TEST_CASE("compact_positive with a too-small heap records heap exhaustion", "[codegen]") {
  const std::vector<int64_t> x(10, 3);
  HostHeap heap(16);
  KilnTaskResult slot{};
  KilnKernelArgs args{};
  args.ptr[0] = address_of(x.data());
  args.num_elements = 10;
  args.result_buffer = address_of(&slot);
  launch(kernel<int64_t>("compact_positive"), &heap.rt, &args, 10, 1);
  CHECK(heap.rt.error_code == KILN_DEVICE_HEAP_EXHAUSTED);
  CHECK(heap.rt.error_arg0 == 80);
  CHECK(heap.rt.error_arg1 == 0);
  CHECK(heap.rt.error_arg2 == 16);
  CHECK(std::string(heap.rt.error_message).find("exhausted") != std::string::npos);
  CHECK(slot.address == 0);
  CHECK(slot.count == 0);
  CHECK(heap.rt.heap_used_bytes == 0);
}

TEST_CASE("the heap allocator aligns, bumps and reports exhaustion", "[codegen]") {
  auto allocate = shared_jit().lookup_heap_allocator();
  REQUIRE(allocate);
  HostHeap heap(256);
  uint64_t result = 0xDEADBEEF;

  (*allocate)(&heap.rt, 10, 8, &result);
  CHECK(result == heap.rt.heap_base);
  (*allocate)(&heap.rt, 16, 64, &result);
  CHECK(result == heap.rt.heap_base + 64);
  CHECK(heap.rt.heap_used_bytes == 80);
  CHECK(heap.rt.error_code == KILN_DEVICE_OK);

  result = 0xDEADBEEF;  // a failed call must clear stale contents
  (*allocate)(&heap.rt, 200, 8, &result);
  CHECK(result == 0);
  CHECK(heap.rt.error_code == KILN_DEVICE_HEAP_EXHAUSTED);
  CHECK(heap.rt.error_arg0 == 200);
  CHECK(heap.rt.error_arg1 == 80);
  CHECK(heap.rt.error_arg2 == 256);
  CHECK(heap.rt.heap_used_bytes == 80);
  CHECK(std::strlen(heap.rt.error_message) < sizeof(heap.rt.error_message));

  SECTION("the first error wins") {
    (*allocate)(&heap.rt, 8, 3, &result);
    CHECK(result == 0);
    CHECK(heap.rt.error_code == KILN_DEVICE_HEAP_EXHAUSTED);
    CHECK(heap.rt.error_arg0 == 200);
  }
}

TEST_CASE("the heap allocator rejects an alignment that is not a power of two", "[codegen]") {
  auto allocate = shared_jit().lookup_heap_allocator();
  REQUIRE(allocate);
  for (uint64_t alignment : {uint64_t{0}, uint64_t{3}, uint64_t{96}}) {
    HostHeap heap(256);
    uint64_t result = 0xDEADBEEF;
    (*allocate)(&heap.rt, 8, alignment, &result);
    CHECK(result == 0);
    CHECK(heap.rt.error_code == KILN_DEVICE_BAD_ALIGNMENT);
    CHECK(heap.rt.error_arg0 == alignment);
    CHECK(heap.rt.heap_used_bytes == 0);
  }
}

TEST_CASE("concurrent heap allocations never overlap", "[codegen]") {
  auto allocate = shared_jit().lookup_heap_allocator();
  REQUIRE(allocate);
  const int64_t num_tasks = 256;
  HostHeap heap(num_tasks * 24);
  std::vector<uint64_t> results(num_tasks, 0);
  ThreadPool pool(4);
  pool.parallel_for(num_tasks, [&](int64_t task) { (*allocate)(&heap.rt, 24, 8, &results[task]); });
  CHECK(heap.rt.error_code == KILN_DEVICE_OK);
  CHECK(heap.rt.heap_used_bytes == num_tasks * 24);
  std::sort(results.begin(), results.end());
  for (int64_t i = 0; i < num_tasks; ++i) REQUIRE(results[i] == heap.rt.heap_base + 24 * i);
}

TEST_CASE("the thread pool runs every task exactly once", "[codegen]") {
  ThreadPool pool(4);
  CHECK(pool.num_threads() == 4);
  for (int64_t num_tasks : {0, 1, 3, 1000}) {
    std::vector<std::atomic<int>> runs(num_tasks);
    pool.parallel_for(num_tasks, [&](int64_t task) { ++runs[task]; });
    for (int64_t i = 0; i < num_tasks; ++i) REQUIRE(runs[i] == 1);
  }
}

TEST_CASE("the thread pool serializes concurrent callers and runs nested calls inline",
          "[codegen]") {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> runs(2 * 500);
  auto submit = [&](int64_t offset) {
    for (int round = 0; round < 20; ++round) {
      pool.parallel_for(500, [&](int64_t task) { ++runs[offset + task]; });
    }
  };
  std::thread other(submit, 500);
  submit(0);
  other.join();
  for (auto &count : runs) REQUIRE(count == 20);

  std::atomic<int> inner{0};
  pool.parallel_for(4, [&](int64_t) { pool.parallel_for(5, [&](int64_t) { ++inner; }); });
  CHECK(inner == 20);
}

TEST_CASE("the thread pool rethrows the first exception after all tasks ran", "[codegen]") {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  CHECK_THROWS_AS(pool.parallel_for(10,
                                    [&](int64_t task) {
                                      ++ran;
                                      if (task == 3) throw std::runtime_error("boom");
                                    }),
                  std::runtime_error);
  CHECK(ran == 10);
  CHECK(kiln::runtime::default_thread_pool().num_threads() >= 1);
}
