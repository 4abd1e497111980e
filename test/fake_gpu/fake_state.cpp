// The shared core's state: environment parsing, fault plan, call bookkeeping, memory accounting
// and the memory and module operations both API layers run.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <pthread.h>
#include <thread>
#include <utility>

#include "fake_gpu.h"

namespace kiln::fake_gpu {
namespace {

constexpr std::size_t kAllocationAlignment = 256;  // what cuMemAlloc and hipMalloc guarantee

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

/// A comma-separated list of MiB counts (each at most 2^40) as byte counts; nullopt if any item
/// is not a decimal count.
std::optional<std::vector<std::size_t>> parse_mib_list(std::string_view list) {
  constexpr uint64_t kMiB = uint64_t{1} << 20;
  std::vector<std::size_t> bytes;
  const bool ok = for_each_item(list, [&](std::string_view item) {
    uint64_t mib = 0;
    if (!parse_u64(item, &mib) || mib > (uint64_t{1} << 40)) return false;
    bytes.push_back(static_cast<std::size_t>(mib * kMiB));
    return true;
  });
  if (!ok) return std::nullopt;
  return bytes;
}

/// The variable KILN_FAKE_<API>_<suffix> and its value ("" when unset).
struct EnvVar {
  std::string name;
  std::string_view value;
};
EnvVar env(const char *suffix) {
  std::string name = std::string(dialect().env_prefix) + suffix;
  const char *value = std::getenv(name.c_str());
  return {std::move(name), value != nullptr ? value : ""};
}

/// Reads the environment into `state`; returns a description of the first malformed variable.
std::string read_environment(State &state) {
  if (const EnvVar devices = env("DEVICES"); !devices.value.empty()) {
    uint64_t count = 0;
    if (!parse_u64(trim(devices.value), &count) || count < 1 || count > kMaxDevices) {
      return devices.name + "='" + std::string(devices.value) + "' is not a device count from 1 to " +
             std::to_string(kMaxDevices);
    }
    state.devices = std::vector<Device>(count);
  }
  if (const EnvVar capacity = env("CAPACITY_MB"); !capacity.value.empty()) {
    // One MiB count for every device, or one per device ("256,512").
    const std::optional<std::vector<std::size_t>> capacities = parse_mib_list(capacity.value);
    if (!capacities || (capacities->size() != 1 && capacities->size() != state.devices.size())) {
      return capacity.name + "='" + std::string(capacity.value) +
             "' is not a MiB count, or a list of one per device (" +
             std::to_string(state.devices.size()) + ")";
    }
    for (std::size_t i = 0; i < state.devices.size(); ++i) {
      state.devices[i].capacity_bytes = (*capacities)[std::min(i, capacities->size() - 1)];
    }
  }
  if (const EnvVar other = env("OTHER_MB"); !other.value.empty()) {
    const std::optional<std::vector<std::size_t>> script = parse_mib_list(other.value);
    if (!script) {
      return other.name + "='" + std::string(other.value) +
             "' is not a comma-separated list of MiB counts";
    }
    for (Device &device : state.devices) {  // each device follows the script on its own
      device.other_script = *script;
      device.other_bytes = script->front();
    }
  }
  if (const EnvVar faults = env("FAULTS"); !faults.value.empty()) {
    std::string bad;
    for_each_item(faults.value, [&](std::string_view item) {
      // <entry>@<n>=<result> or <entry>@*=<result>
      const std::size_t at = item.find('@');
      const std::size_t eq = item.find('=');
      uint64_t nth = 0;
      int result = 0;
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
      return faults.name + " item '" + bad +
             "' is not <entry point>@<call number or *>=<result number or name>";
    }
  }
  if (const EnvVar arch = env("ARCH"); !arch.value.empty()) {
    if (!dialect().is_valid_arch(arch.value))
      return arch.name + "='" + std::string(arch.value) + "' is not a processor this fake knows how to name";
    state.arch = std::string(arch.value);
  }
  if (const EnvVar mode = env("MODE"); !parse_mode(mode.value, &state.mode)) {
    return mode.name + "='" + std::string(mode.value) + "' is not normal, stub or nodevice";
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
  static auto *mutex = [] {
    auto *created = new std::mutex();
    // A fork while another thread is inside an entry point would leave the child a lock no
    // thread of its own will release. Like a real driver, the fake takes its lock around fork
    // so that the child starts with the lock free and the state between calls.
    pthread_atfork([] { global_mutex().lock(); }, [] { global_mutex().unlock(); },
                   [] { global_mutex().unlock(); });
    return created;
  }();
  return *mutex;
}

}  // namespace

bool parse_mode(std::string_view text, Mode *mode) {
  if (text.empty() || text == "normal") *mode = Mode::normal;
  else if (text == "stub") *mode = Mode::stub;
  else if (text == "nodevice") *mode = Mode::nodevice;
  else return false;
  return true;
}

bool is_entry_point(std::string_view name) {
  return std::find(dialect().entry_points.begin(), dialect().entry_points.end(), name) !=
         dialect().entry_points.end();
}

const char *error_name(int code) {
  for (const NamedCode &named : dialect().codes) {
    if (named.code == code) return named.name;
  }
  return nullptr;
}

bool parse_result(std::string_view text, int *result) {
  for (const NamedCode &named : dialect().codes) {
    if (text == named.name) {
      *result = named.code;
      return true;
    }
  }
  uint64_t value = 0;
  if (!parse_u64(text, &value) || value > 100000) return false;
  *result = static_cast<int>(value);
  return true;
}

void Device::release_device_memory() {
  for (auto &[address, allocation] : allocations) std::free(allocation.host);
  allocations.clear();
  held_bytes = 0;
  modules.clear();
  module_bytes = 0;
}

void Device::create_context() {
  if (context_live) return;
  context_live = true;
  ++contexts_created;
}

void Device::destroy_context() {
  release_device_memory();
  sticky_error = dialect().success;
  context_live = false;
}

std::size_t Device::free_bytes() const {
  const std::size_t used = held_bytes + module_bytes + other_bytes;
  return used >= capacity_bytes ? 0 : capacity_bytes - used;
}

bool Device::device_range_ok(uint64_t address, uint64_t size_bytes) const {
  auto it = allocations.upper_bound(address);
  if (it == allocations.begin()) return false;
  --it;
  const uint64_t offset = address - it->first;
  return offset <= it->second.size_bytes && size_bytes <= it->second.size_bytes - offset;
}

int State::first_sticky_error() const {
  for (const Device &d : devices) {
    if (d.sticky_error != dialect().success) return d.sticky_error;
  }
  return dialect().success;
}

Device *State::device(int ordinal) {
  return ordinal >= 0 && ordinal < device_count() ? &devices[static_cast<std::size_t>(ordinal)] : nullptr;
}

const Device &State::current() const {
  const int ordinal = dialect().current_device(*this);
  return devices[ordinal >= 0 && ordinal < device_count() ? static_cast<std::size_t>(ordinal) : 0];
}

Device &State::current() { return const_cast<Device &>(std::as_const(*this).current()); }

void State::release_device_memory() {
  for (Device &device : devices) device.release_device_memory();
}

void State::load_environment() {
  config_error = read_environment(*this);
  if (!config_error.empty()) {
    const char *invalid = error_name(dialect().invalid_value);
    std::fprintf(stderr, "%s: %s; %s will fail with %s\n", dialect().title, config_error.c_str(),
                 dialect().init_entry, invalid != nullptr ? invalid : "invalid value");
  }
}

int State::planned_fault(std::string_view entry) {
  const auto faults_it = faults.find(entry);
  if (faults_it == faults.end()) return dialect().success;
  const uint64_t count = call_counts.find(entry)->second;
  for (const Fault &fault : faults_it->second) {
    if (fault.at_call == 0 || fault.at_call == count) return fault.result;
  }
  return dialect().success;
}

bool State::add_fault(std::string_view entry, uint64_t nth_call, int result) {
  if (!is_entry_point(entry)) return false;
  const auto count_it = call_counts.find(entry);
  const uint64_t calls_so_far = count_it == call_counts.end() ? 0 : count_it->second;
  faults[std::string(entry)].push_back({nth_call == 0 ? 0 : calls_so_far + nth_call, result});
  return true;
}

void reset_state(State &state) {
  state.release_device_memory();
  state = State();
  state.arch = dialect().default_arch;
  state.load_environment();
}

LockedState lock_state() {
  std::unique_lock lock(global_mutex());
  return {std::move(lock), &global_state()};
}

// --- the pause hook ------------------------------------------------------------------------------

namespace {
std::atomic<bool> g_paused{false};
}  // namespace

void pause_in(std::string_view entry, unsigned hold_ms) {
  auto state = lock_state();
  state->pause_entry = std::string(entry);
  state->pause_ms = hold_ms;
  g_paused.store(false);
}

bool paused() { return g_paused.load(); }

// --- Call ----------------------------------------------------------------------------------------

Call::Call(const char *entry, Needs needs, int on_device)
    : state(lock_state()), answer(dialect().success), device(kOnNoDevice) {
  ++state->call_counts[entry];
  if (!state->pause_entry.empty() && state->pause_entry == entry) {
    state->pause_entry.clear();
    g_paused.store(true);
    std::this_thread::sleep_for(std::chrono::milliseconds(state->pause_ms));
  }
  const Dialect &d = dialect();
  if (needs == Needs::context || on_device == kOnCurrentDevice) on_device = d.current_device(*state.state);
  const Device *acted_on = state->device(on_device);
  if (acted_on != nullptr) device = on_device;
  // Only the sticky error of the device this call acts on reaches it: a fault on device k
  // poisons device k's calls, never another device's or a device-less call (cuInit...).
  const bool poisoned = acted_on != nullptr && acted_on->sticky_error != d.success &&
                        needs != Needs::teardown && needs != Needs::select;
  if (state->mode == Mode::stub) answer = d.stub;
  else if (poisoned) answer = acted_on->sticky_error;
  else if (const int fault = state->planned_fault(entry); fault != d.success) answer = fault;
  else if (needs != Needs::nothing && !state->initialized) answer = d.not_initialized;
  else if (needs == Needs::context && !d.has_current(*state.state)) answer = d.invalid_context;
  done = answer != d.success;
  if (!done && needs == Needs::context) state->current().create_context();
}

int Call::result(int code) {
  if (Device *acted_on = state->device(device); acted_on != nullptr && dialect().is_sticky(code))
    acted_on->sticky_error = code;
  return code;
}

// --- memory --------------------------------------------------------------------------------------

int memory_info(State &state, std::size_t *free_bytes, std::size_t *total_bytes) {
  if (free_bytes == nullptr || total_bytes == nullptr) return dialect().invalid_value;
  Device &device = state.current();
  // Other processes' usage follows the script: one value per call, the last one stays.
  device.other_bytes = device.other_script[std::min(device.other_index, device.other_script.size() - 1)];
  if (device.other_index < device.other_script.size()) ++device.other_index;
  *free_bytes = device.free_bytes();
  *total_bytes = device.capacity_bytes;
  return dialect().success;
}

int allocate(State &state, std::size_t size_bytes, uint64_t *address) {
  if (address == nullptr || size_bytes == 0) return dialect().invalid_value;
  Device &device = state.current();
  if (size_bytes > device.free_bytes()) {
    ++device.oom_count;
    return dialect().out_of_memory;
  }
  const std::size_t rounded = (size_bytes + kAllocationAlignment - 1) / kAllocationAlignment *
                              kAllocationAlignment;
  void *host = std::aligned_alloc(kAllocationAlignment, rounded);
  if (host == nullptr) {
    ++device.oom_count;
    return dialect().out_of_memory;
  }
  const auto at = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(host));
  device.allocations[at] = Allocation{host, size_bytes};
  device.held_bytes += size_bytes;
  device.high_water_bytes = std::max(device.high_water_bytes, device.held_bytes);
  state.high_water_bytes = std::max(state.high_water_bytes, state.total(&Device::held_bytes));
  *address = at;
  return dialect().success;
}

int free_allocation(State &state, uint64_t address) {
  Device &device = state.current();
  const auto it = device.allocations.find(address);
  if (it == device.allocations.end()) return dialect().invalid_value;  // not a live allocation's start
  std::free(it->second.host);
  device.held_bytes -= it->second.size_bytes;
  device.allocations.erase(it);
  return dialect().success;
}

int copy_to_device(State &state, uint64_t dst, const void *src, std::size_t size_bytes) {
  if (size_bytes == 0) return dialect().success;
  if (src == nullptr || !state.device_range_ok(dst, size_bytes)) return dialect().invalid_value;
  std::memcpy(reinterpret_cast<void *>(static_cast<uintptr_t>(dst)), src, size_bytes);
  return dialect().success;
}

int copy_to_host(State &state, void *dst, uint64_t src, std::size_t size_bytes) {
  if (size_bytes == 0) return dialect().success;
  if (dst == nullptr || !state.device_range_ok(src, size_bytes)) return dialect().invalid_value;
  std::memcpy(dst, reinterpret_cast<const void *>(static_cast<uintptr_t>(src)), size_bytes);
  return dialect().success;
}

int copy_device(State &state, uint64_t dst, uint64_t src, std::size_t size_bytes) {
  if (size_bytes == 0) return dialect().success;
  if (!state.device_range_ok(dst, size_bytes) || !state.device_range_ok(src, size_bytes)) {
    return dialect().invalid_value;
  }
  std::memmove(reinterpret_cast<void *>(static_cast<uintptr_t>(dst)),
               reinterpret_cast<const void *>(static_cast<uintptr_t>(src)), size_bytes);
  return dialect().success;
}

int memset8(State &state, uint64_t dst, unsigned char value, std::size_t count) {
  if (count == 0) return dialect().success;
  if (!state.device_range_ok(dst, count)) return dialect().invalid_value;
  std::memset(reinterpret_cast<void *>(static_cast<uintptr_t>(dst)), value, count);
  return dialect().success;
}

// --- modules -------------------------------------------------------------------------------------

int add_module(State &state, std::unique_ptr<Module> module, std::size_t size_bytes, Module **handle) {
  Device &device = state.current();
  if (size_bytes > device.free_bytes()) return dialect().out_of_memory;  // code lives in device memory too
  module->charged_bytes = size_bytes;
  state.last_module_target = module->target;
  device.module_bytes += size_bytes;
  *handle = module.get();
  device.modules.emplace(module.get(), std::move(module));
  return dialect().success;
}

int unload_module(State &state, Module *module) {
  Device &device = state.current();
  const auto it = device.modules.find(module);
  if (it == device.modules.end()) return dialect().invalid_handle;
  device.module_bytes -= it->second->charged_bytes;
  device.modules.erase(it);  // its functions go with it
  return dialect().success;
}

int get_function(State &state, Module *module, const char *name, Function **function) {
  if (function == nullptr || name == nullptr) return dialect().invalid_value;
  const auto it = state.current().modules.find(module);
  if (it == state.current().modules.end()) return dialect().invalid_handle;
  Module &loaded = *it->second;
  if (const auto known = loaded.functions.find(std::string_view(name)); known != loaded.functions.end()) {
    *function = known->second.get();
    return dialect().success;
  }
  const HostKernel *kernel = find_host_kernel(name);
  const bool user_entry = loaded.user && std::string_view(name) == kiln::runtime::kUserGpuEntryName;
  if (!loaded.entries.contains(std::string_view(name)) || (kernel == nullptr && !user_entry))
    return dialect().not_found;
  auto created = std::make_unique<Function>();
  created->module = module;
  created->kernel = kernel;
  if (user_entry) created->user = loaded.user.get();
  *function = created.get();
  loaded.functions.emplace(name, std::move(created));
  return dialect().success;
}

}  // namespace kiln::fake_gpu
