// The module's global state (see executor_state.h): the one executor and kiln.init, the observers
// and fault blocks tied to it, and interpreter exit while other threads are inside kiln.
//
// Threading: the executor and its lists are guarded by the GIL; the count of calls inside kiln is
// atomic. Executor creation (the JIT) runs without the GIL. Errors: InvalidTypeError and
// InvalidUsageError for init's arguments (conversions.h), executor failures by check()
// (error_mapping.h).
#include "executor_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "conversions.h"
#include "error_mapping.h"
#include "kiln/rhi/fork_hooks.h"
#include "kiln/rhi/teardown_failures.h"
#include "registration.h"
#include "signatures.h"
#include "kiln_stub_docstrings.h"

namespace kiln::python {
namespace {

// ----------------------------------------------------------------------------------------------
// Interpreter exit while other threads are inside kiln.
//
// CPython ends a daemon thread that takes the GIL back during finalization (pthread_exit, a
// forced unwind). Inside kiln that unwind would run C++ destructors that touch Python objects
// without the GIL, or a noexcept destructor (std::terminate). So kiln closes its door first: its
// exit hook (kiln._shutdown, run by atexit while the interpreter is still whole) makes every
// later call from another thread park for good (GIL released, never back into Python, gone
// with the process) and waits, GIL released, for the calls already inside to return.

constexpr auto kShutdownWait = std::chrono::seconds(10);  // a call inside kiln that never ends
std::atomic<int> g_calls_inside{0};  // outermost kiln calls in progress, every thread (add_with_gil)
std::thread::id g_closing_thread;  // guarded by the GIL: the thread that ran kiln._shutdown
constinit thread_local int t_call_depth __attribute__((tls_model("initial-exec"))) = 0;  // initial-exec: see error_mapping.cpp

[[noreturn]] void park_forever() {
  (void)PyEval_SaveThread();  // releases the GIL; this thread never takes it back
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// A forked child has only the forking thread: the calls other threads had in progress are not.
ForkRegistration g_calls_fork_registration(ForkHooks{
    nullptr, nullptr, [] {
      g_calls_inside.store(t_call_depth > 0 ? 1 : 0, std::memory_order_relaxed);
      g_calls_without_gil.store(t_calls_without_gil, std::memory_order_relaxed);
    }});

/// Waits (GIL released) until no other thread is inside kiln, at most kShutdownWait.
void wait_for_calls_inside() {
  const int mine = t_call_depth > 0 ? 1 : 0;
  without_gil([mine] {
    const auto deadline = std::chrono::steady_clock::now() + kShutdownWait;
    while (g_calls_inside.load(std::memory_order_acquire) > mine &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return 0;
  });
}

// ----------------------------------------------------------------------------------------------
// The global executor.

std::shared_ptr<LlvmRuntimeExecutor> g_executor;  // guarded by the GIL
std::vector<uint64_t> g_observer_ids;              // observers added from Python to g_executor
std::vector<FaultBlock> g_fault_blocks;            // see fault_blocks()
uint64_t g_executor_generation = 0;                // see executor_generation()

// ----------------------------------------------------------------------------------------------
// Borrows of the global executor (BorrowedExecutor).

int g_current_borrows = 0;  // open borrows of g_executor, every thread (guarded by the GIL)
/// This thread's innermost open borrow; each links to the one it is nested in.
constinit thread_local const BorrowedExecutor *t_innermost_borrow __attribute__((tls_model("initial-exec"))) = nullptr;

/// An executor kiln.init replaced while it was borrowed, with its open borrows.
struct RetiredExecutor {
  std::shared_ptr<LlvmRuntimeExecutor> executor;
  int borrows = 0;
};
/// The retired executors (guarded by the GIL). Never destroyed: at interpreter exit a thread that
/// CPython ends may still be inside one, and the list's static destructor would run it down.
std::vector<RetiredExecutor> &retired() {
  static auto *list = new std::vector<RetiredExecutor>;
  return *list;
}

/// Destroys the retired executors nobody borrows any more: the one whose last borrow just ended,
/// and a forked child's whose borrowers were other threads of the parent. Not after
/// kiln._shutdown: they go with the process.
void release_unborrowed() {
  if (g_closing.load(std::memory_order_acquire)) return;
  std::vector<RetiredExecutor> done;
  done.reserve(retired().size());  // the moves below cannot throw
  std::erase_if(retired(), [&done](RetiredExecutor &r) {
    if (r.borrows > 0) return false;
    done.push_back(std::move(r));
    return true;
  });
}  // `done` goes once the list is consistent: an executor's destructor may run anything

// A forked child has only the forking thread: its own borrows are the only ones still open.
ForkRegistration g_borrows_fork_registration(ForkHooks{
    nullptr, nullptr, [] {
      g_current_borrows = 0;
      for (RetiredExecutor &r : retired()) r.borrows = 0;
      for (const BorrowedExecutor *b = t_innermost_borrow; b != nullptr; b = b->enclosing()) {
        if (&**b == g_executor.get()) {
          ++g_current_borrows;
          continue;
        }
        for (RetiredExecutor &r : retired())
          if (r.executor.get() == &**b) ++r.borrows;
      }
    }});

/// Replaces the global executor. The old one's Python observers are removed first: its device
/// may live on (arrays keep it), and an observer that refers to such an array would otherwise
/// make a cycle through C++ that the garbage collector cannot see.
void replace_executor(std::shared_ptr<LlvmRuntimeExecutor> fresh) {
  if (g_executor)
    for (uint64_t id : g_observer_ids) (void)g_executor->memory().remove_oom_observer(id);
  g_observer_ids.clear();
  g_fault_blocks.clear();  // they armed the old executor's plan
  if (g_executor && g_current_borrows > 0) {  // BorrowedExecutor: kept until its borrows end
    retired().reserve(retired().size() + 1);  // push_back cannot throw with g_executor moved
    retired().push_back({std::move(g_executor), g_current_borrows});
  }
  g_current_borrows = 0;
  g_executor = std::move(fresh);
  ++g_executor_generation;
  release_unborrowed();
}

/// The most entries a mock_other_process_bytes script holds (one is read per memory query).
constexpr std::size_t kMaxScriptEntries = 1 << 20;

/// init's mock_other_process_bytes: an int or a list, tuple or 1-D array of at most
/// kMaxScriptEntries ints. Errors: InvalidTypeError, InvalidUsageError (a value out of range, too
/// many entries).
std::vector<uint64_t> to_bytes_script(const py::object &value) {
  if (is_integer(value)) return {to_bytes(value, "mock_other_process_bytes")};
  const bool int_vector = py::isinstance<py::array>(value) &&
                          py::reinterpret_borrow<py::array>(value).ndim() == 1;
  if (!int_vector && !py::isinstance<py::list>(value) && !py::isinstance<py::tuple>(value))
    raise_invalid_type("init", fmt::format("init: mock_other_process_bytes must be an int or a "
                                           "list of ints, got {} {}",
                                           type_name(value), std::string(py::repr(value))));
  std::vector<uint64_t> script;
  for (py::handle item : value) {
    if (script.size() == kMaxScriptEntries)  // a list subclass whose __iter__ never ends, too
      raise_invalid_usage("kiln", "init",
                          fmt::format("init: mock_other_process_bytes has more than {} entries",
                                      kMaxScriptEntries));
    script.push_back(to_bytes(item, "mock_other_process_bytes"));
  }
  return script;
}

/// The executor configuration of init's arguments, checked in the order they are declared.
ExecutorConfig to_config(py::handle arch, const py::object &budget_bytes,
                         const py::object &reserve_bytes, py::handle live_check, py::handle caching,
                         const py::object &device_heap_bytes, const py::object &mock_capacity_bytes,
                         const py::object &mock_other_process_bytes, const py::object &num_threads) {
  if (!py::isinstance<py::str>(arch))
    raise_invalid_type("init", fmt::format("init: arch must be a str (\"cpu\", \"mock\", \"cuda\", "
                                           "\"amdgpu\", or \"cuda:1\" ...), got {} {}",
                                           type_name(arch), std::string(py::repr(arch))));
  ExecutorConfig config;
  const DeviceName device = check(parse_device_name(to_text(arch, "arch", "init")));
  config.backend = device.backend;
  config.device_ordinal = device.ordinal;
  config.budget.limit_bytes = to_optional_bytes(budget_bytes, "budget_bytes");
  config.budget.reserve_bytes = to_optional_bytes(reserve_bytes, "reserve_bytes");
  config.budget.live_check = to_flag(live_check, "live_check", "init");
  config.budget.caching = to_flag(caching, "caching", "init");
  if (auto heap = to_optional_bytes(device_heap_bytes, "device_heap_bytes")) config.device_heap_bytes = *heap;
  if (auto cap = to_optional_bytes(mock_capacity_bytes, "mock_capacity_bytes")) config.mock.capacity_bytes = *cap;
  if (!mock_other_process_bytes.is_none())
    config.mock.other_process_bytes_script = to_bytes_script(mock_other_process_bytes);
  if (auto threads = to_optional_bytes(num_threads, "num_threads"))
    config.num_threads = static_cast<unsigned>(std::min<uint64_t>(*threads, 1024));
  return config;
}

/// Makes the executor of `config` (the JIT runs without the GIL). A lost device recovers only
/// once its driver context is released: the old executor goes first (its arrays, if any still
/// live, keep the context and the new one fails as lost).
std::shared_ptr<LlvmRuntimeExecutor> create_executor(ExecutorConfig config) {
  std::weak_ptr<DeviceContext> lost_context;
  if (g_executor && g_executor->device().is_lost()) {
    lost_context = g_executor->context();
    replace_executor(nullptr);
  }
  // The first executor JIT-compiles the kernels.
  RhiExpected<std::unique_ptr<LlvmRuntimeExecutor>> created =
      without_gil([&] { return LlvmRuntimeExecutor::create(std::move(config)); });
  if (!created && created.error().result == RhiResult::device_lost && !lost_context.expired())
    created.error().add_context(
        "arrays of the executor whose device was lost still hold its driver context: free or "
        "delete them, then call kiln.init again");  // recreate_executor's rule, for a shared_ptr
  return check(std::move(created));
}

/// Each device teardown that failed since the last call (teardown_failures.h: a release the driver
/// refused, so memory stays held on the device) as a RuntimeWarning. Errors: the warning itself
/// when a filter makes it an error; the failures not yet warned of are recorded again, for the
/// next call.
void warn_teardown_failures() {
  const std::vector<std::string> failures = take_teardown_failures();
  for (std::size_t i = 0; i < failures.size(); ++i) {
    if (PyErr_WarnEx(PyExc_RuntimeWarning, failures[i].c_str(), 1) == 0) continue;
    for (std::size_t rest = i + 1; rest < failures.size(); ++rest) record_teardown_failure(failures[rest]);
    throw py::error_already_set();
  }
}

void init(py::handle arch, const py::object &budget_bytes, const py::object &reserve_bytes,
          py::handle live_check, py::handle caching, const py::object &device_heap_bytes,
          const py::object &mock_capacity_bytes, const py::object &mock_other_process_bytes,
          const py::object &num_threads, const py::object &fault_at,
          const py::object &fail_sizes_at_least) {
  check_not_in_observer("init");
  ExecutorConfig config = to_config(arch, budget_bytes, reserve_bytes, live_check, caching,
                                    device_heap_bytes, mock_capacity_bytes,
                                    mock_other_process_bytes, num_threads);
  const std::optional<uint64_t> fault = to_optional_bytes(fault_at, "fault_at");
  const std::optional<uint64_t> fail_size = to_optional_bytes(fail_sizes_at_least, "fail_sizes_at_least");
  // Compiled user kernels hold the old executor's device context: a lost device recovers only
  // once they are gone (kiln/_kernels.py compiles them again for the new one).
  py::module_::import("kiln._kernels").attr("_clear_cache")();
  std::shared_ptr<LlvmRuntimeExecutor> fresh = create_executor(std::move(config));
  // Faults count from after the executor's own set-up, as kiln-ops --fault-at does.
  if (fault && *fault != 0) fresh->memory().fault_plan().fail_nth_allocation(*fault);
  if (fail_size) fresh->memory().fault_plan().fail_sizes_at_least(*fail_size);
  replace_executor(std::move(fresh));  // the old one goes; its arrays keep its device alive
  warn_teardown_failures();
}

/// kiln._shutdown (run by atexit): closes the door to other threads, waits for the calls inside.
void shutdown() {
  g_closing_thread = std::this_thread::get_id();
  g_closing.store(true, std::memory_order_release);
  wait_for_calls_inside();
  replace_executor(nullptr);
}

}  // namespace

CallGuard::CallGuard() {
  if (t_call_depth == 0) discard_stale_observer_interrupt();  // left by a call that threw past check()
  if (t_call_depth == 0 && g_closing.load(std::memory_order_acquire) &&
      std::this_thread::get_id() != g_closing_thread)
    park_forever();
  if (t_call_depth++ == 0) add_with_gil(g_calls_inside, 1);
}

CallGuard::~CallGuard() {
  if (--t_call_depth == 0) add_with_gil(g_calls_inside, -1);
}

std::shared_ptr<LlvmRuntimeExecutor> executor() {
  if (!g_executor) {
    py::object none = py::none();
    init(py::str("cpu"), none, none, py::bool_(true), py::bool_(true), none, none, none, none, none, none);
  }
  return g_executor;
}

namespace {

LlvmRuntimeExecutor &current_executor() {
  if (!g_executor) (void)executor();
  return *g_executor;
}

/// Ends a borrow of `ex`, a retired executor: the last one destroys it.
void end_retired_borrow(const LlvmRuntimeExecutor *ex) {
  auto &list = retired();
  const auto it = std::find_if(list.begin(), list.end(),
                               [ex](const RetiredExecutor &r) { return r.executor.get() == ex; });
  if (it == list.end() || --it->borrows > 0) return;
  release_unborrowed();
}

}  // namespace

BorrowedExecutor::BorrowedExecutor() : executor_(&current_executor()), enclosing_(t_innermost_borrow) {
  ++g_current_borrows;
  t_innermost_borrow = this;
}

BorrowedExecutor::~BorrowedExecutor() {
  t_innermost_borrow = enclosing_;
  // After kiln._shutdown a thread that CPython ends may unwind through here without the GIL:
  // nothing is counted or destroyed any more (the retired executors go with the process).
  if (g_closing.load(std::memory_order_acquire)) return;
  // The borrowed executor is alive (current or retired), so no other executor has its address.
  if (executor_ == g_executor.get())
    --g_current_borrows;
  else
    end_retired_borrow(executor_);
}

void check_not_in_observer(const char *site) {
  if (in_observer())
    raise_invalid_usage("kiln", site,
                        fmt::format("kiln.{} cannot run inside an OOM observer (the failing "
                                    "allocation is still in progress); observers may free arrays "
                                    "or call kiln.empty_cache()",
                                    site));
}

void remember_observer(uint64_t id) { g_observer_ids.push_back(id); }
void forget_observer(uint64_t id) { std::erase(g_observer_ids, id); }

std::vector<FaultBlock> &fault_blocks() { return g_fault_blocks; }

uint64_t executor_generation() { return g_executor_generation; }

uint64_t generation_of(const LlvmRuntimeExecutor &ex) {
  return &ex == g_executor.get() ? g_executor_generation : 0;
}

LlvmRuntimeExecutor *executor_of_generation(uint64_t generation) {
  return generation != 0 && generation == g_executor_generation ? g_executor.get() : nullptr;
}

void register_executor_state(py::module_ &m) {
  def_typed(m, "init",
            "(arch='cpu', *, budget_bytes=None, reserve_bytes=None, live_check=True, "
            "caching=True, device_heap_bytes=None, mock_capacity_bytes=None, "
            "mock_other_process_bytes=None, num_threads=None, fault_at=None, "
            "fail_sizes_at_least=None)",
            &init, doc("init"), py::arg("arch") = "cpu", py::kw_only(),
            py::arg("budget_bytes") = py::none(),
            py::arg("reserve_bytes") = py::none(), py::arg("live_check") = true,
            py::arg("caching") = true, py::arg("device_heap_bytes") = py::none(),
            py::arg("mock_capacity_bytes") = py::none(),
            py::arg("mock_other_process_bytes") = py::none(), py::arg("num_threads") = py::none(),
            py::arg("fault_at") = py::none(), py::arg("fail_sizes_at_least") = py::none(), guarded());
  def_typed(m, "device", "()", [] { return executor()->device().name(); }, doc("device"),
            guarded());
  def_typed(m, "_shutdown", "()", &shutdown);
  def_typed(m, "_executor_generation", "()", &executor_generation);
  // The device a name means, as "backend:ordinal" ("cuda" -> "cuda:0"): kiln.init's parser, for
  // the pytest plugin's options. Errors: InvalidTypeError (not a str), InvalidUsageError.
  def_typed(m, "_device_key", "(name)", [](py::handle name) {
    const DeviceName device = check(parse_device_name(to_text(name, "name", "_device_key")));
    return fmt::format("{}:{}", to_string(device.backend), device.ordinal);
  }, py::arg("name"), guarded());
  def_typed(m, "_retired_executors", "()", [] { return retired().size(); });  // BorrowedExecutor's, for tests
}

}  // namespace kiln::python
