// DLPack devices and dtypes as kiln names them, and the "dltensor" capsule's destructor
// (dlpack_common.h).
#include "dlpack_common.h"

#include <fmt/format.h>

#include <cstdlib>

#include "conversions.h"
#include "error_mapping.h"

namespace kiln::python::dlpack {

DevicePair to_dl_device(py::handle value, const std::string &what, const char *site) {
  // The tuple's own storage, not its __getitem__ (a tuple subclass may override it).
  PyObject *tuple = value.ptr();
  if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) != 2 ||
      !is_integer(PyTuple_GET_ITEM(tuple, 0)) || !is_integer(PyTuple_GET_ITEM(tuple, 1)))
    raise_invalid_type(site, fmt::format("{}: {} is {} {}, not a (device_type, device_id) tuple "
                                         "of two ints",
                                         site, what, type_name(value), std::string(py::repr(value))));
  const int32_t type = to_int32(PyTuple_GET_ITEM(tuple, 0), ("the device_type in " + what).c_str(), site);
  const int32_t id = to_int32(PyTuple_GET_ITEM(tuple, 1), ("the device_id in " + what).c_str(), site);
  return DevicePair{type, id};
}

DLDevice dl_device_of(const std::string &device_name) {
  const std::size_t colon = device_name.find(':');
  const std::string backend = device_name.substr(0, colon);
  const int ordinal = colon == std::string::npos ? 0 : std::atoi(device_name.c_str() + colon + 1);
  if (backend == "cuda") return DLDevice{kDLCUDA, ordinal};
  if (backend == "amdgpu") return DLDevice{kDLROCM, ordinal};
  return DLDevice{kDLCPU, 0};
}

std::string describe_device(DevicePair device) {
  switch (device.type) {
    case kDLCPU: return device.id == 0 ? "cpu" : fmt::format("cpu:{}", device.id);
    case kDLCUDA: return fmt::format("cuda:{}", device.id);
    case kDLROCM: return fmt::format("rocm:{}", device.id);
    default: return fmt::format("DLPack device type {}:{}", device.type, device.id);
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
  // An unknown type code is named apart from its bits ("type code 99 of 32 bits"), never run
  // together with them.
  if (t.code >= std::size(kCodes))
    return fmt::format("type code {} of {} bits{}", t.code, t.bits,
                       t.lanes == 1 ? "" : fmt::format(" x {} lanes", t.lanes));
  const std::string code = kCodes[t.code];
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
