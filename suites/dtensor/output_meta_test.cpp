// Output metadata without the data (NOTE: [Output metadata without the data] in
// dtensor/tensor/output_meta.cpp): a DTensor op allocates nothing of its global size on a rank
// to learn its outputs' shapes; an op without a meta kernel in this libtorch raises, naming
// itself, where that would take more than the limit. Ranks as threads: the memory of each rank
// is counted apart (NOTE: [Per-rank memory accounting]).
#include "dtensor/comm/group.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/ops/registry.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/errors.h"
#include "dtensor/debug/tracking_allocator_internal.h"

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace dtensor {
namespace {

using debug::detail::TrackingAllocator;

class OutputMetaThreads : public testing::DTensorOpTestBase {};

// An op on `x` ([rows, cols], sharded by rows) and `w` ([cols, 16], replicated).
struct OpCase {
  std::string name;
  std::function<at::Tensor(const at::Tensor& x, const at::Tensor& w)> run;
};

// One case per op family the suites cover, random ops excepted: they draw the whole tensor on
// every rank by design (NOTE: [Random ops on DTensors]).
std::vector<OpCase> op_cases() {
  using T = const at::Tensor&;
  return {
      {"relu", [](T x, T) { return x.relu(); }},
      {"gelu", [](T x, T) { return at::gelu(x); }},
      {"abs", [](T x, T) { return x.abs(); }},
      {"hardtanh", [](T x, T) { return at::hardtanh(x); }},
      {"nan_to_num", [](T x, T) { return at::nan_to_num(x); }},
      {"add", [](T x, T) { return x.add(x, 2); }},
      {"mul by a scalar", [](T x, T) { return x * 3; }},
      {"where", [](T x, T) { return at::where(x > 0, x, x * 2); }},
      {"sum over dim 1", [](T x, T) { return x.sum(1); }},
      {"amax over dim 1", [](T x, T) { return x.amax(1); }},
      {"var over dim 1", [](T x, T) { return x.var(1); }},
      {"logsumexp over dim 1", [](T x, T) { return at::logsumexp(x, {1}); }},
      {"cumsum over dim 1", [](T x, T) { return x.cumsum(1); }},
      {"softmax", [](T x, T) { return at::softmax(x, 1); }},
      {"log_softmax", [](T x, T) { return at::log_softmax(x, 1); }},
      {"layer_norm", [](T x, T) { return at::layer_norm(x, {x.size(1)}); }},
      {"mm", [](T x, T w) { return x.mm(w); }},
      {"linear", [](T x, T w) { return at::linear(x, w.t()); }},
      {"view", [](T x, T) { return x.view({x.size(0), x.size(1) / 2, 2}); }},
      {"transpose", [](T x, T) { return x.t(); }},
      {"slice", [](T x, T) { return x.slice(1, 0, 8); }},
      {"flip", [](T x, T) { return x.flip({1}); }},
      {"cat", [](T x, T) { return at::cat({x, x}, 1); }},
  };
}

// Whether every op of the case has a meta kernel in this libtorch: the case runs on plain meta
// tensors (the reference the fallback's choice is checked against).
bool runs_on_meta(const OpCase& c, int64_t rows, int64_t cols) {
  try {
    c.run(at::empty({rows, cols}, at::TensorOptions().device(at::kMeta)),
          at::empty({cols, 16}, at::TensorOptions().device(at::kMeta)));
    return true;
  } catch (const c10::Error&) {
    return false;
  }
}

// Every case on a rank allocates less than the global input (the CPU stand-ins of an op without
// a meta kernel alone take that much), or, without a meta kernel and a limit below the global
// input, raises naming the op; the results are the single-device op's. The shapes are odd ones
// that no other test propagates (the strategy cache would skip the inference).
DTENSOR_TEST_F(OutputMetaThreads, OpsLearnOutputShapesWithoutAllocatingTheGlobalTensor) {
  DTENSOR_REQUIRE_WORLD_SIZE_AT_LEAST(4);  // the local outputs (up to twice a shard) stay under the global input
  auto& mem = TrackingAllocator::install();
  TrackingAllocator::set_slot(rank() + 1);
  const int64_t rows = 64 * ranks(), cols = 1030;
  const int64_t global_bytes = rows * cols * static_cast<int64_t>(sizeof(float));
  DeviceMesh mesh = init_device_mesh(device_type(), {ranks()});
  at::Tensor g = at::randn({rows, cols}, at::TensorOptions().dtype(at::kFloat));
  at::Tensor gw = at::randn({cols, 16});
  group().broadcast(g, 0);
  group().broadcast(gw, 0);
  at::Tensor x = distribute_tensor(g, mesh, {Shard{0}});
  at::Tensor w = distribute_tensor(gw, mesh, {Replicate{}});
  int64_t previous_limit = 0;
  if (rank() == 0) previous_limit = ops::set_stand_in_limit_bytes(global_bytes / 2);
  group().barrier();
  int with_meta = 0, without_meta = 0;
  for (const auto& c : op_cases()) {
    SCOPED_TRACE(c.name);
    const at::Tensor expected = c.run(g, gw);
    if (runs_on_meta(c, rows, cols)) {
      ++with_meta;
      const int64_t before = mem.current(rank() + 1);
      mem.reset_peak(rank() + 1);
      at::Tensor y = c.run(x, w);
      const int64_t extra = mem.peak(rank() + 1) - before;
      EXPECT_LT(extra, global_bytes) << "the op allocated " << extra << " bytes on rank " << rank()
                                     << "; the global input has " << global_bytes;
      EXPECT_TRUE(at::allclose(full_tensor(y), expected, 1e-4, 1e-4));
    } else {
      ++without_meta;
      const std::string what = testing::error_of([&] { (void)c.run(x, w); });
      EXPECT_PRED2(testing::contains, what, "could not be computed on meta tensors");
      EXPECT_PRED2(testing::contains, what, "dtensor::ops::set_stand_in_limit_bytes");
    }
  }
  group().barrier();
  if (rank() == 0) ops::set_stand_in_limit_bytes(previous_limit);
  RecordProperty("cases_with_meta_kernels", with_meta);
  RecordProperty("cases_without_meta_kernels", without_meta);
}

// 2^40 floats (4 TiB) sharded by rows, on the meta device (as a model is built before it is
// sharded): no rank could hold its piece (2^38 floats with 4 ranks), and every case runs, giving
// the single-device op's global shape, without a byte of CPU memory; a case without a meta
// kernel raises naming its op (the CPU stand-ins would take 4 TiB; before, that allocation was
// attempted).
DTENSOR_TEST_F(OutputMetaThreads, OpsOnATensorNoRankCouldHoldRun) {
  auto& mem = TrackingAllocator::install();
  TrackingAllocator::set_slot(rank() + 1);
  const int64_t rows = int64_t{1} << 20, cols = int64_t{1} << 20;
  ASSERT_EQ(rows % ranks(), 0);
  DeviceMesh mesh = init_device_mesh(device_type(), {ranks()});
  const auto meta = at::TensorOptions().device(at::kMeta);
  at::Tensor x = from_local(at::empty({rows / ranks(), cols}, meta), mesh, {Shard{0}});
  at::Tensor w = from_local(at::empty({cols, 16}, meta), mesh, {Replicate{}});
  ASSERT_EQ(x.numel(), int64_t{1} << 40);
  for (const auto& c : op_cases()) {
    SCOPED_TRACE(c.name);
    const int64_t before = mem.current(rank() + 1);
    mem.reset_peak(rank() + 1);
    if (runs_on_meta(c, rows, cols)) {
      const at::Tensor expected = c.run(at::empty({rows, cols}, meta), at::empty({cols, 16}, meta));
      at::Tensor y = c.run(x, w);
      EXPECT_EQ(y.sizes(), expected.sizes());
      EXPECT_EQ(y.scalar_type(), expected.scalar_type());
      EXPECT_TRUE(to_local(y).is_meta());
    } else {
      EXPECT_PRED2(testing::contains, testing::error_of([&] { (void)c.run(x, w); }),
                   "could not be computed on meta tensors");
    }
    const int64_t extra = mem.peak(rank() + 1) - before;
    EXPECT_LT(extra, int64_t{1} << 20) << "rank " << rank() << " allocated " << extra << " bytes of CPU memory";
  }
}

// A meta run that raises for a genuine error (shapes that do not multiply) does not mark the op
// as lacking a meta kernel: the same op on the 2^40-element tensor still infers its shape on
// meta tensors. Before: mm was then taken for an op without a meta kernel, and refused there.
DTENSOR_TEST_F(OutputMetaThreads, AShapeErrorDoesNotMarkTheOpAsWithoutAMetaKernel) {
  const int64_t rows = int64_t{1} << 20, cols = int64_t{1} << 20;
  DeviceMesh mesh = init_device_mesh(device_type(), {ranks()});
  const auto meta = at::TensorOptions().device(at::kMeta);
  at::Tensor x = from_local(at::empty({rows / ranks(), cols}, meta), mesh, {Shard{0}});
  at::Tensor bad = from_local(at::empty({cols + 1, 16}, meta), mesh, {Replicate{}});
  at::Tensor w = from_local(at::empty({cols, 16}, meta), mesh, {Replicate{}});
  const std::string shape_error = testing::error_of([&] { (void)x.mm(bad); });
  EXPECT_PRED2(testing::contains, shape_error, "could not be computed on meta tensors (");
  EXPECT_PRED2(testing::contains, shape_error, "cannot be multiplied");
  at::Tensor y = x.mm(w);
  EXPECT_EQ(y.sizes(), c10::IntArrayRef({rows, 16}));
}

TEST(OutputMeta, StandInLimitBelowZeroIsRefused) {
  EXPECT_PRED2(testing::contains, testing::error_of([] { ops::set_stand_in_limit_bytes(-1); }),
               "set_stand_in_limit_bytes: the limit must be at least 0 bytes, got -1");
  EXPECT_EQ(ops::set_stand_in_limit_bytes(ops::kStandInLimitBytes), ops::kStandInLimitBytes);
}

// The accounting itself: an allocation is charged to the slot of the thread that made it, for
// ranks far past 8 (thread worlds of 64 and more ranks), and refunded when freed; a slot past
// the last rank's is refused with its range (before, ranks from 8 on were charged past the end
// of the counters).
TEST(TrackingAllocator, ChargesEachRanksSlotUpToItsLimitAndRefusesSlotsPastIt) {
  auto& mem = TrackingAllocator::install();
  for (const int rank : {8, 63, TrackingAllocator::kMaxRanks - 1}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const int slot = rank + 1;
    const int64_t before = mem.current(slot), main_before = mem.current(0);
    at::Tensor kept;
    std::thread([&] {
      TrackingAllocator::set_slot(slot);
      mem.reset_peak(slot);
      kept = at::empty({1000}, at::kFloat);
      { at::Tensor freed = at::empty({3000}, at::kFloat); }
    }).join();
    EXPECT_EQ(mem.current(slot) - before, 4000);
    EXPECT_EQ(mem.peak(slot) - before, 16000);
    EXPECT_EQ(mem.current(0), main_before);
    kept = at::Tensor();  // freed on this thread, refunded to the rank's slot
    EXPECT_EQ(mem.current(slot), before);
  }
  for (const int bad : {TrackingAllocator::kMaxRanks + 1, -1}) {
    const std::string what = testing::error_of([bad] { TrackingAllocator::set_slot(bad); });
    EXPECT_PRED2(testing::contains, what, "TrackingAllocator: slot " + std::to_string(bad) + " is out of range");
    EXPECT_PRED2(testing::contains, what, "for ranks 0 to " + std::to_string(TrackingAllocator::kMaxRanks - 1));
  }
  for (const int bad : {TrackingAllocator::kSlots, -1})
    EXPECT_PRED2(testing::contains, testing::error_of([&] { (void)mem.peak(bad); }), "is out of range");
}

}  // namespace
}  // namespace dtensor
