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
// Wraps libtorch's CPU allocator, and the meta allocator (meta storages count for a MemTracker
// as if they held their bytes: a fake world on the meta device plans a real rank's memory; for
// no other slot), installed once, process-wide, by install(). Each allocation
// is charged to the slot of the thread that makes it and refunded to the same slot when freed,
// whichever thread frees it; each slot keeps its current and peak bytes. The size and slot live
// in a 64-byte header before the block (libtorch's alignment is kept, and data == context as
// raw_allocate requires), so there is no lock.
// Slots: 0 (a thread's default), one per rank for ranks as threads (rank r sets slot r + 1,
// ranks 0 to kMaxRanks - 1), then one per MemTracker (claimed once, never reused, so a block
// that outlives its tracker is refunded to a slot nobody reads). A tracker's slot also keeps its
// bytes per use (MemoryUse: what the block was allocated for, decided when it is allocated), the
// same per use at the moment of its peak, and a second peak that module windows reset.

// What a block was allocated for. A MemoryUseScope sets it (FSDP's buffers); otherwise the
// tracker decides from where the thread is: in backward, in a tracked module's forward, or
// neither (NOTE: [MemTracker]).
enum class MemoryUse : uint8_t {
  kOther = 0,
  kActivation,
  kBackward,
  kUnshardedParameter,
  kAllGather,
  kReduceScatter,
  kCount
};
constexpr int kMemoryUses = static_cast<int>(MemoryUse::kCount);
using MemoryUseBytes = std::array<int64_t, kMemoryUses>;

// Sets this thread's MemoryUse for the blocks allocated while alive; nests.
class MemoryUseScope {
 public:
  explicit MemoryUseScope(MemoryUse use);
  ~MemoryUseScope();
  MemoryUseScope(const MemoryUseScope&) = delete;
  MemoryUseScope& operator=(const MemoryUseScope&) = delete;

 private:
  int saved_;
};

// While alive, this thread's blocks are charged to no MemTracker (slot 0 in place of a
// tracker's slot; a rank's slot is kept): a thread world's round runs in the thread of the rank
// that issues last, and its temporaries (a reduction's accumulator) stand for what a real
// backend keeps in buffers of its own, which a rank's tracker does not see either.
class UntrackedScope {
 public:
  UntrackedScope();
  ~UntrackedScope();
  UntrackedScope(const UntrackedScope&) = delete;
  UntrackedScope& operator=(const UntrackedScope&) = delete;

 private:
  int saved_;
};

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
  void reset_peak(int s);

  // A tracker slot's bytes per use now, and at the moment its peak was reached.
  MemoryUseBytes current_by_use(int tracker_slot) const;
  MemoryUseBytes peak_by_use(int tracker_slot) const;
  // A tracker slot's window peak: the most it held since set_window_peak (module windows).
  int64_t window_peak(int tracker_slot) const;
  void set_window_peak(int tracker_slot, int64_t bytes);

  // The allocator that counts meta storages (installed with this one).
  static const c10::Allocator* meta();

  c10::DataPtr do_allocate(size_t n) const override;
  c10::DeleterFnPtr raw_deleter() const override { return &TrackingAllocator::release; }

 private:
  static constexpr size_t kHeader = 64;
  static constexpr int kFirstTrackerSlot = 1 + kMaxRanks;
  struct Header {
    int64_t bytes;
    int slot;
    uint8_t use;
  };
  // Per tracker slot.
  struct TrackerCounters {
    std::array<std::atomic<int64_t>, kMemoryUses> current{};
    std::array<std::atomic<int64_t>, kMemoryUses> at_peak{};
    std::atomic<int64_t> window_peak{0};
  };
  explicit TrackingAllocator(c10::Allocator* inner) : inner_(inner) {}
  static int checked(int s);
  static int checked_tracker(int s);
  static bool raise(std::atomic<int64_t>& peak, int64_t now) {
    int64_t p = peak.load();
    while (now > p) {
      if (peak.compare_exchange_weak(p, now)) return true;
    }
    return false;
  }
  void snapshot_at_peak(int s) const;
  // Charges a block of `n` bytes to this thread's slot; its header is placed at `at` (the
  // CPU block's first kHeader bytes) or, for a meta storage (`at` null), allocated.
  Header* charge(size_t n, void* at) const;
  static void refund(const Header* h);
  static void release(void* data);
  static void release_meta(void* header);
  friend class MetaTrackingAllocator;

  c10::Allocator* inner_;
  mutable std::array<std::atomic<int64_t>, kSlots> current_{};
  mutable std::array<std::atomic<int64_t>, kSlots> peak_{};
  mutable std::array<TrackerCounters, kMaxTrackers> trackers_{};
};

}  // namespace detail
}  // namespace debug
}  // namespace dtensor
