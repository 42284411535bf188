// redistribute(..., {async_op = true}): PyTorch's test_dtensor.py
// test_dtensor_async_output and test_redistribute.py's forward/backward cases, run async:
// the result is pending until its first use, the values and collective counts are those of the
// blocking call, the collectives are issued before anybody waits, and a result dropped unused
// is still completed on every rank.
#include "dtensor/comm/work.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/rank_modes.h"

#include <ATen/ATen.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

namespace dtensor {
namespace {

namespace funcol = debug::c10d_functional;  // PyTorch's alias of the functional collectives


DTENSOR_RANK_FIXTURES(AsyncRedistributeGloo, AsyncRedistributeThreads);

RedistributeOptions async_op() {
  RedistributeOptions o;
  o.async_op = true;
  return o;
}

// test_dtensor_async_output: Shard(0) -> Replicate, async. The result is pending until it is
// used; the first use waits, and the values and the one all_gather are the blocking call's.
DTENSOR_TEST_BOTH(AsyncRedistributeGloo, AsyncRedistributeThreads, ResultIsPendingUntilItsFirstUse) {
  testing::CommCounter counting;
  DeviceMesh mesh = init_device_mesh(t.device_type(), {t.ranks()}, {}, t.group_ptr());
  const at::Tensor x = at::arange(16, at::kFloat).reshape({8, 2});
  at::Tensor dt = distribute_tensor(x, mesh, {Shard{0}});

  // Every way of using the result waits for it first.
  const std::vector<std::pair<const char*, std::function<at::Tensor(const at::Tensor&)>>> uses = {
      {"an op", [](const at::Tensor& y) { return to_local(y + 1) - 1; }},
      {"a view op", [](const at::Tensor& y) { return to_local(y.view({16})).view({8, 2}); }},
      {"to_local", [](const at::Tensor& y) { return to_local(y); }},
      {"full_tensor", [](const at::Tensor& y) { return full_tensor(y); }},
      {"redistribute", [](const at::Tensor& y) { return to_local(redistribute(y, {Replicate{}})); }},
      {"wait_tensor", [](const at::Tensor& y) { return to_local(wait_tensor(y)); }},
      {"a detached copy", [](const at::Tensor& y) { return to_local(y.detach()); }},
  };
  for (const auto& use : uses) {
    SCOPED_TRACE(use.first);
    counting.reset();
    at::Tensor y = redistribute(dt, mesh, {Replicate{}}, async_op());
    EXPECT_TRUE(is_async_pending(y));  // nobody used it yet
    EXPECT_EQ(y.sizes(), x.sizes());   // metadata needs no wait
    EXPECT_EQ(get_spec(y).placements, std::vector<Placement>{Replicate{}});
    at::Tensor local = use.second(y);
    EXPECT_FALSE(is_async_pending(y));
    EXPECT_TRUE(at::equal(local.cpu(), x));
    EXPECT_EQ(counting.counts()[funcol::all_gather_into_tensor], 1);
  }

  // async_op = false (the default) is never pending.
  at::Tensor sync_out = redistribute(dt, mesh, {Replicate{}});
  EXPECT_FALSE(is_async_pending(sync_out));
  EXPECT_TRUE(at::equal(to_local(sync_out).cpu(), x));
  // No communication needed: not async either (PyTorch returns a plain local tensor then).
  EXPECT_FALSE(is_async_pending(redistribute(dt, mesh, {Shard{0}}, async_op())));
}

// The other transitions, a 2-D mesh (several collectives, the last one async), forward_dtype, and the
// backward of an async redistribute (test_redistribute.py's *_forward_backward cases).
DTENSOR_TEST_BOTH(AsyncRedistributeGloo, AsyncRedistributeThreads, TransitionsAndBackwardMatchTheBlockingCall) {
  testing::CommCounter counting;
  DeviceMesh mesh = init_device_mesh(t.device_type(), {t.ranks()}, {}, t.group_ptr());
  const int r = t.rank(), n = t.ranks();

  // Partial -> Replicate: one all_reduce.
  at::Tensor partial = from_local(at::full({3, 2}, r + 1.0), mesh, {Partial{}});
  counting.reset();
  at::Tensor summed = redistribute(partial, {Replicate{}}, async_op());
  EXPECT_TRUE(is_async_pending(summed));
  EXPECT_TRUE(at::equal(to_local(summed).cpu(), at::full({3, 2}, n * (n + 1) / 2.0)));  // 1 + ... + n
  EXPECT_EQ(counting.counts()[funcol::all_reduce], 1);

  // Shard(1) -> Shard(0) on uneven sizes: one all_to_all, values as the blocking call's.
  const at::Tensor full = at::arange(63, at::kDouble).reshape({9, 7}) / 7;
  at::Tensor s1 = distribute_tensor(full, mesh, {Shard{1}});
  at::Tensor blocking = to_local(redistribute(s1, {Shard{0}}));
  counting.reset();
  at::Tensor s0 = redistribute(s1, {Shard{0}}, async_op());
  EXPECT_TRUE(at::equal(to_local(s0), blocking));
  EXPECT_EQ(counting.collectives(), 1);

  // forward_dtype: the collective moves bfloat16, the result has it.
  RedistributeOptions bf = async_op();
  bf.forward_dtype = at::kBFloat16;
  at::Tensor low = redistribute(s1, {Replicate{}}, bf);
  EXPECT_EQ(low.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(to_local(low).cpu(), full.to(at::kBFloat16)));

  // Backward through an async redistribute: Shard(0) -> Replicate gives a Shard(0) gradient.
  at::Tensor leaf = distribute_tensor(at::ones({2 * n, 3}), mesh, {Shard{0}});
  leaf.set_requires_grad(true);
  at::Tensor rep = redistribute(leaf, {Replicate{}}, async_op());
  (rep * 3).sum().backward();
  ASSERT_TRUE(leaf.grad().defined());
  EXPECT_EQ(get_spec(leaf.grad()).placements, std::vector<Placement>{Shard{0}});
  EXPECT_TRUE(at::equal(to_local(leaf.grad()).cpu(), at::full({2, 3}, 3.0)));

  // 2-D mesh: (Shard(0), Shard(1)) -> (Replicate, Replicate) runs an all_gather
  // for each mesh dim of more than one rank (both, from 4 ranks on).
  testing::CommCounter counting2;
  DeviceMesh mesh2 = init_device_mesh(t.device_type(), t.mesh_shape_2d(), {}, t.group_ptr());
  const at::Tensor grid = at::arange(40, at::kFloat).reshape({5, 8});
  at::Tensor tiles = distribute_tensor(grid, mesh2, {Shard{0}, Shard{1}});
  counting2.reset();
  at::Tensor whole = redistribute(tiles, {Replicate{}, Replicate{}}, async_op());
  EXPECT_TRUE(at::equal(to_local(whole).cpu(), grid));
  EXPECT_EQ(counting2.counts()[funcol::all_gather_into_tensor], (mesh2.size(0) > 1) + (mesh2.size(1) > 1));
}

// A result nobody uses is still completed on every rank (its last handle waits), and a blocking
// collective issued while an async one is in flight runs after it on every rank, so the
// collectives pair up in program order (NOTE: [Async collectives]).
DTENSOR_TEST_BOTH(AsyncRedistributeGloo, AsyncRedistributeThreads, DroppedResultsAndLaterCollectivesStayInOrder) {
  DeviceMesh mesh = init_device_mesh(t.device_type(), {t.ranks()}, {}, t.group_ptr());
  const at::Tensor x = at::arange(12, at::kFloat).reshape({4, 3});
  at::Tensor dt = distribute_tensor(x, mesh, {Shard{0}});

  { at::Tensor unused = redistribute(dt, {Replicate{}}, async_op()); }  // dropping it waits

  // Rank 0 drops its result at once, the others after a blocking collective of their own.
  at::Tensor y = redistribute(dt, {Replicate{}}, async_op());
  if (t.rank() == 0) y = at::Tensor();
  at::Tensor sum = at::full({2}, t.rank() + 1.0);
  t.group().all_reduce(sum);  // issued while the all_gather may still be in flight
  EXPECT_TRUE(at::equal(sum, at::full({2}, t.ranks() * (t.ranks() + 1) / 2.0)));  // 1 + ... + n
  if (t.rank() != 0) EXPECT_TRUE(at::equal(to_local(y).cpu(), x));

  // A result still pending when the body ends: teardown must not hang.
  at::Tensor left = redistribute(dt, {Replicate{}}, async_op());
  EXPECT_TRUE(is_async_pending(left));
}

// The collective is issued by redistribute itself, not by the wait: rank 1 uses (waits for) its
// result while rank 0 has not touched its own, which can only complete if rank 0's all_gather
// is already running. Rank 0 then checks that it still has not waited.
DTENSOR_TEST_F(AsyncRedistributeThreads, CollectiveIsIssuedBeforeAnyWait) {
  static std::mutex mu;
  static std::condition_variable cv;
  static int64_t rank1_done = 0;
  constexpr auto kHandoffTimeout = std::chrono::seconds(60);

  DeviceMesh mesh = init_device_mesh(device_type(), {ranks()}, {}, group_ptr());
  const at::Tensor x = at::arange(8, at::kFloat);
  at::Tensor dt = distribute_tensor(x, mesh, {Shard{0}});
  int64_t before = 0;
  {
    std::lock_guard<std::mutex> lk(mu);
    before = rank1_done;  // read before this rank issues: rank 1 cannot finish before that
  }
  at::Tensor y = redistribute(dt, {Replicate{}}, async_op());
  if (rank() == 0) {
    std::unique_lock<std::mutex> lk(mu);
    const bool rank1_finished = cv.wait_for(lk, kHandoffTimeout, [&] { return rank1_done > before; });
    EXPECT_TRUE(rank1_finished) << "rank 1 could not complete the all_gather while rank 0 had not waited";
    EXPECT_TRUE(is_async_pending(y));
  }
  EXPECT_TRUE(at::equal(to_local(y), x));
  if (rank() == 1) {
    std::lock_guard<std::mutex> lk(mu);
    ++rank1_done;
    cv.notify_all();
  }
}

}  // namespace
}  // namespace dtensor
