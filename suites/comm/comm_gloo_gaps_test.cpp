// What Gloo lacks, made to behave on the c10d adapter as on threads and on one device
// (DESIGN.md D12): NaN through MAX/MIN, empty blocks, dtypes Gloo does
// not carry (bool, complex, int16, bfloat16), and ranks that disagree on a collective.
// Each behaviour runs as Gloo processes and as threads.
#include "dtensor/comm/c10d_guard.h"
#include "dtensor/comm/comm.h"
#include "harness/harness.h"
#include "suites/testing/rank_modes.h"

#include <ATen/ATen.h>

#include <cstdlib>
#include <limits>

namespace dtensor {
namespace {

using comm::ReduceOp;

DTENSOR_RANK_FIXTURES(GlooGaps, ThreadGaps);

// The last rank holds a NaN at position 1; MAX and MIN must give NaN there, as at::amax does.
DTENSOR_TEST_BOTH(GlooGaps, ThreadGaps, MaxAndMinKeepNaN) {
  auto& g = t.group();
  const int n = g.size(), last = n - 1;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (auto dtype : {at::kFloat, at::kDouble, at::kHalf, at::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::MAX, ReduceOp::MIN}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " " + comm::to_string(op));
      at::Tensor x = at::full({2, 2}, static_cast<double>(t.rank()), dtype);
      if (t.rank() == last) x.view({-1})[1] = nan;
      g.all_reduce(x, op);
      at::Tensor flat = x.view({-1}).to(at::kDouble);
      EXPECT_TRUE(std::isnan(flat[1].item<double>())) << x;
      EXPECT_EQ(flat[0].item<double>(), op == ReduceOp::MAX ? 1.0 * last : 0.0) << x;
      // reduce_scatter: the block holding the NaN is rank 0's.
      at::Tensor in = at::full({n, 2}, static_cast<double>(t.rank()), dtype);
      if (t.rank() == last) in[0][1] = nan;
      at::Tensor out = at::empty({1, 2}, dtype);
      g.reduce_scatter_into(out, in, op);
      EXPECT_EQ(std::isnan(out[0][1].item<double>()), t.rank() == 0) << out;
    }
  }
}

// Empty blocks (an empty tensor sharded, or more ranks than rows): nothing to move, no crash.
DTENSOR_TEST_BOTH(GlooGaps, ThreadGaps, EmptyBlocksWork) {
  auto& g = t.group();
  const int n = g.size();
  at::Tensor empty = at::empty({0, 4});
  at::Tensor gathered = at::empty({0, 4});
  g.all_gather_into(gathered, empty);
  EXPECT_EQ(gathered.sizes(), at::IntArrayRef({0, 4}));
  g.all_reduce(empty);
  g.all_reduce(empty, ReduceOp::MAX);
  g.broadcast(empty, 0);
  at::Tensor rs_out = at::empty({0, 4});
  g.reduce_scatter_into(rs_out, at::empty({0, 4}), ReduceOp::SUM);
  std::vector<at::Tensor> outs;
  g.gather(empty, outs, 1);
  if (t.rank() == 1) {
    ASSERT_EQ(static_cast<int>(outs.size()), n);
    EXPECT_EQ(outs[0].sizes(), at::IntArrayRef({0, 4}));
  }
  std::vector<at::Tensor> ins(n, at::empty({0, 4}));
  at::Tensor sc = at::empty({0, 4});
  g.scatter(sc, ins, 0);
  // And the group still works.
  at::Tensor one = at::ones({1});
  g.all_reduce(one);
  EXPECT_EQ(one.item<float>(), n);
}

// Every dtype through every collective, as on one device.
DTENSOR_TEST_BOTH(GlooGaps, ThreadGaps, EveryDtypeIsCarried) {
  auto& g = t.group();
  const int n = g.size(), r = t.rank();
  for (auto dtype : {at::kBool, at::kComplexFloat, at::kComplexDouble, at::kShort, at::kBFloat16}) {
    SCOPED_TRACE(c10::toString(dtype));
    auto value = [&](int rank) {
      at::Tensor v = at::arange(6, at::kDouble).view({3, 2}) + rank;
      if (dtype == at::kBool) return (v.remainder(2) == 0).to(at::kBool);
      if (at::isComplexType(dtype)) return at::complex(v, -v).to(dtype);
      return v.to(dtype);
    };
    // broadcast
    at::Tensor b = value(r);
    g.broadcast(b, 1);
    EXPECT_TRUE(b.equal(value(1))) << b;
    // all_gather_into
    at::Tensor all = at::empty({3 * n, 2}, value(0).options());
    g.all_gather_into(all, value(r));
    for (int k = 0; k < n; ++k) EXPECT_TRUE(all.slice(0, 3 * k, 3 * k + 3).equal(value(k))) << all;
    // all_reduce SUM (bool: any) against the same reduction on one device
    at::Tensor s = value(r);
    g.all_reduce(s, ReduceOp::SUM);
    at::Tensor expect = value(0);
    for (int k = 1; k < n; ++k) expect = dtype == at::kBool ? expect.logical_or(value(k)) : expect + value(k);
    EXPECT_TRUE(s.equal(expect.to(dtype))) << s << expect;
    // PRODUCT of complex is not elementwise on (re, im)
    if (at::isComplexType(dtype)) {
      at::Tensor p = value(r);
      g.all_reduce(p, ReduceOp::PRODUCT);
      at::Tensor ep = value(0);
      for (int k = 1; k < n; ++k) ep = ep * value(k);
      EXPECT_TRUE(at::allclose(p, ep)) << p << ep;
    }
    // gather / scatter
    std::vector<at::Tensor> outs;
    g.gather(value(r), outs, 0);
    if (r == 0)
      for (int k = 0; k < n; ++k) EXPECT_TRUE(outs[k].equal(value(k)));
    std::vector<at::Tensor> ins;
    for (int k = 0; k < n; ++k) ins.push_back(value(10 + k));
    at::Tensor sc = at::empty_like(value(0));
    g.scatter(sc, ins, 0);
    EXPECT_TRUE(sc.equal(value(10 + r)));
    // all_to_all_single: block k of rank r is value(r) row k % 3, ...
    at::Tensor a_in = at::cat(std::vector<at::Tensor>(n, value(r).slice(0, 0, 1)));
    at::Tensor a_out = at::empty_like(a_in);
    g.all_to_all_single(a_out, a_in);
    for (int k = 0; k < n; ++k) EXPECT_TRUE(a_out[k].equal(value(k)[0]));
    // send / recv in a ring
    if (n >= 2) {
      at::Tensor got = at::empty_like(value(0));
      if (r % 2 == 0) {
        g.send(value(r), (r + 1) % n);
        g.recv(got, (r + n - 1) % n);
      } else {
        g.recv(got, (r + n - 1) % n);
        g.send(value(r), (r + 1) % n);
      }
      EXPECT_TRUE(got.equal(value((r + n - 1) % n)));
    }
  }
}

void expect_mismatch(const std::function<void()>& call, const std::string& a, const std::string& b) {
  try {
    call();
    ADD_FAILURE() << "mismatched collectives did not throw";
  } catch (const comm::CollectiveError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(a), std::string::npos) << what;
    EXPECT_NE(what.find(b), std::string::npos) << what;
  }
}

// Ranks that disagree are named on every rank (the call check, on in the harness), and the
// group stays usable.
DTENSOR_TEST_BOTH(GlooGaps, ThreadGaps, MismatchedCallsRaiseOnEveryRank) {
  auto& g = t.group();
  const int r = t.rank();
  at::Tensor x = at::ones({2});
  expect_mismatch([&] { r == 0 ? g.broadcast(x, 0) : g.all_reduce(x); }, "[rank 0: broadcast(",
                  "[rank 1: all_reduce(");
  at::Tensor typed = r == 1 ? at::ones({2}, at::kDouble) : at::ones({2});
  expect_mismatch([&] { g.all_reduce(typed); }, "[rank 0: all_reduce(Float[2]", "[rank 1: all_reduce(Double[2]");
  const int last = g.size() - 1;
  at::Tensor sized = at::ones({r == last ? 3 : 2});
  expect_mismatch([&] { g.all_reduce(sized); }, "[rank 0: all_reduce(Float[2]",
                  "[rank " + std::to_string(last) + ": all_reduce(Float[3]");
  g.all_reduce(x);
  EXPECT_EQ(x[0].item<float>(), g.size());
}

TEST(CallCheck, OnInTestProgramsAndSetByTheEnvironment) {
  EXPECT_TRUE(comm::check_collectives_enabled());  // the harness's default
  ::setenv("DTENSOR_CHECK_COLLECTIVES", "0", 1);
  EXPECT_FALSE(comm::check_collectives_enabled());
  ::setenv("DTENSOR_CHECK_COLLECTIVES", "1", 1);
  comm::set_check_collectives_default(false);  // a program without the harness
  EXPECT_TRUE(comm::check_collectives_enabled());
  ::unsetenv("DTENSOR_CHECK_COLLECTIVES");
  EXPECT_FALSE(comm::check_collectives_enabled());
  ::setenv("DTENSOR_CHECK_COLLECTIVES", "yes", 1);
  EXPECT_THROW(comm::check_collectives_enabled(), c10::Error);
  ::unsetenv("DTENSOR_CHECK_COLLECTIVES");
  comm::set_check_collectives_default(true);
}

}  // namespace
}  // namespace dtensor
