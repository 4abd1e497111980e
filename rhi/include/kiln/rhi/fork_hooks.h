// fork() support: the objects that own threads or locks say what to do around a fork(), so a
// child process never waits for a lock or a thread that only existed in its parent.
#ifndef KILN_RHI_FORK_HOOKS_H_
#define KILN_RHI_FORK_HOOKS_H_

#include <cstdint>
#include <functional>
#include <mutex>

namespace kiln {

/// What an object does around fork() (pthread_atfork's three moments). Any may be empty.
/// `prepare` runs in the forking thread before the fork (e.g. takes a lock, so that no other
/// thread is inside the object when the process is copied); then `parent` runs in the parent,
/// or `child` in the child (where the forking thread is the only thread).
struct ForkHooks {
  std::function<void()> prepare;
  std::function<void()> parent;
  std::function<void()> child;
};

/// Keeps a ForkHooks registered while it lives. prepare hooks run in registration order, parent
/// and child hooks in the reverse order. Hooks must not register or unregister hooks. Making and
/// destroying registrations is thread-safe; both wait for a fork in progress, so never make or
/// destroy one while holding a hold_across_fork ForkSafeMutex (the fork would wait for it).
class ForkRegistration {
 public:
  explicit ForkRegistration(ForkHooks hooks);
  ~ForkRegistration();
  ForkRegistration(const ForkRegistration &) = delete;
  ForkRegistration &operator=(const ForkRegistration &) = delete;

 private:
  uint64_t id_;
};

/// How many fork()s lie between this process and the one kiln was loaded in: 0 there, 1 in its
/// child, 2 in a grandchild. Objects bound to a process (a GPU driver context) compare it with
/// the generation they were made in. Thread-safe, lock-free.
[[nodiscard]] uint64_t fork_generation();

/// A std::mutex (lock/unlock/try_lock, for std::lock_guard and std::unique_lock) that a fork()
/// cannot leave locked in the child by a thread that does not exist there.
///  - hold_across_fork: prepare takes it (waits until no other thread is inside), the parent and
///    the child release it. For locks never held while waiting for something the forking thread
///    may hold (the Python GIL): the data it guards is whole in the child.
///  - reset_in_child: the child makes it anew, unlocked. For locks that may be held while
///    waiting for the GIL (a launch runs OOM observers); what a thread of the parent was doing
///    under it is abandoned in the child.
class ForkSafeMutex {
 public:
  enum class Policy : uint8_t { hold_across_fork, reset_in_child };
  explicit ForkSafeMutex(Policy policy);
  ForkSafeMutex(const ForkSafeMutex &) = delete;
  ForkSafeMutex &operator=(const ForkSafeMutex &) = delete;

  void lock() { mutex_.lock(); }
  void unlock() { mutex_.unlock(); }
  [[nodiscard]] bool try_lock() { return mutex_.try_lock(); }

 private:
  std::mutex mutex_;
  ForkRegistration registration_;  // after mutex_: unregistered before the mutex goes
};

}  // namespace kiln

#endif  // KILN_RHI_FORK_HOOKS_H_
