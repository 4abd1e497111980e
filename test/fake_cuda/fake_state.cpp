// The fake driver's state: environment parsing, fault plan, memory accounting, and the exported
// control API of fake_cuda_control.h.
#include "fake_state.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "fake_cuda_control.h"

#define KILN_FAKE_CUDA_EXPORT extern "C" __attribute__((visibility("default")))

namespace kiln::fake_cuda {
namespace {

constexpr std::string_view kEntryPoints[] = {
#define KILN_CUDA_ENTRY(name, params) #name,
#include "cuda_driver.inc"
#undef KILN_CUDA_ENTRY
};

struct NamedResult {
  CUresult result;
  const char *name;
};

// The CUresult values of rhi/cuda/cuda_types.h, by their cuda.h enumerator names.
constexpr NamedResult kResultNames[] = {
    {0, "CUDA_SUCCESS"},
    {1, "CUDA_ERROR_INVALID_VALUE"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY"},
    {3, "CUDA_ERROR_NOT_INITIALIZED"},
    {4, "CUDA_ERROR_DEINITIALIZED"},
    {34, "CUDA_ERROR_STUB_LIBRARY"},
    {35, "CUDA_ERROR_INSUFFICIENT_DRIVER"},
    {36, "CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER"},
    {46, "CUDA_ERROR_DEVICE_UNAVAILABLE"},
    {100, "CUDA_ERROR_NO_DEVICE"},
    {101, "CUDA_ERROR_INVALID_DEVICE"},
    {200, "CUDA_ERROR_INVALID_IMAGE"},
    {201, "CUDA_ERROR_INVALID_CONTEXT"},
    {209, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
    {214, "CUDA_ERROR_ECC_UNCORRECTABLE"},
    {218, "CUDA_ERROR_INVALID_PTX"},
    {222, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
    {400, "CUDA_ERROR_INVALID_HANDLE"},
    {500, "CUDA_ERROR_NOT_FOUND"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS"},
    {717, "CUDA_ERROR_INVALID_ADDRESS_SPACE"},
    {718, "CUDA_ERROR_INVALID_PC"},
    {719, "CUDA_ERROR_LAUNCH_FAILED"},
    {800, "CUDA_ERROR_NOT_PERMITTED"},
    {801, "CUDA_ERROR_NOT_SUPPORTED"},
    {802, "CUDA_ERROR_SYSTEM_NOT_READY"},
    {803, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
    {804, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
    {999, "CUDA_ERROR_UNKNOWN"},
};

bool parse_u64(std::string_view text, uint64_t *value) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size();
}

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

/// Calls `fn(item)` for each comma-separated item; stops and returns false when fn does.
template <class Fn>
bool for_each_item(std::string_view list, Fn fn) {
  while (true) {
    const std::size_t comma = list.find(',');
    if (!fn(trim(list.substr(0, comma)))) return false;
    if (comma == std::string_view::npos) return true;
    list.remove_prefix(comma + 1);
  }
}

bool parse_mode(std::string_view text, Mode *mode) {
  if (text.empty() || text == "normal") *mode = Mode::normal;
  else if (text == "stub") *mode = Mode::stub;
  else if (text == "nodevice") *mode = Mode::nodevice;
  else return false;
  return true;
}

const char *env(const char *name) {
  const char *value = std::getenv(name);
  return value != nullptr ? value : "";
}

/// Reads the environment into `state`; returns a description of the first malformed variable.
std::string read_environment(State &state) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  if (const std::string_view capacity = env("KILN_FAKE_CUDA_CAPACITY_MB"); !capacity.empty()) {
    uint64_t mib = 0;
    if (!parse_u64(trim(capacity), &mib) || mib > (uint64_t{1} << 40)) {
      return "KILN_FAKE_CUDA_CAPACITY_MB='" + std::string(capacity) + "' is not a MiB count";
    }
    state.capacity_bytes = static_cast<std::size_t>(mib * kMiB);
  }
  if (const std::string_view other = env("KILN_FAKE_CUDA_OTHER_MB"); !other.empty()) {
    std::vector<std::size_t> script;
    const bool ok = for_each_item(other, [&](std::string_view item) {
      uint64_t mib = 0;
      if (!parse_u64(item, &mib) || mib > (uint64_t{1} << 40)) return false;
      script.push_back(static_cast<std::size_t>(mib * kMiB));
      return true;
    });
    if (!ok) {
      return "KILN_FAKE_CUDA_OTHER_MB='" + std::string(other) +
             "' is not a comma-separated list of MiB counts";
    }
    state.other_script = std::move(script);
    state.other_bytes = state.other_script.front();
  }
  if (const std::string_view faults = env("KILN_FAKE_CUDA_FAULTS"); !faults.empty()) {
    std::string bad;
    for_each_item(faults, [&](std::string_view item) {
      // <entry>@<n>=<result> or <entry>@*=<result>
      const std::size_t at = item.find('@');
      const std::size_t eq = item.find('=');
      uint64_t nth = 0;
      CUresult result = 0;
      if (at == std::string_view::npos || eq == std::string_view::npos || eq < at ||
          !is_entry_point(item.substr(0, at)) ||
          !(item.substr(at + 1, eq - at - 1) == "*" ||
            (parse_u64(item.substr(at + 1, eq - at - 1), &nth) && nth > 0)) ||
          !parse_result(item.substr(eq + 1), &result)) {
        bad = std::string(item);
        return false;
      }
      return state.add_fault(item.substr(0, at), nth, result);
    });
    if (!bad.empty()) {
      return "KILN_FAKE_CUDA_FAULTS item '" + bad +
             "' is not <entry point>@<call number or *>=<CUresult number or name>";
    }
  }
  if (const std::string_view mode = env("KILN_FAKE_CUDA_MODE"); !parse_mode(mode, &state.mode)) {
    return "KILN_FAKE_CUDA_MODE='" + std::string(mode) + "' is not normal, stub or nodevice";
  }
  return {};
}

State &global_state() {
  static State *state = [] {
    auto *created = new State();  // never destroyed: kiln may call the driver from atexit code
    reset_state(*created);
    return created;
  }();
  return *state;
}

std::mutex &global_mutex() {
  static auto *mutex = new std::mutex();
  return *mutex;
}

}  // namespace

bool is_entry_point(std::string_view name) {
  for (std::string_view entry : kEntryPoints) {
    if (entry == name) return true;
  }
  return false;
}

const char *error_name(CUresult result) {
  for (const NamedResult &named : kResultNames) {
    if (named.result == result) return named.name;
  }
  return nullptr;
}

bool parse_result(std::string_view text, CUresult *result) {
  for (const NamedResult &named : kResultNames) {
    if (text == named.name) {
      *result = named.result;
      return true;
    }
  }
  uint64_t value = 0;
  if (!parse_u64(text, &value) || value > 100000) return false;
  *result = static_cast<CUresult>(value);
  return true;
}

bool is_sticky(CUresult result) {
  return result == 214 || result == 700 || (result >= 714 && result <= 719);
}

CUcontext &current_context() {
  thread_local CUcontext context = nullptr;
  return context;
}

void State::release_device_memory() {
  for (auto &[address, allocation] : allocations) std::free(allocation.host);
  allocations.clear();
  held_bytes = 0;
  modules.clear();
  module_bytes = 0;
}

void State::load_environment() {
  config_error = read_environment(*this);
  if (!config_error.empty()) {
    std::fprintf(stderr, "kiln fake CUDA driver: %s; cuInit will fail with "
                         "CUDA_ERROR_INVALID_VALUE\n", config_error.c_str());
  }
}

std::size_t State::free_bytes() const {
  const std::size_t used = held_bytes + module_bytes + other_bytes;
  return used >= capacity_bytes ? 0 : capacity_bytes - used;
}

bool State::device_range_ok(uint64_t address, uint64_t size_bytes) const {
  auto it = allocations.upper_bound(address);
  if (it == allocations.begin()) return false;
  --it;
  const uint64_t offset = address - it->first;
  return offset <= it->second.size_bytes && size_bytes <= it->second.size_bytes - offset;
}

CUresult State::planned_fault(std::string_view entry) {
  const auto faults_it = faults.find(entry);
  if (faults_it == faults.end()) return 0;
  const uint64_t count = call_counts.find(entry)->second;
  for (const Fault &fault : faults_it->second) {
    if (fault.at_call == 0 || fault.at_call == count) return fault.result;
  }
  return 0;
}

bool State::add_fault(std::string_view entry, uint64_t nth_call, CUresult result) {
  if (!is_entry_point(entry)) return false;
  const auto count_it = call_counts.find(entry);
  const uint64_t calls_so_far = count_it == call_counts.end() ? 0 : count_it->second;
  faults[std::string(entry)].push_back({nth_call == 0 ? 0 : calls_so_far + nth_call, result});
  return true;
}

void reset_state(State &state) {
  state.release_device_memory();
  state = State();
  state.load_environment();
}

LockedState lock_state() {
  std::unique_lock lock(global_mutex());
  return {std::move(lock), &global_state()};
}

}  // namespace kiln::fake_cuda

// --- control API ---------------------------------------------------------------------------------

using kiln::fake_cuda::lock_state;

KILN_FAKE_CUDA_EXPORT void kiln_fake_cuda_reset(void) {
  auto state = lock_state();
  kiln::fake_cuda::reset_state(*state.state);
  kiln::fake_cuda::current_context() = nullptr;
}

KILN_FAKE_CUDA_EXPORT void kiln_fake_cuda_set_capacity_bytes(size_t capacity_bytes) {
  lock_state()->capacity_bytes = capacity_bytes;
}

KILN_FAKE_CUDA_EXPORT void kiln_fake_cuda_set_other_process_bytes(size_t other_bytes) {
  auto state = lock_state();
  state->other_script = {other_bytes};
  state->other_index = 0;
  state->other_bytes = other_bytes;
}

KILN_FAKE_CUDA_EXPORT int kiln_fake_cuda_inject_fault(const char *entry,
                                                      unsigned long long nth_call, int result) {
  if (entry == nullptr) return -1;
  return lock_state()->add_fault(entry, nth_call, result) ? 0 : -1;
}

KILN_FAKE_CUDA_EXPORT int kiln_fake_cuda_set_mode(const char *mode) {
  if (mode == nullptr) return -1;
  auto state = lock_state();
  return kiln::fake_cuda::parse_mode(mode, &state->mode) ? 0 : -1;
}

KILN_FAKE_CUDA_EXPORT unsigned long long kiln_fake_cuda_call_count(const char *entry) {
  if (entry == nullptr) return 0;
  auto state = lock_state();
  const auto it = state->call_counts.find(std::string_view(entry));
  return it == state->call_counts.end() ? 0 : it->second;
}

KILN_FAKE_CUDA_EXPORT size_t kiln_fake_cuda_held_bytes(void) { return lock_state()->held_bytes; }

KILN_FAKE_CUDA_EXPORT size_t kiln_fake_cuda_high_water_bytes(void) {
  return lock_state()->high_water_bytes;
}

KILN_FAKE_CUDA_EXPORT size_t kiln_fake_cuda_allocation_count(void) {
  return lock_state()->allocations.size();
}

KILN_FAKE_CUDA_EXPORT size_t kiln_fake_cuda_module_bytes(void) {
  return lock_state()->module_bytes;
}

KILN_FAKE_CUDA_EXPORT unsigned long long kiln_fake_cuda_oom_count(void) {
  return lock_state()->oom_count;
}

KILN_FAKE_CUDA_EXPORT int kiln_fake_cuda_sticky_error(void) { return lock_state()->sticky_error; }

KILN_FAKE_CUDA_EXPORT unsigned long long kiln_fake_cuda_launch_count(void) {
  return lock_state()->launch_count;
}
