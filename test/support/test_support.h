// Helpers shared by kiln's C++ tests.
#ifndef KILN_TEST_SUPPORT_H_
#define KILN_TEST_SUPPORT_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "byte_units.h"
#include "kiln/executor/errors.h"
#include "kiln/executor/executor.h"

namespace kiln::test {

/// The process-wide host Program (compiled once), so tests do not re-JIT per executor.
inline std::shared_ptr<Program> host_program() { return value_or_throw(Program::shared_host()); }

/// An executor on `backend` with a small heap; throws the named error if it cannot be made.
inline std::unique_ptr<LlvmRuntimeExecutor> make_executor(ExecutorConfig config = {}) {
  if (config.device_heap_bytes == (16ull << 20)) config.device_heap_bytes = 1_MiB;
  return value_or_throw(LlvmRuntimeExecutor::create(config, host_program()));
}

/// An executor on a GPU `backend` (cuda, amdgpu: the fake drivers in tests) with `heap_bytes` of
/// device heap and the code for the device's own processor; throws the named error if it cannot
/// be made.
inline std::unique_ptr<LlvmRuntimeExecutor> make_gpu_executor(Backend backend, uint64_t heap_bytes = 1_MiB) {
  ExecutorConfig config;
  config.backend = backend;
  config.device_heap_bytes = heap_bytes;
  return value_or_throw(LlvmRuntimeExecutor::create(config));
}

inline std::unique_ptr<LlvmRuntimeExecutor> make_mock_executor(uint64_t capacity_bytes = 256_MiB,
                                                               std::optional<uint64_t> limit = {}) {
  ExecutorConfig config;
  config.backend = Backend::mock;
  config.mock.capacity_bytes = capacity_bytes;
  config.budget.limit_bytes = limit;
  return make_executor(config);
}

template <class T>
std::span<const std::byte> bytes_of(const std::vector<T> &v) {
  return std::as_bytes(std::span<const T>(v));
}

/// Uploads `values` into a new 1-D array.
template <class T>
Ndarray upload(LlvmRuntimeExecutor &ex, DataType dtype, const std::vector<T> &values) {
  const int64_t shape[1] = {static_cast<int64_t>(values.size())};
  Ndarray a = value_or_throw(ex.ndarray(dtype, shape));
  value_or_throw(ex.write(a, bytes_of(values)));
  return a;
}

template <class T>
std::vector<T> download(LlvmRuntimeExecutor &ex, const Ndarray &a) {
  std::vector<T> v(a.num_elements());
  value_or_throw(ex.read(a, std::as_writable_bytes(std::span<T>(v))));
  return v;
}

/// Bytes the executor's ledger holds for use: every category but the pool's cache.
inline uint64_t ledger_bytes(LlvmRuntimeExecutor &ex) {
  const CategoryBytes in_use = ex.memory().in_use_by_category();
  return ex.memory().in_use_bytes() - in_use[static_cast<std::size_t>(MemoryCategory::pool_cache)];
}

}  // namespace kiln::test

#endif  // KILN_TEST_SUPPORT_H_
