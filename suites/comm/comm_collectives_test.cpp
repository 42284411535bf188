// Collectives of every Group implementation, run the way a user runs them: as N ranks (4 by
// default; the expected values are computed from the rank count), as processes over Gloo (C10dGroup), over Gloo through a per-device backend list ("cpu:gloo",
// routed by tensor device: NOTE: [Backend routing]), as threads (ThreadGroup), and on GPU
// machines over NCCL (the bodies' CPU tensors are staged through each rank's GPU, so every
// native NCCL collective runs) and "cpu:gloo,cuda:nccl". Each behaviour is written once
// (COMM_TEST) and instantiated for every fixture; the NCCL ones skip, with the reason, where
// this build has no NCCL or the machine too few GPUs.
#include "dtensor/comm/abort.h"
#include "dtensor/comm/c10d_guard.h"
#include "dtensor/comm/comm.h"
#include "dtensor/comm/device.h"
#include "harness/harness.h"

#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <thread>

namespace dtensor {
namespace {

using comm::ReduceOp;

class GlooCollectives : public testing::MultiProcessTest {
 public:
  // 4 ranks unless DTENSOR_WORLD_SIZE says otherwise (also on GPU machines, where a plain
  // MultiProcessTest would take the GPU count); the bodies hold at any count.
  int world_size() const override { return 4; }

 protected:
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(60); }
};
class GlooListCollectives : public GlooCollectives {
 public:
  std::string backend() const override { return "cpu:gloo"; }
};
class NcclCollectives : public GlooCollectives {
 public:
  std::string backend() const override { return "nccl"; }
};
class MixedCollectives : public GlooCollectives {
 public:
  std::string backend() const override { return "cpu:gloo,cuda:nccl"; }
};
class ThreadCollectives : public testing::MultiThreadedTest {
 protected:
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(60); }
};

#define COMM_TEST(name)                                                 \
  void name##_body(testing::MultiRankTest& t);                          \
  DTENSOR_TEST_F(GlooCollectives, name) { name##_body(*this); }        \
  DTENSOR_TEST_F(GlooListCollectives, name) { name##_body(*this); }    \
  DTENSOR_TEST_F(NcclCollectives, name) { name##_body(*this); }        \
  DTENSOR_TEST_F(MixedCollectives, name) { name##_body(*this); }       \
  DTENSOR_TEST_F(ThreadCollectives, name) { name##_body(*this); }      \
  void name##_body(testing::MultiRankTest& t)

COMM_TEST(AllReduceEveryOp) {
  auto& g = t.group();
  const int n = g.size(), r = t.rank();
  ASSERT_EQ(n, t.ranks());
  ASSERT_EQ(&g, comm::default_group().get());
  struct Case {
    ReduceOp op;
    double expected;
  };
  // rank r contributes r + 1: 1, 2, ..., n
  double product = 1;
  for (int k = 1; k <= n; ++k) product *= k;
  for (Case c : {Case{ReduceOp::SUM, n * (n + 1) / 2.0}, Case{ReduceOp::AVG, (n + 1) / 2.0},
                 Case{ReduceOp::PRODUCT, product}, Case{ReduceOp::MIN, 1}, Case{ReduceOp::MAX, 1.0 * n}}) {
    SCOPED_TRACE(comm::to_string(c.op));
    at::Tensor x = at::full({3, 2}, r + 1.0, at::kFloat);
    g.all_reduce(x, c.op);
    EXPECT_TRUE(at::allclose(x, at::full({3, 2}, c.expected, at::kFloat))) << x;
  }
  at::Tensor ints = at::full({2}, r, at::kLong);
  g.all_reduce(ints, ReduceOp::MAX);
  EXPECT_EQ(ints[0].item<int64_t>(), n - 1);
  // AVG of integers is refused with a message saying what to do.
  at::Tensor bad = at::zeros({1}, at::kLong);
  try {
    g.all_reduce(bad, ReduceOp::AVG);
    ADD_FAILURE() << "AVG on int64 did not throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("AVG needs a floating dtype"), std::string::npos) << e.what();
  }
}

COMM_TEST(AllReduceNonContiguous) {
  auto& g = t.group();
  at::Tensor base = at::arange(6, at::kFloat).reshape({2, 3});
  at::Tensor x = base.t();  // non-contiguous view
  g.all_reduce(x);
  EXPECT_TRUE(at::equal(base, at::arange(6, at::kFloat).reshape({2, 3}) * g.size()));
}

COMM_TEST(AllGatherInto) {
  auto& g = t.group();
  at::Tensor in = at::full({2, 3}, t.rank(), at::kFloat);
  at::Tensor out = at::empty({2 * g.size(), 3}, at::kFloat);
  g.all_gather_into(out, in);
  for (int r = 0; r < g.size(); ++r) EXPECT_TRUE(at::equal(out.narrow(0, 2 * r, 2), at::full({2, 3}, r, at::kFloat)));
  at::Tensor wrong = at::empty({3, 3}, at::kFloat);
  try {
    g.all_gather_into(wrong, in);
    ADD_FAILURE() << "wrong output shape did not throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("needs output [" + std::to_string(2 * g.size()) + ", 3]"), std::string::npos)
        << e.what();
  }
}

COMM_TEST(ReduceScatterInto) {
  auto& g = t.group();
  const int n = g.size();
  // rank r holds rows [0..n) scaled by (r + 1); block b is rows b.
  at::Tensor in = at::arange(n, at::kFloat).unsqueeze(1).repeat({1, 2}) * (t.rank() + 1);
  at::Tensor out = at::empty({1, 2}, at::kFloat);
  // Block b of the sum is b * (1 + 2 + ... + n); of the average, b * (n + 1) / 2.
  g.reduce_scatter_into(out, in, ReduceOp::SUM);
  EXPECT_TRUE(at::allclose(out, at::full({1, 2}, t.rank() * n * (n + 1) / 2.0, at::kFloat))) << out;
  g.reduce_scatter_into(out, in, ReduceOp::AVG);
  EXPECT_TRUE(at::allclose(out, at::full({1, 2}, t.rank() * (n + 1) / 2.0, at::kFloat))) << out;
  // Block b of rank r is (b + 1) * (r + 1): the max is (b + 1) * n, the min b + 1, the
  // product (b + 1)^n * n!.
  at::Tensor pos = (at::arange(n, at::kDouble) + 1).unsqueeze(1).repeat({1, 2}) * (t.rank() + 1);
  at::Tensor o = at::empty({1, 2}, at::kDouble);
  const double b = t.rank() + 1;
  double fact = 1;
  for (int k = 1; k <= n; ++k) fact *= k;
  g.reduce_scatter_into(o, pos, ReduceOp::MAX);
  EXPECT_TRUE(at::allclose(o, at::full({1, 2}, b * n, at::kDouble))) << o;
  g.reduce_scatter_into(o, pos, ReduceOp::MIN);
  EXPECT_TRUE(at::allclose(o, at::full({1, 2}, b, at::kDouble))) << o;
  g.reduce_scatter_into(o, pos, ReduceOp::PRODUCT);
  EXPECT_TRUE(at::allclose(o, at::full({1, 2}, std::pow(b, n) * fact, at::kDouble))) << o;
  // A non-contiguous output gets the result too.
  at::Tensor wide = at::zeros({2, 2}, at::kDouble);
  at::Tensor col = wide.t().narrow(0, 0, 1);  // [1, 2] with strides (1, 2)
  ASSERT_FALSE(col.is_contiguous());
  g.reduce_scatter_into(col, pos, ReduceOp::SUM);
  EXPECT_TRUE(at::allclose(col, at::full({1, 2}, b * n * (n + 1) / 2.0, at::kDouble))) << col;
}

// Inputs that share memory with outputs: the in-place all-gather FSDP issues (the input is the
// rank's own block of its output), and aliasing no backend may write through before it read
// every input (ThreadGroup then computes every result first: NOTE: [ThreadGroup results
// written in place]).
COMM_TEST(OutputsThatAliasInputs) {
  auto& g = t.group();
  const int n = g.size(), me = t.rank();
  auto expect_gathered = [&](const at::Tensor& out, const char* what) {
    for (int r = 0; r < n; ++r)
      EXPECT_TRUE(at::equal(out.narrow(0, 2 * r, 2), at::full({2, 3}, r, at::kFloat))) << what << ": block " << r;
  };
  at::Tensor out = at::empty({2 * n, 3}, at::kFloat);
  at::Tensor own = out.narrow(0, 2 * me, 2).fill_(me);
  g.all_gather_into(out, own);
  expect_gathered(out, "input is the own block");
  // Every rank's input is block 0 of its output, which the gather overwrites (but for rank 0).
  at::Tensor out0 = at::empty({2 * n, 3}, at::kFloat);
  at::Tensor first = out0.narrow(0, 0, 2).fill_(me);
  g.all_gather_into(out0, first);
  expect_gathered(out0, "input is block 0");
  // Rank r's output is row (r + 1) % n of its input, which other ranks' blocks read: row b of
  // rank r's input is (b + 1) * (r + 1), so block b of the sum is (b + 1) * n(n + 1)/2.
  at::Tensor in = (at::arange(n, at::kDouble) + 1).unsqueeze(1).repeat({1, 2}) * (me + 1);
  at::Tensor row = in.narrow(0, (me + 1) % n, 1);
  g.reduce_scatter_into(row, in, ReduceOp::SUM);
  EXPECT_TRUE(at::allclose(row, at::full({1, 2}, (me + 1) * n * (n + 1) / 2.0, at::kDouble))) << row;
}

COMM_TEST(AllToAllSingleEvenAndUneven) {
  auto& g = t.group();
  const int n = g.size(), me = t.rank();
  // Even: block j of rank i holds 100 * i + j.
  at::Tensor in = at::empty({n, 2}, at::kFloat);
  for (int j = 0; j < n; ++j) in[j].fill_(100 * me + j);
  at::Tensor out = at::empty({n, 2}, at::kFloat);
  g.all_to_all_single(out, in);
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[i][0].item<float>(), 100 * i + me);
  // Uneven: rank i sends (j + 1) rows to rank j, so rank j receives (j + 1) rows from everyone.
  std::vector<int64_t> in_splits, out_splits;
  for (int j = 0; j < n; ++j) in_splits.push_back(j + 1);
  for (int i = 0; i < n; ++i) out_splits.push_back(me + 1);
  at::Tensor uin = at::full({n * (n + 1) / 2}, me, at::kLong);
  at::Tensor uout = at::empty({n * (me + 1)}, at::kLong);
  g.all_to_all_single(uout, uin, out_splits, in_splits);
  for (int i = 0; i < n; ++i)
    EXPECT_TRUE(at::equal(uout.narrow(0, i * (me + 1), me + 1), at::full({me + 1}, i, at::kLong)));
}

COMM_TEST(BroadcastFromEveryRoot) {
  auto& g = t.group();
  for (int src = 0; src < g.size(); ++src) {
    at::Tensor x = at::full({4}, t.rank() == src ? 42.0 + src : -1.0, at::kDouble);
    g.broadcast(x, src);
    EXPECT_EQ(x[3].item<double>(), 42.0 + src);
  }
  at::Tensor x = at::zeros({1});
  try {
    g.broadcast(x, g.size());
    ADD_FAILURE() << "src out of range did not throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("src=" + std::to_string(g.size()) + " is not a rank"), std::string::npos)
        << e.what();
  }
}

COMM_TEST(SendRecvRing) {
  auto& g = t.group();
  const int n = g.size(), me = t.rank();
  at::Tensor msg = at::full({3}, me, at::kInt);
  at::Tensor got = at::empty({3}, at::kInt);
  // Even ranks send first, odd ranks receive first: no deadlock with blocking calls.
  if (me % 2 == 0) {
    g.send(msg, (me + 1) % n, 7);
    g.recv(got, (me + n - 1) % n, 7);
  } else {
    g.recv(got, (me + n - 1) % n, 7);
    g.send(msg, (me + 1) % n, 7);
  }
  EXPECT_EQ(got[0].item<int>(), (me + n - 1) % n);
}

COMM_TEST(GatherAndScatter) {
  auto& g = t.group();
  const int n = g.size(), src = n - 1;  // gather to rank 1, scatter from the last rank
  std::vector<at::Tensor> outs;
  g.gather(at::full({2}, t.rank() * 2, at::kFloat), outs, /*dst=*/1);
  if (t.rank() == 1) {
    ASSERT_EQ(static_cast<int>(outs.size()), n);
    for (int r = 0; r < n; ++r) EXPECT_EQ(outs[r][1].item<float>(), r * 2);
  } else {
    EXPECT_TRUE(outs.empty());
  }
  std::vector<at::Tensor> ins;
  if (t.rank() == src)
    for (int r = 0; r < n; ++r) ins.push_back(at::full({2}, r * 3, at::kFloat));
  at::Tensor out = at::empty({2}, at::kFloat);
  g.scatter(out, ins, src);
  EXPECT_EQ(out[0].item<float>(), t.rank() * 3);
}

COMM_TEST(ObjectCollectives) {
  auto& g = t.group();
  const int me = t.rank(), n = g.size(), last = n - 1;
  auto names = comm::all_gather_object(g, std::string(static_cast<size_t>(me) * 3, 'x'));
  ASSERT_EQ(names.size(), static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) EXPECT_EQ(names[r].size(), static_cast<size_t>(r) * 3);  // rank 0 sends ""
  std::map<std::string, std::vector<int>> cfg;
  if (me == last) cfg = {{"dims", {1, 2}}, {"mesh", {2, 2}}};
  auto got = comm::broadcast_object(g, cfg, last);
  EXPECT_EQ(got.at("mesh"), (std::vector<int>{2, 2}));
  auto gathered = comm::gather_object(g, me * 1.5, 0);
  EXPECT_EQ(gathered.has_value(), me == 0);
  if (gathered) EXPECT_DOUBLE_EQ((*gathered)[last], last * 1.5);
  // "a", "bb", "ccc", "", "e", ...: an empty string among them.
  std::vector<std::string> all;
  for (int r = 0; r < n; ++r) all.emplace_back(static_cast<size_t>((r + 1) % 4), static_cast<char>('a' + r));
  std::vector<std::string> parts;
  if (me == 1) parts = all;
  EXPECT_EQ(comm::scatter_object(g, parts, 1), all[me]);
}

COMM_TEST(SubgroupsFromRankLists) {
  auto& g = t.group();
  const int me = t.rank(), n = g.size();
  // The even ranks and the odd ranks ({0, 2} and {1, 3} on 4 ranks).
  if (const std::string why = testing::world_size_skip_reason(n, 2, "at least"); !why.empty()) GTEST_SKIP() << why;
  std::vector<int> even_ranks, odd_ranks;
  for (int r = 0; r < n; ++r) (r % 2 == 0 ? even_ranks : odd_ranks).push_back(r);
  auto evens = g.new_subgroup(even_ranks);
  auto odds = g.new_subgroup(odd_ranks);
  auto mine = me % 2 == 0 ? evens : odds;
  auto other = me % 2 == 0 ? odds : evens;
  const std::vector<int>& my_ranks = me % 2 == 0 ? even_ranks : odd_ranks;
  ASSERT_NE(mine, nullptr);
  EXPECT_EQ(other, nullptr);
  EXPECT_EQ(mine->size(), static_cast<int>(my_ranks.size()));
  EXPECT_EQ(mine->rank(), me / 2);
  EXPECT_EQ(mine->global_ranks(), my_ranks);
  at::Tensor x = at::full({1}, me, at::kLong);
  mine->all_reduce(x);
  int64_t my_sum = 0;
  for (int r : my_ranks) my_sum += r;
  EXPECT_EQ(x.item<int64_t>(), my_sum);
  // The parent group still works after creating sub-groups.
  at::Tensor y = at::ones({1});
  g.all_reduce(y);
  EXPECT_EQ(y.item<float>(), n);
  try {
    g.new_subgroup({0, 0});
    ADD_FAILURE() << "duplicate rank did not throw";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("listed twice"), std::string::npos) << e.what();
  }
}

// A tensor whose device has no entry in the list is refused on every rank before any
// collective runs, with the list and what to add.
DTENSOR_TEST_F(GlooListCollectives, DeviceWithoutBackendIsRefused) {
  if (group().backend() != "cpu:gloo") GTEST_SKIP() << "DTENSOR_BACKEND overrides the fixture's cpu:gloo";
  at::Tensor meta = at::empty({4}, at::TensorOptions().device(at::kMeta));
  try {
    group().all_reduce(meta);
    ADD_FAILURE() << "a meta tensor was accepted by cpu:gloo";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("backend 'cpu:gloo' has no process group for meta tensors"),
              std::string::npos)
        << e.what();
  }
  at::Tensor x = at::ones({2});  // the group is still usable
  group().all_reduce(x);
  EXPECT_EQ(x[0].item<float>(), ranks());
}

// CUDA tensors stay on the rank's GPU (NOTE: [Rank devices]) through NCCL's native
// all_gather / reduce_scatter / AVG.
DTENSOR_TEST_F(NcclCollectives, CudaTensorsOnTheRanksGpu) {
  if (group().backend() != "nccl") GTEST_SKIP() << "DTENSOR_BACKEND overrides the fixture's nccl";
  const at::Device dev = comm::rank_device("cuda");
  EXPECT_EQ(dev.index(), rank() % testing::gpu_count());
  const int n = group().size();
  const auto opts = at::TensorOptions().device(dev);
  at::Tensor x = at::full({2}, rank() + 1.0, opts);
  group().all_reduce(x, ReduceOp::AVG);
  EXPECT_EQ(x.device(), dev);
  EXPECT_FLOAT_EQ(x[0].item<float>(), (n + 1) / 2.0f);
  at::Tensor all = at::empty({2 * n}, opts);
  group().all_gather_into(all, at::full({2}, static_cast<double>(rank()), opts));
  EXPECT_TRUE(at::equal(all.cpu(), at::arange(n, at::kFloat).repeat_interleave(2)));
  at::Tensor mine = at::empty({2}, opts);
  group().reduce_scatter_into(mine, at::arange(2 * n, opts.dtype(at::kFloat)), ReduceOp::AVG);
  EXPECT_TRUE(at::equal(mine.cpu(), at::arange(2 * rank(), 2 * rank() + 2, at::kFloat)));
}

// Each tensor goes to the backend of its device.
DTENSOR_TEST_F(MixedCollectives, CpuToGlooCudaToNccl) {
  if (group().backend() != "cpu:gloo,cuda:nccl") GTEST_SKIP() << "DTENSOR_BACKEND overrides the fixture's backend";
  at::Tensor c = at::ones({3});
  at::Tensor g = at::ones({3}, at::TensorOptions().device(comm::rank_device("cuda")));
  group().all_reduce(c);
  group().all_reduce(g);
  EXPECT_EQ(c.device(), at::Device(at::kCPU));
  EXPECT_TRUE(g.is_cuda());
  EXPECT_EQ(c[0].item<float>(), group().size());
  EXPECT_EQ(g[0].item<float>(), group().size());
}

// Only the in-memory group can tell mismatched collectives apart; it must raise on EVERY rank.
DTENSOR_TEST_F(ThreadCollectives, MismatchedCollectivesRaiseOnEveryRank) {
  at::Tensor x = at::ones({2});
  try {
    if (rank() == 0) group().broadcast(x, 0);
    else group().all_reduce(x);
    ADD_FAILURE() << "mismatched collectives did not throw";
  } catch (const comm::CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[rank 0: broadcast("), std::string::npos) << what;
    EXPECT_NE(what.find("[rank 1: all_reduce("), std::string::npos) << what;
  }
  // The group stays usable after the error.
  group().all_reduce(x);
  EXPECT_EQ(x[0].item<float>(), ranks());
}

// ---- Asynchronous collectives (NOTE: [Async collectives] in dtensor/comm/work.h) ----------

// Async and blocking calls interleaved, on the world and on a sub-group, waited for in reverse
// order: every rank issues the same sequence, and each result is the one the blocking call
// gives (c10d's program-order contract).
COMM_TEST(AsyncAndBlockingCallsInterleaved) {
  auto& g = t.group();
  const int n = g.size(), r = t.rank();
  at::Tensor a = at::full({4}, r + 1.0);
  comm::WorkPtr w_reduce = g.all_reduce_async(a);
  at::Tensor gathered = at::empty({n, 2});
  g.all_gather_into(gathered, at::full({1, 2}, static_cast<double>(r)));  // blocking, in between
  at::Tensor rs_out = at::empty({1, 3});
  comm::WorkPtr w_rs = g.reduce_scatter_into_async(rs_out, at::ones({n, 3}) * (r + 1));
  at::Tensor b = r == n - 1 ? at::full({2}, 7.0) : at::zeros({2});
  comm::WorkPtr w_bc = g.broadcast_async(b, n - 1);
  at::Tensor a2a = at::empty({n});
  comm::WorkPtr w_a2a = g.all_to_all_single_async(a2a, at::arange(n, at::kFloat) + 10 * r);
  // A sub-group of the even ranks runs its own collective between the world's.
  std::vector<int> evens;
  for (int k = 0; k < n; k += 2) evens.push_back(k);
  comm::GroupPtr sub = g.new_subgroup(evens);
  comm::WorkPtr w_sub;
  at::Tensor s = at::ones({1});
  if (sub) w_sub = sub->all_reduce_async(s);
  comm::WorkPtr w_barrier = g.barrier_async();
  for (const auto& w : {w_barrier, w_sub, w_a2a, w_bc, w_rs, w_reduce})
    if (w) w->wait();
  EXPECT_TRUE(at::equal(a, at::full({4}, n * (n + 1) / 2.0)));
  EXPECT_TRUE(at::equal(gathered, at::arange(n, at::kFloat).unsqueeze(1).repeat({1, 2})));
  EXPECT_TRUE(at::equal(rs_out, at::full({1, 3}, n * (n + 1) / 2.0)));
  EXPECT_TRUE(at::equal(b, at::full({2}, 7.0)));
  EXPECT_TRUE(at::equal(a2a, at::arange(n, at::kFloat) * 10 + r));  // element k came from rank k
  if (sub) EXPECT_EQ(s.item<float>(), static_cast<float>(evens.size()));
  for (const auto& w : {w_barrier, w_a2a, w_bc, w_rs, w_reduce}) {
    EXPECT_TRUE(w->is_completed());
    EXPECT_TRUE(w->was_waited());
    EXPECT_EQ(w->exception(), nullptr);
  }
}

// A backend may complete (and time) an operation before its Work exists (Gloo runs it on its own
// thread as soon as it is accepted): the Work never reports completion before its issue.
TEST(WorkTimestamps, CompletionBeforeTheWorkExistedReadsAsTheIssue) {
  struct DoneEarly : comm::Work::Source {
    comm::Work::Clock::time_point at = comm::Work::Clock::now() - std::chrono::seconds(1);
    bool wait_until(comm::Work::Clock::time_point) override { return true; }
    bool is_completed() override { return true; }
    std::exception_ptr error() override { return nullptr; }
    std::optional<comm::Work::Clock::time_point> completed_at() override { return at; }
  };
  comm::Work w("all_reduce", std::make_shared<const std::string>("a test group"), std::make_unique<DoneEarly>(),
               nullptr, std::chrono::seconds(1));
  w.wait();
  ASSERT_TRUE(w.completed_at().has_value());
  EXPECT_EQ(*w.completed_at(), w.issued_at());
}

// A Work may be waited on twice (the second wait returns at once, the result unchanged), reports
// completion without blocking, and knows when it was issued and completed.
COMM_TEST(WaitTwiceAndTimestamps) {
  auto& g = t.group();
  at::Tensor x = at::ones({3});
  comm::WorkPtr w = g.all_reduce_async(x);
  EXPECT_EQ(w->op(), "all_reduce");
  EXPECT_FALSE(w->was_waited());
  w->wait();
  w->wait();
  EXPECT_TRUE(at::equal(x, at::full({3}, static_cast<double>(g.size()))));
  EXPECT_TRUE(w->is_completed());
  ASSERT_TRUE(w->completed_at().has_value());
  EXPECT_LE(w->issued_at(), *w->completed_at());
}

// A Work dropped without wait() still completes on this rank (its destructor waits), so the
// peers that wait and the collectives issued after it are unaffected.
COMM_TEST(DroppedWorkStillCompletes) {
  auto& g = t.group();
  at::Tensor x = at::ones({2});
  if (t.rank() % 2 == 0) {
    (void)g.all_reduce_async(x);  // dropped at once
  } else {
    g.all_reduce_async(x)->wait();
  }
  EXPECT_TRUE(at::equal(x, at::full({2}, static_cast<double>(g.size()))));  // the destructor waited
  at::Tensor y = at::full({2}, 1.0 + t.rank());
  g.all_reduce(y, ReduceOp::MAX);
  EXPECT_TRUE(at::equal(y, at::full({2}, static_cast<double>(g.size()))));
}

// wait(timeout) gives up while a peer has not issued the collective yet, leaving it in flight;
// a later wait() completes it. Rank 0 issues only after every other rank has seen its timeout
// (told through send/recv, which do not take part in the collectives' order). On c10d groups the
// call check is turned off for this test: with it, issuing is itself a rendezvous of the ranks
// (NOTE: [Call check]), so no rank could issue before rank 0.
COMM_TEST(WaitWithATimeoutLeavesTheCollectiveInFlight) {
  auto& g = t.group();
  if (g.backend().find("nccl") != std::string::npos) GTEST_SKIP() << "NCCL's wait() does not block the host";
  const int n = g.size();
  if (n < 2) GTEST_SKIP() << "needs a peer";
  if (g.backend() != "threads" && std::getenv("DTENSOR_CHECK_COLLECTIVES"))
    GTEST_SKIP() << "DTENSOR_CHECK_COLLECTIVES is set: the call check makes issuing a rendezvous";
  // Process-wide, so only where each rank is a process (thread ranks share it, and ThreadGroup
  // does not use the call check).
  struct CheckOff {
    bool on;
    bool was = comm::check_collectives_enabled();
    explicit CheckOff(bool on_) : on(on_) {
      if (on) comm::set_check_collectives_default(false);
    }
    ~CheckOff() {
      if (on) comm::set_check_collectives_default(was);
    }
  } check_off(g.backend() != "threads");
  at::Tensor x = at::ones({2});
  at::Tensor token = at::zeros({1});
  if (t.rank() == 0) {
    for (int k = 1; k < n; ++k) g.recv(token, k, /*tag=*/7);
    g.all_reduce(x);
  } else {
    comm::WorkPtr w = g.all_reduce_async(x);
    try {
      w->wait(std::chrono::milliseconds(5));
      ADD_FAILURE() << "wait(5 ms) returned while rank 0 had not issued the all_reduce";
    } catch (const comm::CollectiveError& e) {
      EXPECT_NE(std::string(e.what()).find("still in flight"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(w->is_completed());
    g.send(token, 0, /*tag=*/7);
    w->wait();
  }
  EXPECT_TRUE(at::equal(x, at::full({2}, static_cast<double>(n))));
}

// A collective that fails (ranks disagree on the shape) raises on every rank, at the issue or
// at the wait, and never hangs; the group stays usable.
COMM_TEST(FailedAsyncCollectiveRaisesOnEveryRank) {
  auto& g = t.group();
  if (!comm::check_collectives_enabled() && g.backend() != "threads")
    GTEST_SKIP() << "without the call check (DTENSOR_CHECK_COLLECTIVES=0) c10d cannot see the mismatch";
  at::Tensor x = at::ones({t.rank() == 0 ? 2 : 3});
  try {
    comm::WorkPtr w = g.all_reduce_async(x);
    w->wait();
    ADD_FAILURE() << "mismatched shapes did not raise";
  } catch (const comm::CollectiveError& e) {
    EXPECT_NE(std::string(e.what()).find("all_reduce"), std::string::npos) << e.what();
  }
  at::Tensor y = at::ones({2});
  g.all_reduce(y);
  EXPECT_TRUE(at::equal(y, at::full({2}, static_cast<double>(g.size()))));
}

// A group destroyed while a Work on it is in flight: the Work still completes.
COMM_TEST(GroupDestroyedWithWorkInFlight) {
  auto& g = t.group();
  std::vector<int> all;
  for (int k = 0; k < g.size(); ++k) all.push_back(k);
  comm::GroupPtr sub = g.new_subgroup(all);
  ASSERT_NE(sub, nullptr);
  at::Tensor x = at::ones({2});
  comm::WorkPtr w = sub->all_reduce_async(x);
  sub.reset();
  w->wait();
  EXPECT_TRUE(at::equal(x, at::full({2}, static_cast<double>(g.size()))));
}

// With abortable waits (NOTE: [Aborting waits], the harness's external mode) collectives wait
// in short slices; a Gloo send or recv must not: the timed wait of Gloo's unbound buffer closes
// the connection when it expires ("Application timeout caused pair closure"). A recv whose
// sender comes well after one slice (it starts late on purpose) completes with the message.
DTENSOR_TEST_F(GlooCollectives, AbortableWaitsLeaveALateSendRecvWhole) {
  struct Restore {  // as it was (on already under the harness's external mode)
    bool was;
    ~Restore() { comm::set_waits_abortable(was); }
  } restore{comm::waits_abortable()};
  comm::set_waits_abortable(true);
  auto& g = group();
  const at::Tensor msg = at::arange(3, at::kInt) + 10;
  at::Tensor got = at::zeros({3}, at::kInt);
  if (rank() == 0) {
    g.recv(got, 1, 5);
    EXPECT_TRUE(got.equal(msg)) << got;
  } else if (rank() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // ten slices late
    g.send(msg, 0, 5);
  }
  g.barrier();
}

}  // namespace
}  // namespace dtensor
