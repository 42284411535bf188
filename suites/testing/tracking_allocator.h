// suites/testing/tracking_allocator.h: per-rank CPU memory accounting with ranks as threads
// (tp_benchmark, fsdp_benchmark, the output-metadata tests).
#pragma once

#include "dtensor/compat.h"

#include <c10/core/CPUAllocator.h>

#include <array>
#include <atomic>
#include <cstdint>

namespace dtensor {
namespace testing {

// ---- memory accounting -----------------------------------------------------------------------
// NOTE: [Per-rank memory accounting]
// Wraps libtorch's CPU allocator. Each allocation is charged to the slot of the thread that
// makes it (slot 0 by default; rank threads set rank + 1) and refunded to the same slot when
// freed, whichever thread frees it; each slot keeps its current and peak bytes. The size and
// slot live in a 64-byte header before the block (libtorch's alignment is kept, and data ==
// context as raw_allocate requires), so there is no lock.
class TrackingAllocator final : public compat::Allocator {
 public:
  // Slot 0 and one slot per rank, ranks 0 to kMaxRanks - 1 (rank r sets slot r + 1).
  static constexpr int kMaxRanks = 1024;
  static constexpr int kSlots = kMaxRanks + 1;

  static TrackingAllocator& install() {
    static TrackingAllocator* a = [] {
      auto* t = new TrackingAllocator(c10::GetCPUAllocator());
      instance() = t;
      c10::SetCPUAllocator(t, /*priority=*/100);
      return t;
    }();
    return *a;
  }
  // Raises for a slot outside [0, kSlots): a rank beyond kMaxRanks has no slot.
  static void set_slot(int s) { slot() = checked(s); }
  int64_t current(int s) const { return current_[checked(s)].load(); }
  int64_t peak(int s) const { return peak_[checked(s)].load(); }
  void reset_peak(int s) { peak_[checked(s)].store(current_[s].load()); }

  c10::DataPtr do_allocate(size_t n) const override {
    auto* raw = static_cast<char*>(inner_->raw_allocate(n + kHeader));
    auto* h = reinterpret_cast<Header*>(raw);
    h->bytes = static_cast<int64_t>(n);
    h->slot = slot();
    const int64_t now = current_[h->slot].fetch_add(h->bytes) + h->bytes;
    int64_t p = peak_[h->slot].load();
    while (now > p && !peak_[h->slot].compare_exchange_weak(p, now)) {
    }
    void* data = raw + kHeader;
    return c10::DataPtr(data, data, &TrackingAllocator::release, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &TrackingAllocator::release; }

 private:
  static constexpr size_t kHeader = 64;
  struct Header {
    int64_t bytes;
    int slot;
  };
  explicit TrackingAllocator(c10::Allocator* inner) : inner_(inner) {}
  static int checked(int s) {
    TORCH_CHECK(s >= 0 && s < kSlots, "TrackingAllocator: slot ", s, " is out of range [0, ", kSlots,
                "): slot 0 and one per rank, for ranks 0 to ", kMaxRanks - 1);
    return s;
  }
  static TrackingAllocator*& instance() {
    static TrackingAllocator* t = nullptr;
    return t;
  }
  static int& slot() {
    thread_local int s = 0;
    return s;
  }
  static void release(void* data) {
    if (data == nullptr) return;
    char* raw = static_cast<char*>(data) - kHeader;
    auto* h = reinterpret_cast<Header*>(raw);
    TrackingAllocator* self = instance();
    self->current_[h->slot].fetch_sub(h->bytes);
    self->inner_->raw_deallocate(raw);
  }

  c10::Allocator* inner_;
  mutable std::array<std::atomic<int64_t>, kSlots> current_{};
  mutable std::array<std::atomic<int64_t>, kSlots> peak_{};
};

}  // namespace testing
}  // namespace dtensor
