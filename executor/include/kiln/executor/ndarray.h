// Ndarray: an n-dimensional, row-major, contiguous array in device memory.
#ifndef KILN_EXECUTOR_NDARRAY_H_
#define KILN_EXECUTOR_NDARRAY_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kiln/executor/dtype.h"
#include "kiln/rhi/device.h"

namespace kiln {

namespace runtime {
class DeviceMemory;
}
struct DeviceContext;

/// The element count and byte count of a shape, computed with overflow checks.
struct ShapeInfo {
  uint64_t num_elements = 0;
  uint64_t size_bytes = 0;
};
/// The most dimensions an ndarray may have: numpy's limit (NPY_MAXDIMS on numpy 1.x), so that
/// every kiln array has a numpy twin.
inline constexpr std::size_t kMaxDimensions = 32;
/// Errors: invalid_usage for a dtype value outside DataType, more than kMaxDimensions
/// dimensions, a negative dimension, or when the byte count of the non-zero dimensions does not
/// fit in int64 (numpy's rule; never wraps to a small allocation). A zero dimension gives a
/// zero-size array: allowed, and it allocates nothing.
[[nodiscard]] RhiExpected<ShapeInfo> compute_shape_info(DataType dtype, std::span<const int64_t> shape);
/// The row-major strides of `shape`, in elements. A zero-size shape's strides treat 0 as 1 and
/// are 0 where that product would overflow (they address nothing). Computed when asked: an
/// array's creation allocates no strides.
[[nodiscard]] std::vector<int64_t> row_major_strides(std::span<const int64_t> shape);
/// "f32[2, 3]".
[[nodiscard]] std::string describe_array(DataType dtype, std::span<const int64_t> shape);

/// A handle to an array; copies share the same memory. The memory is freed by
/// LlvmRuntimeExecutor::free or when the last handle goes; using a handle after an explicit free
/// is invalid_usage, never a stale pointer. Handles may outlive the executor (they keep the
/// device alive). Not thread-safe for concurrent free and use of the same array.
class Ndarray {
 public:
  Ndarray() = default;
  [[nodiscard]] DataType dtype() const;
  [[nodiscard]] const std::vector<int64_t> &shape() const;
  [[nodiscard]] std::vector<int64_t> strides() const;  ///< in elements, row-major (computed)
  [[nodiscard]] uint64_t num_elements() const;
  [[nodiscard]] uint64_t nbytes() const;
  [[nodiscard]] bool is_freed() const;
  [[nodiscard]] std::string describe() const { return describe_array(dtype(), shape()); }
  /// The allocation, or invalid_usage if freed or from a default-constructed handle. A zero-size
  /// array has none: nullopt.
  [[nodiscard]] RhiExpected<std::optional<DeviceAllocation>> allocation(const char *site) const;
  /// The device address of element 0 (0 for a zero-size array), or invalid_usage if freed.
  [[nodiscard]] RhiExpected<uint64_t> device_address(const char *site) const;
  /// Whether both handles name the same array.
  [[nodiscard]] bool same_as(const Ndarray &other) const { return state_ == other.state_; }
  [[nodiscard]] bool has_value() const { return state_ != nullptr; }

  struct State;

 private:
  friend class LlvmRuntimeExecutor;
  explicit Ndarray(std::shared_ptr<State> state) : state_(std::move(state)) {}
  std::shared_ptr<State> state_;
};

struct Ndarray::State {
  // A user-provided constructor: make_shared then default-initializes instead of zero-filling
  // the whole state first (a `rep stos` per array, ~5% of an allocation from Python).
  State(std::shared_ptr<DeviceContext> device_context, DataType array_dtype,
        std::span<const int64_t> array_shape, ShapeInfo shape_info)
      : context(std::move(device_context)),
        dtype(array_dtype),
        shape(array_shape.begin(), array_shape.end()),
        info(shape_info) {}
  std::shared_ptr<DeviceContext> context;  // null once freed
  std::string freed_device_name;           // the device's name, once freed
  DataType dtype;
  std::vector<int64_t> shape;
  ShapeInfo info;
  std::optional<DeviceAllocation> alloc;
  bool freed = false;
  /// Set for memory another library owns (LlvmRuntimeExecutor::wrap_external): alloc is then a
  /// register_external entry, and this gives the memory back to its owner (called once).
  std::function<void()> release_external;
  ~State();
};

inline DataType Ndarray::dtype() const { return state_->dtype; }
inline const std::vector<int64_t> &Ndarray::shape() const { return state_->shape; }
inline std::vector<int64_t> Ndarray::strides() const { return row_major_strides(state_->shape); }
inline uint64_t Ndarray::num_elements() const { return state_->info.num_elements; }
inline uint64_t Ndarray::nbytes() const { return state_->info.size_bytes; }
inline bool Ndarray::is_freed() const { return state_->freed; }

}  // namespace kiln

#endif  // KILN_EXECUTOR_NDARRAY_H_
