// DLPack devices and dtypes as kiln names them, and the "dltensor" capsule's destructor
// (dlpack_common.h).
#include "dlpack_common.h"

#include <fmt/format.h>

#include <cstdlib>

namespace kiln::python::dlpack {

DLDevice dl_device_of(const std::string &device_name) {
  const std::size_t colon = device_name.find(':');
  const std::string backend = device_name.substr(0, colon);
  const int ordinal = colon == std::string::npos ? 0 : std::atoi(device_name.c_str() + colon + 1);
  if (backend == "cuda") return DLDevice{kDLCUDA, ordinal};
  if (backend == "amdgpu") return DLDevice{kDLROCM, ordinal};
  return DLDevice{kDLCPU, 0};
}

std::string describe_device(DLDevice device) {
  switch (static_cast<int>(device.device_type)) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return fmt::format("cuda:{}", device.device_id);
    case kDLROCM: return fmt::format("rocm:{}", device.device_id);
    default: return fmt::format("DLPack device type {}:{}", static_cast<int>(device.device_type), device.device_id);
  }
}

DLDataType dl_dtype_of(DataType dtype) {
  switch (dtype) {
    case DataType::f32: return DLDataType{kDLFloat, 32, 1};
    case DataType::f64: return DLDataType{kDLFloat, 64, 1};
    case DataType::i32: return DLDataType{kDLInt, 32, 1};
    case DataType::i64: return DLDataType{kDLInt, 64, 1};
  }
  return DLDataType{kDLOpaqueHandle, 0, 1};
}

std::optional<DataType> kiln_dtype_of(DLDataType t) {
  for (DataType d : {DataType::f32, DataType::f64, DataType::i32, DataType::i64}) {
    const DLDataType dl = dl_dtype_of(d);
    if (dl.code == t.code && dl.bits == t.bits) return d;
  }
  return std::nullopt;
}

std::string describe_dtype(DLDataType t) {
  static constexpr const char *kCodes[] = {"int", "uint", "float", "opaque", "bfloat", "complex"};
  const std::string code = t.code < std::size(kCodes) ? kCodes[t.code] : fmt::format("code{}", t.code);
  return t.lanes == 1 ? fmt::format("{}{}", code, t.bits) : fmt::format("{}{}x{}", code, t.bits, t.lanes);
}

void delete_unconsumed_capsule(PyObject *capsule) {
  if (PyCapsule_IsValid(capsule, kUsedCapsuleName)) return;
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  auto *managed = static_cast<DLManagedTensor *>(PyCapsule_GetPointer(capsule, kCapsuleName));
  if (managed == nullptr) {
    PyErr_WriteUnraisable(capsule);
  } else if (managed->deleter != nullptr) {
    managed->deleter(managed);
  }
  PyErr_Restore(type, value, traceback);
}

}  // namespace kiln::python::dlpack
