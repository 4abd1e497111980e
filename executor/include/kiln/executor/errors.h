// The named errors: the ONLY place an RhiResult + Failure becomes a named error.
//
// C++ users choose: the expected-returning API (RhiExpected<T>, no exceptions), or the throwing
// wrappers (value_or_throw), which raise exactly one exception type per ErrorKind.
#ifndef KILN_EXECUTOR_ERRORS_H_
#define KILN_EXECUTOR_ERRORS_H_

#include <stdexcept>
#include <string>
#include <string_view>

#include "kiln/executor/advice.h"
#include "kiln/rhi/result.h"

namespace kiln {

/// A closed set: one named error per way a device says "no".
enum class ErrorKind : uint8_t {
  device_out_of_memory,   ///< the driver refused (out_of_memory, oom_source driver)
  budget_exceeded,        ///< kiln's budget refused (oom_source budget)
  device_heap_exhausted,  ///< the device-side runtime heap ran out while a kernel ran
  host_out_of_memory,     ///< host memory could not be had
  invalid_usage,          ///< the caller passed something that can never work
  not_supported,          ///< backend, driver or feature absent
  device_lost,            ///< sticky device fault; the device is unusable
  runtime_error,          ///< any other device or driver failure (RhiResult::error)
};

/// The one mapping: RhiResult + detail -> ErrorKind.
[[nodiscard]] ErrorKind classify(const Failure &failure);
/// "DeviceOutOfMemoryError", "BudgetExceededError", ...: the class names in C++ and Python.
[[nodiscard]] std::string_view error_name(ErrorKind kind);
[[nodiscard]] bool is_out_of_memory(ErrorKind kind);

/// Base of every kiln exception; carries the full Failure. what() is the full message, with the
/// advice of `knobs` (the C++ API's unless the failure already has advice).
class Error : public std::runtime_error {
 public:
  explicit Error(Failure failure, const InterfaceKnobs &knobs = kCppKnobs);
  [[nodiscard]] const Failure &failure() const noexcept { return failure_; }
  [[nodiscard]] ErrorKind kind() const noexcept { return kind_; }
  [[nodiscard]] std::string_view name() const noexcept { return error_name(kind_); }

 private:
  Error(Failure &&advised_failure, std::nullptr_t);  // the message is made once, advice in
  Failure failure_;
  ErrorKind kind_;
};

/// Base of every out-of-memory kind.
class OutOfMemoryError : public Error { using Error::Error; };
class DeviceOutOfMemoryError final : public OutOfMemoryError { using OutOfMemoryError::OutOfMemoryError; };
class BudgetExceededError final : public OutOfMemoryError { using OutOfMemoryError::OutOfMemoryError; };
class DeviceHeapExhaustedError final : public OutOfMemoryError { using OutOfMemoryError::OutOfMemoryError; };
class HostOutOfMemoryError final : public OutOfMemoryError { using OutOfMemoryError::OutOfMemoryError; };
class InvalidUsageError final : public Error { using Error::Error; };
class NotSupportedError final : public Error { using Error::Error; };
class DeviceLostError final : public Error { using Error::Error; };
class RuntimeFaultError final : public Error { using Error::Error; };

/// Throws the named error for `failure` (never returns).
[[noreturn]] void throw_error(Failure failure);

/// The value, or the named error thrown.
template <class T>
T value_or_throw(RhiExpected<T> expected) {
  if (!expected) throw_error(std::move(expected).error());
  if constexpr (!std::is_void_v<T>) return std::move(expected).value();
}

/// "<ErrorName>: <message>", the line kiln-ops prints after REFUSED; the message advises with
/// `knobs` unless the failure already has advice.
[[nodiscard]] std::string describe(const Failure &failure, const InterfaceKnobs &knobs = kCppKnobs);

}  // namespace kiln

#endif  // KILN_EXECUTOR_ERRORS_H_
