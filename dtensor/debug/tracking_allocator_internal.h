// dtensor/debug/tracking_allocator_internal.h: per-thread CPU memory accounting, under
// debug::MemTracker (dtensor/debug/mem_tracker.h) and the suites' per-rank memory checks.
#pragma once

#include "dtensor/compat.h"

#include <array>
#include <atomic>
#include <cstdint>

namespace dtensor {
namespace debug {
namespace detail {

// NOTE: [Per-rank memory accounting]
// Wraps libtorch's CPU allocator (installed once, process-wide, by install()). Each allocation
// is charged to the slot of the thread that makes it and refunded to the same slot when freed,
// whichever thread frees it; each slot keeps its current and peak bytes. The size and slot live
// in a 64-byte header before the block (libtorch's alignment is kept, and data == context as
// raw_allocate requires), so there is no lock.
// Slots: 0 (a thread's default), one per rank for ranks as threads (rank r sets slot r + 1,
// ranks 0 to kMaxRanks - 1), then one per MemTracker (claimed once, never reused, so a block
// that outlives its tracker is refunded to a slot nobody reads).
class TrackingAllocator final : public compat::Allocator {
 public:
  static constexpr int kMaxRanks = 1024;
  static constexpr int kMaxTrackers = 4096;
  static constexpr int kSlots = 1 + kMaxRanks + kMaxTrackers;

  // Installs the allocator (the first call) and returns it.
  static TrackingAllocator& install();
  // This thread's slot for its next allocations. set_slot takes slot 0 or a rank's slot
  // (1 to kMaxRanks) and raises for any other, naming the range.
  static void set_slot(int s);
  static int get_slot();
  // A fresh slot past the ranks' (for a MemTracker); raises when all kMaxTrackers are taken.
  static int claim_tracker_slot();
  // Makes `s` (any slot from claim_tracker_slot or set_slot's range) this thread's slot.
  static void use_slot(int s);

  int64_t current(int s) const { return current_[checked(s)].load(); }
  int64_t peak(int s) const { return peak_[checked(s)].load(); }
  void reset_peak(int s) { peak_[checked(s)].store(current_[s].load()); }
  // Raises slot s's peak to at least `bytes`.
  void raise_peak(int s, int64_t bytes) { update_peak(checked(s), bytes); }

  c10::DataPtr do_allocate(size_t n) const override;
  c10::DeleterFnPtr raw_deleter() const override { return &TrackingAllocator::release; }

 private:
  static constexpr size_t kHeader = 64;
  struct Header {
    int64_t bytes;
    int slot;
  };
  explicit TrackingAllocator(c10::Allocator* inner) : inner_(inner) {}
  static int checked(int s);
  void update_peak(int s, int64_t now) const {
    int64_t p = peak_[s].load();
    while (now > p && !peak_[s].compare_exchange_weak(p, now)) {
    }
  }
  static void release(void* data);

  c10::Allocator* inner_;
  mutable std::array<std::atomic<int64_t>, kSlots> current_{};
  mutable std::array<std::atomic<int64_t>, kSlots> peak_{};
};

}  // namespace detail
}  // namespace debug
}  // namespace dtensor
