// The record of failed device teardowns (teardown_failures.h).
#include "kiln/rhi/teardown_failures.h"

#include <cstddef>
#include <mutex>
#include <utility>

namespace kiln {
namespace {

constexpr std::size_t kMaxKept = 64;

struct Record {
  std::mutex mutex;
  std::vector<std::string> failures;
};

Record &record() {
  static Record *r = new Record;  // never destroyed: a device may be torn down at exit
  return *r;
}

}  // namespace

void record_teardown_failure(std::string message) noexcept {
  try {
    Record &r = record();
    const std::lock_guard<std::mutex> lock(r.mutex);
    if (r.failures.size() == kMaxKept) r.failures.erase(r.failures.begin());
    r.failures.push_back(std::move(message));
  } catch (...) {  // std::bad_alloc: the report is lost, the teardown goes on
  }
}

std::vector<std::string> take_teardown_failures() {
  Record &r = record();
  const std::lock_guard<std::mutex> lock(r.mutex);
  return std::exchange(r.failures, {});
}

}  // namespace kiln
