// The process's one pthread_atfork registration for kiln's objects (see fork_hooks.h).
#include "kiln/rhi/fork_hooks.h"

#include <pthread.h>

#include <atomic>
#include <map>
#include <new>

namespace kiln {
namespace {

// Never destroyed: a fork() or a thread may still unregister after static destructors ran.
struct ForkRegistry {
  std::mutex mutex;  // held from prepare to parent/child: no registration changes mid-fork
  std::map<uint64_t, ForkHooks> hooks;  // by id: registration order
  uint64_t next_id = 1;
};

ForkRegistry &registry() {
  static auto *r = new ForkRegistry;
  return *r;
}

std::atomic<uint64_t> g_fork_generation{0};

void run_prepare() {
  ForkRegistry &r = registry();
  r.mutex.lock();
  for (auto &[id, hooks] : r.hooks)
    if (hooks.prepare) hooks.prepare();
}

void run_parent() {
  ForkRegistry &r = registry();
  for (auto it = r.hooks.rbegin(); it != r.hooks.rend(); ++it)
    if (it->second.parent) it->second.parent();
  r.mutex.unlock();
}

void run_child() {
  g_fork_generation.fetch_add(1, std::memory_order_relaxed);
  ForkRegistry &r = registry();
  for (auto it = r.hooks.rbegin(); it != r.hooks.rend(); ++it)
    if (it->second.child) it->second.child();
  r.mutex.unlock();  // the forking thread took it in prepare; it is this thread in the child
}

void install_once() {
  static std::once_flag once;
  std::call_once(once, [] { pthread_atfork(run_prepare, run_parent, run_child); });
}

}  // namespace

ForkRegistration::ForkRegistration(ForkHooks hooks) {
  install_once();
  ForkRegistry &r = registry();
  std::lock_guard lock(r.mutex);
  id_ = r.next_id++;
  r.hooks.emplace(id_, std::move(hooks));
}

ForkRegistration::~ForkRegistration() {
  ForkRegistry &r = registry();
  std::lock_guard lock(r.mutex);
  r.hooks.erase(id_);
}

uint64_t fork_generation() {
  install_once();
  return g_fork_generation.load(std::memory_order_relaxed);
}

ForkSafeMutex::ForkSafeMutex(Policy policy)
    : registration_(policy == Policy::hold_across_fork
                        ? ForkHooks{[this] { mutex_.lock(); }, [this] { mutex_.unlock(); },
                                    [this] { mutex_.unlock(); }}
                        : ForkHooks{nullptr, nullptr, [this] {
                                      // A thread of the parent may have held it: the child's
                                      // copy is made anew (the old one is never unlocked).
                                      mutex_.~mutex();
                                      new (&mutex_) std::mutex();
                                    }}) {}

}  // namespace kiln
