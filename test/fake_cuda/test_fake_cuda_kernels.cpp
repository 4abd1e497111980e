// Kernels from generate_ptx() on the fake CUDA driver: module and function checks, and fill,
// reduce_sum, axpy (grid stride) and the tiled matmul run end to end.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "fake_cuda_test_support.h"

using namespace kiln::cuda;
using namespace kiln::fake_cuda_test;

TEST_CASE("fake cuda: modules accept PTX only and functions must be its entries",
          "[fake_cuda]") {
  Fake &f = opened();
  CUmodule module = nullptr;
  CHECK(f.cuModuleLoadData(&module, "\x7f" "ELF not a PTX image") == kErrorInvalidImage);
  CHECK(f.cuModuleLoadData(&module, "hello, world") == kErrorInvalidPtx);
  CHECK(f.cuModuleLoadData(&module, ".version 7.0\n.target sm_80\n") == kErrorInvalidPtx);
  REQUIRE(f.cuModuleLoadData(&module, ptx().c_str()) == kSuccess);
  CHECK(f.module_bytes() == ptx().size() + 1);
  CUfunction function = nullptr;
  CHECK(f.cuModuleGetFunction(&function, module, "kiln_axpy_f64_gpu") == kSuccess);
  CUfunction again = nullptr;
  CHECK(f.cuModuleGetFunction(&again, module, "kiln_axpy_f64_gpu") == kSuccess);
  CHECK(again == function);
  CHECK(f.cuModuleGetFunction(&function, module, "kiln_axpy_f64") == kErrorNotFound);
  CHECK(f.cuModuleGetFunction(&function, reinterpret_cast<CUmodule>(&again), "x") ==
        kErrorInvalidHandle);
  CHECK(f.cuModuleUnload(module) == kSuccess);
  CHECK(f.module_bytes() == 0);
  CHECK(f.cuModuleUnload(module) == kErrorInvalidHandle);
  void *params[2] = {nullptr, nullptr};
  CHECK(f.cuLaunchKernel(again, 1, 1, 1, 1, 1, 1, 0, nullptr, params, nullptr) ==
        kErrorInvalidHandle);
  CHECK(f.sticky_error() == kSuccess);
}

TEST_CASE("fake cuda: fill_f32 from generate_ptx() runs end to end", "[fake_cuda]") {
  Fake &f = opened();
  Launch launch(f);
  constexpr int64_t kN = 100003;
  const CUdeviceptr out = alloc(f, kN * sizeof(float));
  REQUIRE(f.cuMemsetD8_v2(out, 0, kN * sizeof(float)) == kSuccess);
  KilnKernelArgs args{};
  args.ptr[0] = out;
  args.num_elements = kN;
  args.iteration_size = kN;
  args.scalar_f64 = 2.5;
  args.num_tasks = 4;  // 4 blocks of 256 threads grid-stride over 100003 elements
  REQUIRE(launch.run("kiln_fill_f32_gpu", args, 4, 256) == kSuccess);
  REQUIRE(f.cuCtxSynchronize() == kSuccess);
  std::vector<float> host(kN, 0.0f);
  REQUIRE(f.cuMemcpyDtoH_v2(host.data(), out, kN * sizeof(float)) == kSuccess);
  CHECK(std::count(host.begin(), host.end(), 2.5f) == kN);
  CHECK(f.launch_count() == 1);
}

TEST_CASE("fake cuda: reduce_sum_i64 writes one partial sum per block", "[fake_cuda]") {
  Fake &f = opened();
  Launch launch(f);
  constexpr int64_t kN = 1000;
  constexpr int64_t kBlocks = 3;
  constexpr int64_t kThreads = 32;
  std::vector<int64_t> x(kN);
  for (int64_t i = 0; i < kN; ++i) x[i] = i;
  const CUdeviceptr in = alloc(f, kN * sizeof(int64_t));
  const CUdeviceptr results = alloc(f, kBlocks * sizeof(KilnTaskResult));
  REQUIRE(f.cuMemcpyHtoD_v2(in, x.data(), kN * sizeof(int64_t)) == kSuccess);
  REQUIRE(f.cuMemsetD8_v2(results, 0, kBlocks * sizeof(KilnTaskResult)) == kSuccess);
  KilnKernelArgs args{};
  args.ptr[0] = in;
  args.num_elements = kN;
  args.iteration_size = kN;
  args.result_buffer = results;
  args.num_tasks = kBlocks;
  REQUIRE(launch.run("kiln_reduce_sum_i64_gpu", args, kBlocks, kThreads) == kSuccess);
  std::vector<KilnTaskResult> slots(kBlocks);
  REQUIRE(f.cuMemcpyDtoH_v2(slots.data(), results, kBlocks * sizeof(KilnTaskResult)) == kSuccess);
  // Grid stride: element i belongs to thread i % 96, i.e. to block (i / 32) % 3.
  std::vector<int64_t> expected(kBlocks, 0);
  for (int64_t i = 0; i < kN; ++i) expected[(i / kThreads) % kBlocks] += x[i];
  int64_t total = 0;
  for (int64_t block = 0; block < kBlocks; ++block) {
    CHECK(static_cast<int64_t>(slots[block].value_bits) == expected[block]);
    total += static_cast<int64_t>(slots[block].value_bits);
  }
  CHECK(total == kN * (kN - 1) / 2);
}

TEST_CASE("fake cuda: reduce_sum with more blocks than result slots records a device assertion",
          "[fake_cuda]") {
  Fake &f = opened();
  Launch launch(f);
  constexpr int64_t kN = 64;
  const CUdeviceptr in = alloc(f, kN * sizeof(float));
  const CUdeviceptr results = alloc(f, sizeof(KilnTaskResult));
  REQUIRE(f.cuMemsetD8_v2(in, 0, kN * sizeof(float)) == kSuccess);
  KilnKernelArgs args{};
  args.ptr[0] = in;
  args.iteration_size = kN;
  args.result_buffer = results;
  args.num_tasks = 1;  // one slot, two blocks: a partial would be lost
  REQUIRE(launch.run("kiln_reduce_sum_f32_gpu", args, 2, 32) == kSuccess);
  const KilnRuntime state = launch.runtime_state();
  CHECK(state.error_code == KILN_DEVICE_ASSERTION);
  CHECK(state.error_arg0 == 1);  // kiln_gpu::kMoreBlocksThanSlots
  CHECK(state.error_arg1 == 2);
  CHECK(state.error_arg2 == 1);
  CHECK(std::string(state.error_message) == "reduce_sum launched with more blocks than result slots");
}

TEST_CASE("fake cuda: a grid smaller than the data still covers every element (grid stride)",
          "[fake_cuda]") {
  Fake &f = opened();
  Launch launch(f);
  constexpr int64_t kN = 10007;  // prime: no grid divides it
  std::vector<double> x(kN), y(kN);
  for (int64_t i = 0; i < kN; ++i) {
    x[i] = static_cast<double>(i);
    y[i] = 1.0;
  }
  const CUdeviceptr dx = alloc(f, kN * sizeof(double));
  const CUdeviceptr dy = alloc(f, kN * sizeof(double));
  REQUIRE(f.cuMemcpyHtoD_v2(dx, x.data(), kN * sizeof(double)) == kSuccess);
  KilnKernelArgs args{};
  args.ptr[0] = dy;
  args.ptr[1] = dx;
  args.num_elements = kN;
  args.iteration_size = kN;
  args.scalar_f64 = 2.0;
  args.num_tasks = 1;
  for (const auto &[grid, block] : {std::pair{1u, 1u}, {1u, 256u}, {3u, 64u}, {7u, 33u}}) {
    CAPTURE(grid, block);
    REQUIRE(f.cuMemcpyHtoD_v2(dy, y.data(), kN * sizeof(double)) == kSuccess);
    REQUIRE(launch.run("kiln_axpy_f64_gpu", args, grid, block) == kSuccess);
    std::vector<double> out(kN, 0.0);
    REQUIRE(f.cuMemcpyDtoH_v2(out.data(), dy, kN * sizeof(double)) == kSuccess);
    int64_t wrong = 0;
    for (int64_t i = 0; i < kN; ++i) wrong += out[i] == 2.0 * static_cast<double>(i) + 1.0 ? 0 : 1;
    CHECK(wrong == 0);
  }
  SECTION("and a block bigger than the kernels' 256 threads is refused, as .maxntid 256 makes a GPU") {
    CHECK(launch.run("kiln_axpy_f64_gpu", args, 1, 512) == kErrorInvalidValue);
  }
}

TEST_CASE("fake cuda: the tiled matmul covers odd shapes with any grid", "[fake_cuda]") {
  Fake &f = opened();
  Launch launch(f);
  for (const auto &[m, n, k] : {std::tuple{1, 1, 1}, {37, 29, 19}, {16, 32, 17}, {5, 70, 33}}) {
    CAPTURE(m, n, k);
    std::vector<int32_t> a(m * k), b(k * n), expected(m * n, 0);
    for (int i = 0; i < m * k; ++i) a[i] = (i * 7) % 13 - 6;
    for (int i = 0; i < k * n; ++i) b[i] = (i * 5) % 11 - 5;
    for (int i = 0; i < m; ++i)
      for (int j = 0; j < n; ++j)
        for (int p = 0; p < k; ++p) expected[i * n + j] += a[i * k + p] * b[p * n + j];
    const CUdeviceptr dc = alloc(f, m * n * sizeof(int32_t));
    const CUdeviceptr da = alloc(f, m * k * sizeof(int32_t));
    const CUdeviceptr db = alloc(f, k * n * sizeof(int32_t));
    REQUIRE(f.cuMemcpyHtoD_v2(da, a.data(), a.size() * sizeof(int32_t)) == kSuccess);
    REQUIRE(f.cuMemcpyHtoD_v2(db, b.data(), b.size() * sizeof(int32_t)) == kSuccess);
    KilnKernelArgs args{};
    args.ptr[0] = dc;
    args.ptr[1] = da;
    args.ptr[2] = db;
    args.dims[0] = m;
    args.dims[1] = n;
    args.dims[2] = k;
    args.iteration_size = m;
    args.num_tasks = 1;
    for (unsigned grid : {1u, 2u, 64u}) {  // fewer, and more, blocks than tiles
      CAPTURE(grid);
      REQUIRE(f.cuMemsetD8_v2(dc, 0xff, m * n * sizeof(int32_t)) == kSuccess);
      REQUIRE(launch.run("kiln_matmul_i32_gpu", args, grid, 256) == kSuccess);
      std::vector<int32_t> c(m * n);
      REQUIRE(f.cuMemcpyDtoH_v2(c.data(), dc, c.size() * sizeof(int32_t)) == kSuccess);
      CHECK(c == expected);
    }
  }
  SECTION("a block that is not 16x16 threads records a device assertion") {
    const CUdeviceptr d = alloc(f, 4 * sizeof(float));
    KilnKernelArgs args{};
    args.ptr[0] = args.ptr[1] = args.ptr[2] = d;
    args.dims[0] = args.dims[1] = args.dims[2] = 1;
    args.iteration_size = 1;
    args.num_tasks = 1;
    REQUIRE(launch.run("kiln_matmul_f32_gpu", args, 1, 128) == kSuccess);
    const KilnRuntime state = launch.runtime_state();
    CHECK(state.error_code == KILN_DEVICE_ASSERTION);
    CHECK(state.error_arg0 == 2);  // kiln_gpu::kMatmulBlockShape
    CHECK(state.error_arg1 == 128);
  }
}
