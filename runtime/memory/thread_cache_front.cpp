// DeviceMemory's thread-cache front: binding each thread to its cache (and handing it back when
// the thread exits or the process forks) and the lock-free fast path (thread_cache.h). The
// locked path's cache operations and eviction are in cache_eviction.cpp.
#include <pthread.h>

#include <algorithm>
#include <new>
#include <thread>

#include <fmt/format.h>

#include "kiln/runtime/memory/device_memory.h"
#include "thread_cache.h"

namespace kiln::runtime {

namespace {

// The DeviceMemory objects alive now, by id, so an exiting thread knows which of its caches it
// may still hand back. Never destroyed: threads may exit after static destructors ran.
struct LiveMemories {
  std::mutex mutex;
  std::unordered_map<uint64_t, DeviceMemory *> by_id;
  std::atomic<uint64_t> next_id{1};
};
LiveMemories &live_memories() {
  static auto *live = new LiveMemories;
  return *live;
}

// The fast path's bindings: the caches this thread used last (two, so that a loop over two
// devices stays lock-free), and whose they are. Constant-initialized and trivially destructible,
// so reading one is a thread-pointer-relative load (initial-exec also inside the Python
// extension module).
struct FastBinding {
  uint64_t memory_id;
  detail::ThreadCache *cache;
};
constinit thread_local FastBinding t_fast[2] __attribute__((tls_model("initial-exec"))) = {};

// The cache the fast path binds to `memory_id`, or null.
[[gnu::always_inline]] inline detail::ThreadCache *bound_cache(uint64_t memory_id) {
  if (t_fast[0].memory_id == memory_id) [[likely]]
    return t_fast[0].cache;
  return t_fast[1].memory_id == memory_id ? t_fast[1].cache : nullptr;
}

void bind_fast(uint64_t memory_id, detail::ThreadCache *cache) {
  if (t_fast[0].memory_id != memory_id) t_fast[1] = t_fast[0];
  t_fast[0] = {memory_id, cache};
}

// Set in a child process after fork(): the parent's other threads are gone, possibly in the middle
// of a fast path, so the child keeps every fast path closed and never waits for one.
std::atomic<bool> g_forked_child{false};
constinit thread_local bool t_exiting __attribute__((tls_model("initial-exec"))) = false;

using detail::index;
using detail::kPoolCache;
using detail::to_signed;

}  // namespace

bool detail::in_forked_child() { return g_forked_child.load(std::memory_order_relaxed); }

// Every cache this thread has, for every DeviceMemory; hands them back when the thread exits.
struct ThreadBinding {
  std::vector<std::pair<uint64_t, detail::ThreadCache *>> caches;

  ~ThreadBinding() {
    t_exiting = true;
    t_fast[0] = t_fast[1] = {0, nullptr};
    LiveMemories &live = live_memories();
    std::lock_guard lock(live.mutex);
    for (const auto &[memory_id, cache] : caches) {
      auto it = live.by_id.find(memory_id);
      if (it != live.by_id.end()) it->second->retire_cache(cache);
    }
  }

  // Drops the caches of DeviceMemory objects that are gone.
  void prune() {
    LiveMemories &live = live_memories();
    std::lock_guard lock(live.mutex);
    std::erase_if(caches, [&](const auto &entry) { return !live.by_id.contains(entry.first); });
  }
};
thread_local ThreadBinding t_binding;

void DeviceMemory::install_fork_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    // The registry lock and every allocator's own lock are held across fork(), so the child sees
    // them whole (never held while waiting for the GIL: OOM observers run outside them). The
    // locks that only serialize (growth, eviction) may be held by a thread of the parent that
    // the child does not have: the child makes them anew.
    pthread_atfork(
        [] {
          live_memories().mutex.lock();
          for (const auto &[id, memory] : live_memories().by_id) memory->mutex_.lock();
        },
        [] {
          for (const auto &[id, memory] : live_memories().by_id) memory->mutex_.unlock();
          live_memories().mutex.unlock();
        },
        [] {
          g_forked_child.store(true, std::memory_order_relaxed);
          for (const auto &[id, memory] : live_memories().by_id) {
            memory->fast_path_.store(false, std::memory_order_relaxed);
            memory->adaptor_.reinit_after_fork();
            memory->evict_mutex_.~mutex();
            new (&memory->evict_mutex_) std::mutex();
            memory->mutex_.unlock();
          }
          live_memories().mutex.unlock();
        });
  });
}

DeviceMemory::DeviceMemory(LlvmDevice &device, uint64_t limit_bytes, uint64_t reserve_bytes,
                           bool live_check, bool caching)
    : device_(device),
      id_(live_memories().next_id.fetch_add(1)),
      adaptor_(device, *this, limit_bytes, reserve_bytes, live_check),
      caching_(caching),
      asymmetric_barrier_(detail::init_asymmetric_barrier()),
      blocks_(std::make_unique<detail::BlockRegistry>()),
      fault_plan_(*this) {
  install_fork_handler();
  fault_plan_changed();  // opens the fast path
  LiveMemories &live = live_memories();
  std::lock_guard lock(live.mutex);
  live.by_id.emplace(id_, this);
}

void DeviceMemory::fault_plan_changed() {
  fast_path_.store(caching_ && asymmetric_barrier_ && !fault_plan_.armed() &&
                       !g_forked_child.load(std::memory_order_relaxed),
                   std::memory_order_relaxed);
}

DeviceMemory::~DeviceMemory() {
  {
    LiveMemories &live = live_memories();
    std::lock_guard lock(live.mutex);  // an exiting thread no longer hands its cache back here
    live.by_id.erase(id_);
  }
  // Whatever is still live or cached goes back to the device: nothing outlives its allocator.
  std::vector<Record *> records;
  {
    std::lock_guard lock(mutex_);
    records = blocks_->all();
    caches_.clear();
  }
  for (Record *r : records)
    ignore_result(device_.dealloc_memory(
                      DeviceAllocation{&device_, r->alloc_id.load(std::memory_order_relaxed)}),
                  "destructor; the device defers a refused free to synchronize()");
}

// --- binding a thread to its cache -----------------------------------------------------------

void DeviceMemory::count(Counter counter, uint64_t n) {
  static_assert(std::tuple_size_v<decltype(Cache::counters)> == kNumCounters);
  Cache *cache = bound_cache(id_);  // the usual case, inline; else look the binding up
  if (cache == nullptr) cache = my_cache();
  if (cache != nullptr)
    Cache::add(cache->counters[counter], n);  // only this thread writes its cache's counters
  else
    counters_[counter].fetch_add(n, std::memory_order_relaxed);
}

DeviceMemory::Cache *DeviceMemory::my_cache() const {
  if (Cache *cache = bound_cache(id_); cache != nullptr) return cache;
  if (t_exiting || observers_.observing_here()) return nullptr;  // see detail::forget_binding
  for (const auto &[memory_id, cache] : t_binding.caches)
    if (memory_id == id_) {
      bind_fast(id_, cache);
      return cache;
    }
  return nullptr;
}

DeviceMemory::Cache *DeviceMemory::bind_cache() {
  // Made with caching off too: the cache then only counts (its bins stay empty).
  if (Cache *cache = my_cache(); cache != nullptr || t_exiting || observers_.observing_here())
    return cache;
  t_binding.prune();
  Cache *cache = nullptr;
  {
    std::lock_guard lock(mutex_);
    if (!free_caches_.empty()) {
      cache = free_caches_.back();  // a retired thread's: empty, its shares and counts zero
      free_caches_.pop_back();
      cache->bound = true;
    } else {
      cache = caches_.emplace_back(std::make_unique<Cache>()).get();
      cache->next.store(cache_list_.load(std::memory_order_relaxed), std::memory_order_relaxed);
      cache_list_.store(cache, std::memory_order_release);
    }
  }
  t_binding.caches.emplace_back(id_, cache);
  bind_fast(id_, cache);
  return cache;
}

detail::ThreadCache *detail::owned_cache(uint64_t memory_id) {
  if (t_exiting) return nullptr;
  for (const auto &[id, cache] : t_binding.caches)
    if (id == memory_id) return cache;
  return nullptr;
}

void detail::forget_binding(uint64_t memory_id) {
  for (FastBinding &binding : t_fast)
    if (binding.memory_id == memory_id) binding = {0, nullptr};
}

void DeviceMemory::retire_cache(Cache *cache) {
  // Called by the cache's own thread as it exits: nothing else uses the cache's fast path now.
  // The cache stays listed (lock-free readers may be walking the list), empty and zeroed, for the
  // next thread.
  std::lock_guard lock(mutex_);
  if (!cache->bound) return;
  for (Record *r : blocks_->all())
    if (r->owner.load(std::memory_order_relaxed) == cache)
      r->owner.store(nullptr, std::memory_order_relaxed);
  cache->owned_bytes.store(0, std::memory_order_relaxed);
  for (Record *r : cache->take_bins())
    pool_.put(DeviceAllocation{&device_, r->alloc_id.load(std::memory_order_relaxed)},
              r->class_bytes.load(std::memory_order_relaxed));
  for (std::size_t k = 0; k < kNumMemoryCategories; ++k) {
    Cache::add(moves_[k], cache->grant[k].load(std::memory_order_relaxed) -
                              cache->headroom[k].load(std::memory_order_relaxed));
    cache->grant[k].store(0, std::memory_order_relaxed);
    cache->headroom[k].store(0, std::memory_order_relaxed);
  }
  const uint64_t fast_allocations = cache->fast_allocations.exchange(0, std::memory_order_relaxed);
  retired_requests_ += fast_allocations + cache->requests.exchange(0, std::memory_order_relaxed);
  counters_[kAllocations].fetch_add(fast_allocations, std::memory_order_relaxed);
  counters_[kCacheHits].fetch_add(fast_allocations, std::memory_order_relaxed);
  counters_[kLockFreeHits].fetch_add(fast_allocations, std::memory_order_relaxed);
  counters_[kFrees].fetch_add(cache->fast_frees.exchange(0, std::memory_order_relaxed),
                              std::memory_order_relaxed);
  for (std::size_t c = 0; c < kNumCounters; ++c)
    counters_[c].fetch_add(cache->counters[c].exchange(0, std::memory_order_relaxed),
                           std::memory_order_relaxed);
  cache->bound = false;
  free_caches_.push_back(cache);
}

// --- the fast path: only this thread's cache, no lock, no read-modify-write ------------------
// allocate and free try it first; whatever it cannot serve (no cache yet, a miss, a drain
// request, a fault plan armed, zero_fill, not enough headroom) goes to the locked path, which
// keeps its stack frame and its calls out of the fast path's way.


uint64_t DeviceMemory::try_allocate_lock_free(MemoryCategory category, uint64_t size_bytes) {
  if (!fast_path_.load(std::memory_order_relaxed) || size_bytes == 0 ||
      category >= MemoryCategory::pool_cache || device_.is_lost()) [[unlikely]]
    return 0;
  Cache *cache = bound_cache(id_);
  if (cache == nullptr) [[unlikely]]
    return 0;
  Record *record = cache->try_take(category, size_bytes);
  return record != nullptr ? record->alloc_id.load(std::memory_order_relaxed) : 0;
}

bool DeviceMemory::try_free_lock_free(DeviceAllocation alloc) {
  if (alloc.device != &device_ || !fast_path_.load(std::memory_order_relaxed)) [[unlikely]]
    return false;
  Cache *cache = bound_cache(id_);
  return cache != nullptr && cache->try_keep(*blocks_, alloc.alloc_id);
}

}  // namespace kiln::runtime
