#include "kiln/executor/errors.h"

#include <fmt/format.h>

namespace kiln {

ErrorKind classify(const Failure &failure) {
  switch (failure.result) {
    case RhiResult::out_of_memory:
      switch (failure.oom_source) {
        case OomSource::budget: return ErrorKind::budget_exceeded;
        case OomSource::device_heap: return ErrorKind::device_heap_exhausted;
        case OomSource::host: return ErrorKind::host_out_of_memory;
        case OomSource::driver:
        case OomSource::none: return ErrorKind::device_out_of_memory;
      }
      return ErrorKind::device_out_of_memory;
    case RhiResult::invalid_usage: return ErrorKind::invalid_usage;
    case RhiResult::not_supported: return ErrorKind::not_supported;
    case RhiResult::device_lost: return ErrorKind::device_lost;
    case RhiResult::success:  // a Failure never holds success; treat as a runtime bug
    case RhiResult::error: return ErrorKind::runtime_error;
  }
  return ErrorKind::runtime_error;
}

std::string_view error_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::device_out_of_memory: return "DeviceOutOfMemoryError";
    case ErrorKind::budget_exceeded: return "BudgetExceededError";
    case ErrorKind::device_heap_exhausted: return "DeviceHeapExhaustedError";
    case ErrorKind::host_out_of_memory: return "HostOutOfMemoryError";
    case ErrorKind::invalid_usage: return "InvalidUsageError";
    case ErrorKind::not_supported: return "NotSupportedError";
    case ErrorKind::device_lost: return "DeviceLostError";
    case ErrorKind::runtime_error: return "RuntimeFaultError";
  }
  return "Error";
}

bool is_out_of_memory(ErrorKind kind) {
  return kind == ErrorKind::device_out_of_memory || kind == ErrorKind::budget_exceeded ||
         kind == ErrorKind::device_heap_exhausted || kind == ErrorKind::host_out_of_memory;
}

namespace {
Failure advised(Failure failure, const InterfaceKnobs &knobs) {
  advise(failure, knobs);
  return failure;
}
}  // namespace

Error::Error(Failure failure, const InterfaceKnobs &knobs)
    : Error(advised(std::move(failure), knobs), nullptr) {}

Error::Error(Failure &&advised_failure, std::nullptr_t)
    : std::runtime_error(advised_failure.message()),
      failure_(std::move(advised_failure)),
      kind_(classify(failure_)) {}

void throw_error(Failure failure) {
  switch (classify(failure)) {
    case ErrorKind::device_out_of_memory: throw DeviceOutOfMemoryError(std::move(failure));
    case ErrorKind::budget_exceeded: throw BudgetExceededError(std::move(failure));
    case ErrorKind::device_heap_exhausted: throw DeviceHeapExhaustedError(std::move(failure));
    case ErrorKind::host_out_of_memory: throw HostOutOfMemoryError(std::move(failure));
    case ErrorKind::invalid_usage: throw InvalidUsageError(std::move(failure));
    case ErrorKind::not_supported: throw NotSupportedError(std::move(failure));
    case ErrorKind::device_lost: throw DeviceLostError(std::move(failure));
    case ErrorKind::runtime_error: throw RuntimeFaultError(std::move(failure));
  }
  throw RuntimeFaultError(std::move(failure));
}

std::string describe(const Failure &failure, const InterfaceKnobs &knobs) {
  if (!failure.advice.empty())
    return fmt::format("{}: {}", error_name(classify(failure)), failure.message());
  Failure with_advice = failure;
  advise(with_advice, knobs);
  return fmt::format("{}: {}", error_name(classify(failure)), with_advice.message());
}

}  // namespace kiln
