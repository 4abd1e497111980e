// BudgetAdaptor: growth of the misses, all or nothing, at their size classes and, if rounding
// was refused, at their exact sizes. The budget reserves first (this adaptor is its reclaim
// hook: evict, then ask again), then the live check (live_free_check.cpp), then the driver.
#include "kiln/runtime/memory/budget_adaptor.h"

#include "thread_cache.h"

namespace kiln::runtime {

ReusedBlocks ReusedBlocks::of(std::span<const AllocRequest> requests,
                              std::span<const AllocationSlot> slots) {
  ReusedBlocks reused;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (slots[i].hit == nullptr) continue;
    ++reused.count;
    reused.size_bytes = saturating_add(reused.size_bytes, requests[i].size_bytes);
    reused.class_bytes = saturating_add(reused.class_bytes,
                                        slots[i].hit->class_bytes.load(std::memory_order_relaxed));
  }
  return reused;
}

BudgetAdaptor::BudgetAdaptor(LlvmDevice &device, GrowthOwner &owner, uint64_t limit_bytes,
                             uint64_t reserve_bytes, bool live_check)
    : device_(device),
      owner_(owner),
      budget_(limit_bytes),
      reserve_bytes_(reserve_bytes),
      live_check_(live_check) {}

uint64_t BudgetAdaptor::unreclaimable_bytes(const CategoryBytes &held) {
  uint64_t bytes = 0;  // what eviction cannot give back
  for (std::size_t i = 0; i < held.size(); ++i)
    if (i != static_cast<std::size_t>(MemoryCategory::pool_cache)) bytes += held[i];
  return bytes;
}

uint64_t BudgetAdaptor::unreclaimable_bytes() const {
  return unreclaimable_bytes(owner_.in_use_by_category());
}

bool BudgetAdaptor::reclaim() {
  // Other threads may take the room an eviction made and cache their blocks again before this
  // one asks: the budget goes a few rounds, each evicting what they cached meanwhile. The
  // owner's eviction returns only once any eviction another thread was running has given its
  // bytes back to the ledger.
  const bool evicted = owner_.evict_for_retry();
  counters_.retries.fetch_add(1, std::memory_order_relaxed);
  return evicted;
}

BudgetAdaptor::Misses BudgetAdaptor::Misses::of(std::span<const AllocRequest> requests,
                                                std::span<const AllocationSlot> slots) {
  Misses m;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (slots[i].hit != nullptr) continue;
    if (m.size_bytes == 0) m.category = requests[i].category;
    m.size_bytes = saturating_add(m.size_bytes, requests[i].size_bytes);
    m.class_bytes = saturating_add(m.class_bytes, slots[i].class_bytes);
  }
  return m;
}

AllocationFigures BudgetAdaptor::group_figures(const Misses &misses, const ReusedBlocks &reused,
                                               bool exact_try) {
  AllocationFigures figures{misses.category, saturating_add(misses.size_bytes, reused.size_bytes),
                            0};
  // On the exact-size try the classes were refused first: the class of the whole group.
  const uint64_t class_total = saturating_add(misses.class_bytes, reused.class_bytes);
  if (exact_try && class_total > figures.requested_bytes) figures.class_bytes = class_total;
  return figures;
}

bool BudgetAdaptor::refuses_outright(const Misses &misses, bool observers, CategoryBytes &held) {
  // Outright only when even the exact sizes do not fit (rounding never refuses what fits).
  if (budget_.fits(misses.size_bytes) || observers) return false;
  held = owner_.in_use_by_category();  // the refusal's picture, too
  return !budget_.fits_after_reclaim(misses.size_bytes, unreclaimable_bytes(held));
}

Failure BudgetAdaptor::refused_outright(const Misses &misses, const CategoryBytes &held) {
  const AllocationFigures figures{misses.category, misses.size_bytes,
                                  misses.class_bytes > misses.size_bytes ? misses.class_bytes : 0};
  Failure f = budget_.refusal(RefusalReport{figures, {}}, "BudgetAdaptor::refused_outright", &held);
  owner_.fill_picture(f, held);  // the view the decision took: not read twice
  counters_.budget_refusals.fetch_add(1, std::memory_order_relaxed);
  return f;
}

void BudgetAdaptor::count_refusal(const Failure &failure) {
  if (failure.result != RhiResult::out_of_memory || failure.oom_source != OomSource::budget) return;
  auto &counter = failure.budget_check == BudgetCheck::live_free ? counters_.live_refusals
                                                                 : counters_.budget_refusals;
  counter.fetch_add(1, std::memory_order_relaxed);
}

RhiStatus BudgetAdaptor::charge(MemoryCategory category, uint64_t size_bytes) {
  const CategoryRequest request{category, size_bytes};
  auto reservation = budget_.reserve(std::span<const CategoryRequest>(&request, 1), *this);
  if (!reservation) {
    Failure f = std::move(reservation).error();
    if (f.result == RhiResult::out_of_memory) owner_.fill_picture(f, owner_.in_use_by_category());
    count_refusal(f);
    return std::unexpected(std::move(f));
  }
  reservation->commit();
  return {};
}

RhiStatus BudgetAdaptor::grow(std::span<const AllocRequest> requests,
                              std::span<AllocationSlot> slots, std::span<CategoryRequest> growth,
                              const Misses &misses, const ReusedBlocks &reused) {
  for (AllocationSlot &slot : slots) slot.block_bytes = slot.class_bytes;
  auto grown = grow_misses(requests, slots, growth, misses, reused, false);
  if (grown || !rounding_refused(grown.error(), misses)) return grown;
  // Rounding never refuses what fits unrounded: the exact sizes, once (budget, live free memory
  // and driver alike). Such blocks are cached under their own sizes.
  for (std::size_t i = 0; i < requests.size(); ++i) slots[i].block_bytes = requests[i].size_bytes;
  return grow_misses(requests, slots, growth, misses, reused, true);
}

bool BudgetAdaptor::rounding_refused(const Failure &failure, const Misses &misses) {
  if (misses.class_bytes == misses.size_bytes || failure.result != RhiResult::out_of_memory)
    return false;
  // The limit or the live check refused the classes: they decide the exact sizes just as surely.
  if (failure.oom_source == OomSource::budget) return true;
  // The driver refused a class: rounding was the cause only if, by the device's own account, the
  // exact sizes fit and the classes do not (an injected or other refusal stays one).
  if (failure.oom_source != OomSource::driver || failure.injected) return false;
  const auto info = device_.memory_info();
  return info && misses.size_bytes <= info->free_bytes && info->free_bytes < misses.class_bytes;
}

RhiStatus BudgetAdaptor::grow_misses(std::span<const AllocRequest> requests,
                                     std::span<AllocationSlot> slots,
                                     std::span<CategoryRequest> growth, const Misses &misses,
                                     const ReusedBlocks &reused, bool exact_try) {
  // The misses are reserved together, checked against live free memory, allocated.
  std::size_t n_growth = 0;
  uint64_t growth_bytes = 0;  // what the device must give
  for (std::size_t i = 0; i < requests.size(); ++i)
    if (slots[i].hit == nullptr) {
      growth[n_growth++] = {requests[i].category, slots[i].block_bytes};
      growth_bytes += slots[i].block_bytes;  // the budget refuses a sum that wraps before it is used
    }
  // How a budget refusal of this try names it: the whole group (formatted only if refused).
  const RefusalReport report{group_figures(misses, reused, exact_try),
                             GroupReuse{requests.size(), reused.count, reused.size_bytes}};
  auto reservation = budget_.reserve(growth.first(n_growth), *this, &report);
  if (!reservation) return std::unexpected(std::move(reservation).error());
  const auto growing = serialize_growth();  // held until every block is allocated
  KILN_RETURN_IF_ERROR(check_live_free(growth_bytes, report));
  for (std::size_t i = 0; i < requests.size(); ++i) {
    if (slots[i].hit != nullptr) continue;
    // On the exact-size try this block's class was refused first: its failure names that class.
    const bool rounded = exact_try && slots[i].class_bytes > requests[i].size_bytes;
    auto block = allocate_block(requests[i], slots[i].block_bytes,
                                rounded ? slots[i].class_bytes : 0);
    if (!block) {
      free_grown(requests, slots.first(i));
      return std::unexpected(std::move(block).error());  // then the rest of the reservation goes
    }
    slots[i].block = *block;
    // Held from here on: the peaks count it even if a later block evicts the cache first.
    reservation->commit_part(requests[i].category, slots[i].block_bytes);
  }
  return {};
}

RhiExpected<DeviceAllocation> BudgetAdaptor::allocate_block(const AllocRequest &request,
                                                            uint64_t block_bytes,
                                                            uint64_t refused_class_bytes) {
  LlvmRuntimeAllocParams params;
  params.size_bytes = block_bytes;
  params.category = request.category;
  params.zero_fill = request.zero_fill;
  params.requested_bytes = request.size_bytes;  // what a failure reports, not the block's size
  params.class_bytes = refused_class_bytes;
  auto alloc = device_.allocate_runtime(params);
  if (!alloc && alloc.error().result == RhiResult::out_of_memory) {
    counters_.driver_ooms.fetch_add(1, std::memory_order_relaxed);
    if (owner_.evict_for_retry()) {  // the driver said no: give the cache back and try once more
      counters_.retries.fetch_add(1, std::memory_order_relaxed);
      alloc = device_.allocate_runtime(params);
      if (!alloc && alloc.error().result == RhiResult::out_of_memory)
        counters_.driver_ooms.fetch_add(1, std::memory_order_relaxed);
    }
  }
  return alloc;
}

void BudgetAdaptor::free_grown(std::span<const AllocRequest> requests,
                              std::span<const AllocationSlot> slots) {
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].hit != nullptr) continue;
    ignore_result(device_.dealloc_memory(slots[i].block),
                  "error path: the refusal is the answer; the device defers a refused free to "
                  "synchronize()");
    budget_.release(requests[i].category, slots[i].block_bytes);  // committed when it was grown
  }
}

}  // namespace kiln::runtime
