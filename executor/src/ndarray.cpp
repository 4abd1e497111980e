#include "kiln/executor/ndarray.h"

#include <algorithm>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "kiln/executor/executor.h"

namespace kiln {

RhiExpected<DataType> parse_dtype(std::string_view name) {
  for (DataType d : kAllDataTypes)
    if (to_string(d) == name) return d;
  return std::unexpected(invalid_usage("kiln", "parse_dtype",
                                       fmt::format("unknown dtype '{}'; kiln knows f32, f64, i32, i64", name)));
}

std::string describe_array(DataType dtype, std::span<const int64_t> shape) {
  return fmt::format("{}[{}]", to_string(dtype), fmt::join(shape, ", "));
}

RhiExpected<ShapeInfo> compute_shape_info(DataType dtype, std::span<const int64_t> shape) {
  if (!is_valid(dtype))
    return std::unexpected(invalid_usage(
        "kiln", "compute_shape_info",
        fmt::format("dtype value {} is not a kiln dtype (f32, f64, i32, i64)",
                    static_cast<int>(dtype))));
  if (shape.size() > kMaxDimensions)
    return std::unexpected(invalid_usage(
        "kiln", "compute_shape_info",
        fmt::format("shape has {} dimensions; kiln arrays have at most {} (numpy's limit)",
                    shape.size(), kMaxDimensions)));
  ShapeInfo info;
  for (int64_t dim : shape) {
    if (dim < 0)
      return std::unexpected(invalid_usage(
          "kiln", "compute_shape_info",
          fmt::format("shape {} has a negative dimension", describe_array(dtype, shape))));
  }
  // numpy's rule: the byte count of the non-zero dimensions must fit in int64, zero-size or not,
  // so that every kiln array has a numpy twin (to_numpy, np.asarray).
  uint64_t nonzero_bytes = itemsize(dtype);
  bool overflow = false;
  for (int64_t dim : shape)
    if (dim != 0) overflow |= __builtin_mul_overflow(nonzero_bytes, static_cast<uint64_t>(dim), &nonzero_bytes);
  if (overflow || nonzero_bytes > static_cast<uint64_t>(INT64_MAX))
    return std::unexpected(invalid_usage(
        "kiln", "compute_shape_info",
        fmt::format("shape {} overflows: the byte count of its non-zero dimensions does not fit "
                    "in int64 (numpy's limit, also for zero-size arrays)",
                    describe_array(dtype, shape))));
  const bool zero_size = std::find(shape.begin(), shape.end(), 0) != shape.end();
  info.size_bytes = zero_size ? 0 : nonzero_bytes;
  info.num_elements = info.size_bytes / itemsize(dtype);
  return info;
}

std::vector<int64_t> row_major_strides(std::span<const int64_t> shape) {
  // A zero-size array's strides treat 0 as 1 and saturate to 0 where that product would
  // overflow (they address nothing).
  std::vector<int64_t> strides(shape.size(), 1);
  for (std::size_t i = shape.size(); i-- > 1;) {
    int64_t stride = 0;
    if (strides[i] == 0 || __builtin_mul_overflow(strides[i], std::max<int64_t>(shape[i], 1), &stride))
      stride = 0;
    strides[i - 1] = stride;
  }
  return strides;
}

RhiExpected<std::optional<DeviceAllocation>> Ndarray::allocation(const char *site) const {
  if (state_ == nullptr)
    return std::unexpected(invalid_usage("kiln", site, "ndarray handle is empty (default-constructed)"));
  if (state_->freed)
    return std::unexpected(invalid_usage(state_->freed_device_name, site,
                                         fmt::format("ndarray {} used after it was freed", describe())));
  return state_->alloc;
}

RhiExpected<uint64_t> Ndarray::device_address(const char *site) const {
  KILN_ASSIGN_OR_RETURN(const std::optional<DeviceAllocation> alloc, allocation(site));
  if (!alloc) return uint64_t{0};
  return state_->context->device->device_address(*alloc);
}

Ndarray::State::~State() {
  if (release_external) {  // another library's memory: leave the table, give it back
    if (!freed && alloc) ignore_result(context->device->unregister_external(*alloc), "destructor");
    std::exchange(release_external, nullptr)();
    return;
  }
  if (!freed && alloc)
    ignore_result(context->memory->free(*alloc),
                  "destructor; the device defers a refused free to synchronize()");
}

}  // namespace kiln
