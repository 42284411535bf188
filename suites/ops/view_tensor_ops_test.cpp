// suites/ops/view_tensor_ops_test.cpp: behaviour of the view and tensor-op rules beyond what the
// op suite's value checks see: which placements a view keeps (NOTE: [Views of uneven shards]),
// in-place views, writes through views (NOTE: [In-place writes through DTensor views]),
// Partial kept through data movement, advanced indexing layouts and index arguments,
// in-place indexing that re-lays out its target, new_* layouts, and the DTensor factories.
// Ranks are threads (DTensorOpTestBase); the tests whose expected shards are written for 4
// ranks declare it (DTENSOR_REQUIRE_WORLD_SIZE), the others hold at any world size.
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"
#include "harness/dtensor_test_base.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

namespace dtensor {
namespace {

using testing::contains;
using testing::error_of;

std::vector<Placement> placements_of(const at::Tensor& t) { return get_spec(t).placements; }

// A Partial(op) DTensor of `global` on a 1-D mesh: rank r holds global - r (MAX: the max over
// ranks is `global` at rank 0 ... held by rank 0) or global + r (MIN).
at::Tensor partial_of(const at::Tensor& global, const DeviceMesh& mesh, comm::ReduceOp op, int rank) {
  const double shift = op == comm::ReduceOp::MAX ? -rank : rank;
  return from_local(global + shift, mesh, {Partial(op)});
}

// ---- views -------------------------------------------------------------------------------------

class ViewRules : public testing::DTensorOpTestBase {};

DTENSOR_TEST_F(ViewRules, FlattenKeepsAShardOnlyWhereTheRunsOfElementsMatch) {
  DTENSOR_REQUIRE_WORLD_SIZE(4);  // the expected shards are for 4 ranks
  auto mesh = build_device_mesh();
  struct Case {
    std::vector<int64_t> in, out;
    bool keeps;
  };
  // [7, 2] -> [14]: rows 2,2,2,1 are 4,4,4,2 elements, as chunking 14 gives; [5, 6] -> [30]:
  // rows 2,2,1,0 are 12,12,6,0 elements, but chunking 30 gives 8,8,8,6.
  for (const Case& k : {Case{{8, 4}, {32}, true}, Case{{7, 2}, {14}, true}, Case{{5, 6}, {30}, false},
                        Case{{12, 2}, {6, 2, 2}, false}, Case{{16, 2}, {8, 2, 2}, true}}) {
    SCOPED_TRACE(::testing::Message() << c10::IntArrayRef(k.in) << " -> " << c10::IntArrayRef(k.out));
    at::Tensor g = at::arange(c10::multiply_integers(k.in), at::kFloat).view(k.in);
    at::Tensor y = distribute_tensor(g, mesh, {Shard{0}}).view(k.out);
    EXPECT_EQ(placements_of(y), k.keeps ? std::vector<Placement>{Shard{0}} : std::vector<Placement>{Replicate{}});
    EXPECT_TRUE(at::equal(full_tensor(y), g.view(k.out)));
  }
}

// On a 2x2 mesh the second mesh dim splits what the first left: 6 rows -> 3,3 -> 2,1,2,1 rows
// of 2 = 4,2 elements, but 12 elements -> 6,6 -> 3,3: only mesh dim 0 keeps its shard.
DTENSOR_TEST_F(ViewRules, OnA2DMeshEachMeshDimKeepsItsShardOnlyIfEveryCoordinateMatches) {
  DTENSOR_REQUIRE_WORLD_SIZE(4);  // the expected shards are for 4 ranks
  auto mesh = init_device_mesh(device_type(), mesh_shape_2d(), {}, group_ptr());
  at::Tensor g = at::arange(12, at::kFloat).view({6, 2});
  at::Tensor y = distribute_tensor(g, mesh, {Shard{0}, Shard{0}}).view({12});
  // (Shard(0), Replicate()) or (Replicate(), Shard(0)): each is exact, at the same cost.
  EXPECT_NE(placements_of(y), (std::vector<Placement>{Shard{0}, Shard{0}}));
  EXPECT_NE(placements_of(y), (std::vector<Placement>{Replicate{}, Replicate{}}));
  EXPECT_TRUE(at::equal(full_tensor(y), g.view({12})));
  at::Tensor g8 = at::arange(16, at::kFloat).view({8, 2});
  at::Tensor z = distribute_tensor(g8, mesh, {Shard{0}, Shard{0}}).view({16});
  EXPECT_EQ(placements_of(z), (std::vector<Placement>{Shard{0}, Shard{0}}));
  EXPECT_TRUE(at::equal(full_tensor(z), g8.view({16})));
}

// squeeze(d) drops d only: of [1, 1] sharded on dim 1 (one rank holds its element),
// squeeze(1) leaves dim 0, which is not sharded (matching the dims by size took dim 1's shard
// for dim 0's).
DTENSOR_TEST_F(ViewRules, SqueezeDimKeepsTheOtherSizeOneDim) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(1, at::kFloat).view({1, 1});
  at::Tensor y = distribute_tensor(g, mesh, {Shard{1}}).squeeze(1);
  EXPECT_EQ(y.sizes(), c10::IntArrayRef({1}));
  EXPECT_EQ(to_local(y).sizes(), c10::IntArrayRef(compute_local_shape_and_global_offset({1}, mesh, placements_of(y)).first));
  EXPECT_TRUE(at::equal(full_tensor(y), g.squeeze(1)));
}

// A squeeze(d) that is a no-op globally runs on the local shard too: with one row per rank
// the local piece has a dim of 1 there, which the local squeeze would drop.
DTENSOR_TEST_F(ViewRules, ANoOpSqueezeDimKeepsAOneRowShard) {
  auto mesh = build_device_mesh();
  const int64_t n = mesh.size(0);
  if (n == 1) GTEST_SKIP() << "one rank: the dim of one row per rank is 1 globally, and squeeze(0) drops it";
  at::Tensor g = at::arange(n * 4, at::kFloat).view({n, 4});
  at::Tensor y = distribute_tensor(g, mesh, {Shard{0}}).squeeze(0);
  EXPECT_EQ(y.sizes(), g.sizes());
  EXPECT_EQ(to_local(y).dim(), 2);
  EXPECT_TRUE(at::equal(full_tensor(y), g));
}

// NOTE: [Redistributed pieces keep the global layout]: a select on the sharded dim of a
// permuted DTensor gathers it; the transpose of what is left is contiguous globally, so
// flatten views it, and the local piece must allow that view too.
DTENSOR_TEST_F(ViewRules, AGatheredPieceKeepsTheGlobalLayoutForLaterViews) {
  auto mesh = build_device_mesh();
  const int64_t n = mesh.size(0);
  at::Tensor g = at::arange(n * 2 * 4 * 3, at::kFloat).view({n * 2, 4, 3});
  at::Tensor plain = g.permute({2, 0, 1}).select(1, 1).transpose(0, 1);
  at::Tensor d = distribute_tensor(g, mesh, {Shard{0}}).permute({2, 0, 1}).select(1, 1);
  EXPECT_EQ(placements_of(d), std::vector<Placement>{Replicate{}});
  EXPECT_EQ(to_local(d).strides(), d.strides());
  d = d.transpose(0, 1);
  ASSERT_TRUE(d.is_contiguous());
  at::Tensor flat = d.flatten();
  EXPECT_TRUE(at::equal(full_tensor(flat), plain.flatten()));
}

DTENSOR_TEST_F(ViewRules, SqueezeNeverDropsADimWithAOneElementShard) {
  DTENSOR_REQUIRE_WORLD_SIZE(4);  // the expected shards are for 4 ranks
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(8, at::kFloat).view({2, 1, 4});  // dim 0 on 4 ranks: 1,1,0,0 rows
  at::Tensor x = distribute_tensor(g, mesh, {Shard{0}});
  // NOTE: [squeeze() of a shard of one element]: each rank squeezes the dims that are 1
  // globally, so the shards of dim 0 stay, without communication.
  testing::CommCounter counting;
  at::Tensor y = x.squeeze();
  EXPECT_EQ(counting.collectives(), 0);
  EXPECT_EQ(y.sizes(), c10::IntArrayRef({2, 4}));
  EXPECT_EQ(placements_of(y), std::vector<Placement>{Shard{0}});
  EXPECT_EQ(to_local(y).dim(), 2);
  EXPECT_TRUE(at::equal(full_tensor(y), g.squeeze()));
  at::Tensor x2 = x.clone();
  x2.squeeze_();
  EXPECT_EQ(x2.sizes(), c10::IntArrayRef({2, 4}));
  EXPECT_EQ(placements_of(x2), std::vector<Placement>{Shard{0}});
  EXPECT_TRUE(at::equal(full_tensor(x2), g.squeeze()));
  x.squeeze_(1);  // names its dim: the shards of dim 0 stay
  EXPECT_EQ(x.sizes(), c10::IntArrayRef({2, 4}));
  EXPECT_EQ(placements_of(x), std::vector<Placement>{Shard{0}});
  EXPECT_TRUE(at::equal(full_tensor(x), g.squeeze(1)));
}

DTENSOR_TEST_F(ViewRules, InPlaceViewsMoveThePlacementsOfEveryHandle) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4});
  at::Tensor x = distribute_tensor(g, mesh, {Shard{1}});
  at::Tensor handle = x;  // the same DTensorImpl
  x.unsqueeze_(0);
  EXPECT_EQ(handle.sizes(), c10::IntArrayRef({1, 8, 4}));
  EXPECT_EQ(placements_of(handle), std::vector<Placement>{Shard{2}});
  x.transpose_(0, 2);
  EXPECT_EQ(placements_of(handle), std::vector<Placement>{Shard{0}});
  EXPECT_TRUE(at::equal(full_tensor(handle), g.unsqueeze(0).transpose(0, 2)));
}

// NOTE: [Partial through data movement]: views and reorderings keep every reduction; ops that
// write a constant other than zero do not keep sum.
DTENSOR_TEST_F(ViewRules, ViewsKeepEveryPartial) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4});
  for (auto op : {comm::ReduceOp::MAX, comm::ReduceOp::MIN}) {
    at::Tensor x = partial_of(g, mesh, op, rank());
    at::Tensor y = x.t().select(0, 1).unsqueeze(1);
    EXPECT_EQ(placements_of(y), std::vector<Placement>{Partial(op)});
    EXPECT_TRUE(at::equal(full_tensor(y), g.t().select(0, 1).unsqueeze(1)));
    at::Tensor z = at::roll(at::cat({x, x}, 1), {3}, {0});
    EXPECT_EQ(placements_of(z), std::vector<Placement>{Partial(op)});
    EXPECT_TRUE(at::equal(full_tensor(z), at::roll(at::cat({g, g}, 1), {3}, {0})));
  }
  // scatter.value writes 7 on every rank: the max of 7s is 7, their sum is not.
  at::Tensor idx = distribute_tensor(at::zeros({1, 4}, at::kLong), mesh, {Replicate{}});
  at::Tensor maxed = partial_of(g, mesh, comm::ReduceOp::MAX, rank()).scatter(0, idx, 7.0);
  EXPECT_EQ(placements_of(maxed), std::vector<Placement>{Partial(comm::ReduceOp::MAX)});
  EXPECT_TRUE(at::equal(full_tensor(maxed), g.scatter(0, at::zeros({1, 4}, at::kLong), 7.0)));
  at::Tensor summed = from_local(g / group().size(), mesh, {Partial{}}).scatter(0, idx, 7.0);
  EXPECT_NE(placements_of(summed), std::vector<Placement>{Partial{}});
  EXPECT_TRUE(at::allclose(full_tensor(summed), g.scatter(0, at::zeros({1, 4}, at::kLong), 7.0)));
}

DTENSOR_TEST_F(ViewRules, WritesThroughAViewReachTheBaseOrRaise) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4});
  at::Tensor expected = g.clone();
  expected.slice(1, 1, 3).fill_(-1);
  expected.select(1, 3).copy_(at::full({8}, 5.0));
  at::Tensor x = distribute_tensor(g, mesh, {Shard{0}});
  x.slice(1, 1, 3).fill_(-1);  // dim 1 is not sharded: the view aliases the shard
  x.select(1, 3).copy_(distribute_tensor(at::full({8}, 5.0), mesh, {Shard{0}}));
  EXPECT_TRUE(at::equal(full_tensor(x), expected));
  at::Tensor col = distribute_tensor(g, mesh, {Shard{1}});
  at::Tensor v = col.slice(1, 1, 3);  // slicing the sharded dim replicates first
  EXPECT_TRUE(unsafe_get_dtensor_impl(v)->is_detached_view());
  EXPECT_PRED2(contains, error_of([&] { v.fill_(-1); }),
               "aten::fill_.Scalar writes into a view of a DTensor (placements (Replicate(),), shape [8, 2]) that "
               "does not share memory with the tensor it was taken from");
  EXPECT_PRED2(contains, error_of([&] { v.t().mul_(2); }), "writes into a view of a DTensor");  // views of it too
  EXPECT_TRUE(at::equal(full_tensor(col), g));
  at::Tensor copy = v.clone();
  copy.fill_(-1);  // a copy is not a view
  EXPECT_TRUE(at::equal(full_tensor(copy), at::full({8, 2}, -1.0)));
}

// Autograd rebuilds in-place ops on views (CopySlices) with new_empty_strided and as_strided at
// the views' storage offsets.
DTENSOR_TEST_F(ViewRules, InPlaceOnAViewGivesTheSingleDeviceGradient) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4}) / 8;
  at::Tensor plain = g.clone().requires_grad_(true);
  at::Tensor q = at::arange(8, at::kFloat);
  at::Tensor p = plain * 1;
  p.slice(1, 1, 3).mul_(3);
  p.select(1, 3).add_(q);
  (p * p).sum().backward();
  for (const std::vector<Placement>& ps : {std::vector<Placement>{Shard{0}}, std::vector<Placement>{Replicate{}}}) {
    SCOPED_TRACE(to_string(ps));
    at::Tensor leaf = distribute_tensor(g, mesh, ps).requires_grad_(true);
    at::Tensor d = leaf * 1;
    d.slice(1, 1, 3).mul_(3);
    d.select(1, 3).add_(distribute_tensor(q, mesh, {Replicate{}}));
    full_tensor(d * d).sum().backward();
    EXPECT_TRUE(at::allclose(full_tensor(d), p.detach()));
    EXPECT_TRUE(at::allclose(full_tensor(leaf.grad()), plain.grad()));
  }
}

DTENSOR_TEST_F(ViewRules, AsStridedReadsOnlyTheDTensorsOwnElements) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4});
  at::Tensor x = distribute_tensor(g, mesh, {Shard{0}});
  at::Tensor identity = x.as_strided({8, 4}, {4, 1});
  EXPECT_EQ(placements_of(identity), std::vector<Placement>{Shard{0}});
  at::Tensor rows = x.slice(0, 2, 4);  // a contiguous view starting at storage offset 8
  EXPECT_EQ(rows.storage_offset(), 8);
  EXPECT_TRUE(at::equal(full_tensor(rows.as_strided({4, 2}, {1, 4})), g.slice(0, 2, 4).as_strided({4, 2}, {1, 4})));
  EXPECT_PRED2(contains, error_of([&] { (void)rows.as_strided({2, 4}, {4, 1}, 0); }),
               "reads storage outside the DTensor of shape [2, 4] (storage offset 8)");
  EXPECT_PRED2(contains, error_of([&] { (void)x.t().as_strided({4}, {1}); }),
               "with non-contiguous strides [1, 4]: a DTensor has no storage for as_strided to read");
}

// ---- tensor ops ----------------------------------------------------------------------------------

class TensorRules : public testing::DTensorOpTestBase {};

// Partial(avg), (max) and (min) pieces joined with replicated ones stay Partial, with no
// communication (a replicated piece is its own mean, max and min over the ranks).
DTENSOR_TEST_F(TensorRules, JoiningPartialMaximaAndMinimaWithReplicatedPieces) {
  auto mesh = build_device_mesh();
  const at::Tensor x = (at::arange(12, at::kDouble) * 0.37).sin().view({3, 4}), y = at::arange(8, at::kDouble).view({2, 4}) / 7;
  const at::Tensor ry = distribute_tensor(y, mesh, {Replicate{}});
  const Partial max(comm::ReduceOp::MAX), min(comm::ReduceOp::MIN);
  testing::CommCounter counting;
  const at::Tensor joined = at::cat({from_local(x - rank(), mesh, {max}), ry}, 0);
  const at::Tensor stacked = at::stack({ry.narrow(0, 0, 1).expand({3, 4}).contiguous(), from_local(x + rank(), mesh, {min})}, 1);
  EXPECT_EQ(counting.collectives(), 0);
  EXPECT_EQ(get_spec(joined).placements, std::vector<Placement>{max});
  EXPECT_EQ(get_spec(stacked).placements, std::vector<Placement>{min});
  EXPECT_TRUE(at::allclose(full_tensor(joined), at::cat({x, y}, 0)));
  EXPECT_TRUE(at::allclose(full_tensor(stacked), at::stack({y.narrow(0, 0, 1).expand({3, 4}), x}, 1)));
  // A Partial(sum) piece makes the replicated one a Partial(sum) first (a local split), or is
  // reduced: the value is the join either way.
  const at::Tensor sum_joined = at::cat({from_local(x / mesh.size(), mesh, {Partial{}}), ry}, 0);
  EXPECT_TRUE(at::allclose(full_tensor(sum_joined), at::cat({x, y}, 0)));
}

// NOTE: [Triangles of a shard]: a causal mask keeps the shards of its last two dims, with no
// communication, uneven and empty pieces included.
DTENSOR_TEST_F(TensorRules, TrilAndTriuKeepShardsOfTheirLastTwoDims) {
  auto mesh = build_device_mesh();
  const at::Tensor g = at::arange(1, 1 + 5 * 7, at::kFloat).view({5, 7});
  for (int64_t d : {0, 1})
    for (int64_t k : {-2, 0, 1, 5}) {
      SCOPED_TRACE(c10::str("Shard(", d, ") diagonal ", k));
      at::Tensor x = distribute_tensor(g, mesh, {Shard{d}});
      testing::CommCounter counting;
      at::Tensor lower = at::tril(x, k), upper = at::triu(x, k);
      EXPECT_EQ(counting.collectives(), 0);
      EXPECT_EQ(get_spec(lower).placements, std::vector<Placement>{Shard{d}});
      EXPECT_TRUE(at::equal(full_tensor(lower), at::tril(g, k)));
      EXPECT_TRUE(at::equal(full_tensor(upper), at::triu(g, k)));
      x.triu_(k);
      EXPECT_TRUE(at::equal(full_tensor(x), at::triu(g, k)));
    }
}

using Indices = c10::List<c10::optional<at::Tensor>>;

DTENSOR_TEST_F(TensorRules, AShardedIndexShardsTheIndexResult) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4});
  at::Tensor idx = at::tensor({3, 0, 2, 1, 1, 3, 0, 2}, at::kLong);
  at::Tensor x = distribute_tensor(g, mesh, {Replicate{}});
  at::Tensor i = distribute_tensor(idx, mesh, {Shard{0}});
  at::Tensor rows = at::index(x, Indices({c10::optional<at::Tensor>(i.remainder(8))}));
  at::Tensor cols = at::index(x, Indices({c10::nullopt, c10::optional<at::Tensor>(i)}));
  EXPECT_EQ(placements_of(rows), std::vector<Placement>{Shard{0}});  // x[idx]: [8, 4]
  EXPECT_EQ(placements_of(cols), std::vector<Placement>{Shard{1}});  // x[:, idx]: [8, 8]
  EXPECT_TRUE(at::equal(full_tensor(rows), at::index(g, Indices({c10::optional<at::Tensor>(idx)}))));
  EXPECT_TRUE(at::equal(full_tensor(cols), at::index(g, Indices({c10::nullopt, c10::optional<at::Tensor>(idx)}))));
  // A sharded dim that is not indexed keeps its shards.
  at::Tensor by_row = distribute_tensor(g, mesh, {Shard{0}});
  at::Tensor picked = at::index(by_row, Indices({c10::nullopt, c10::optional<at::Tensor>(distribute_tensor(idx, mesh, {Replicate{}}))}));
  EXPECT_EQ(placements_of(picked), std::vector<Placement>{Shard{0}});
}

DTENSOR_TEST_F(TensorRules, PlainIndicesAreReplicatedOnlyWhenAskedTo) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4});
  at::Tensor idx = at::tensor({1, 3}, at::kLong);
  at::Tensor x = distribute_tensor(g, mesh, {Shard{1}});
  EXPECT_PRED2(contains, error_of([&] { (void)at::index(x, Indices({c10::optional<at::Tensor>(idx)})); }),
               "aten::index.Tensor got a plain tensor of shape [2] as argument 'indices'");
  ImplicitReplicationGuard guard;
  at::Tensor y = at::index(x, Indices({c10::optional<at::Tensor>(idx)}));
  EXPECT_EQ(placements_of(y), std::vector<Placement>{Shard{1}});
  EXPECT_TRUE(at::equal(full_tensor(y), g.index_select(0, idx)));
}

DTENSOR_TEST_F(TensorRules, ABoolMaskGivesAReplicatedResultOfTheMasksShape) {
  auto mesh = build_device_mesh();
  at::Tensor g = at::arange(32, at::kFloat).view({8, 4});
  at::Tensor mask = g.remainder(3) == 0;
  at::Tensor x = distribute_tensor(g, mesh, {Shard{0}});
  at::Tensor y = at::index(x, Indices({c10::optional<at::Tensor>(distribute_tensor(mask, mesh, {Shard{0}}))}));
  EXPECT_EQ(y.sizes(), c10::IntArrayRef({11}));
  EXPECT_EQ(placements_of(y), std::vector<Placement>{Replicate{}});
  EXPECT_TRUE(at::equal(full_tensor(y), g.masked_select(mask)));
  // x[mask] = -1 with a plain scalar value: no dim of x escapes the mask, so x is replicated
  // (NOTE: [In-place indexing may re-lay out what it writes]).
  x.index_put_(Indices({c10::optional<at::Tensor>(distribute_tensor(mask, mesh, {Shard{0}}))}), at::scalar_tensor(-1.0));
  EXPECT_EQ(placements_of(x), std::vector<Placement>{Replicate{}});
  EXPECT_TRUE(at::equal(full_tensor(x), g.masked_fill(mask, -1.0)));
}

// NOTE: [In-place indexing may re-lay out what it writes]
DTENSOR_TEST_F(TensorRules, InPlaceIndexingMayChangeTheLayoutOfWhatItWrites) {
  auto mesh = build_device_mesh();
  at::Tensor idx = at::tensor({0, 5, 5, 7}, at::kLong);
  at::Tensor src = at::arange(16, at::kFloat).view({4, 4});
  at::Tensor buf = dtensor::zeros({8, 4}, mesh, {Shard{0}});
  at::Tensor handle = buf;
  buf.index_add_(0, distribute_tensor(idx, mesh, {Replicate{}}), distribute_tensor(src, mesh, {Replicate{}}));
  EXPECT_EQ(placements_of(handle), std::vector<Placement>{Replicate{}});  // dim 0 is indexed
  EXPECT_TRUE(at::equal(full_tensor(handle), at::zeros({8, 4}).index_add_(0, idx, src)));
  // A layout that works is kept.
  at::Tensor cols = dtensor::zeros({8, 4}, mesh, {Shard{1}});
  cols.index_add_(0, distribute_tensor(idx, mesh, {Replicate{}}), distribute_tensor(src, mesh, {Shard{1}}));
  EXPECT_EQ(placements_of(cols), std::vector<Placement>{Shard{1}});
  EXPECT_TRUE(at::equal(full_tensor(cols), at::zeros({8, 4}).index_add_(0, idx, src)));
}

DTENSOR_TEST_F(TensorRules, NewFactoriesFollowTheInputOnlyForItsShape) {
  auto mesh = build_device_mesh();
  at::Tensor x = distribute_tensor(at::ones({8, 4}), mesh, {Shard{1}});
  EXPECT_EQ(placements_of(x.new_zeros({8, 4})), std::vector<Placement>{Shard{1}});
  EXPECT_EQ(placements_of(x.new_full({3, 5}, 2.0)), std::vector<Placement>{Replicate{}});
  EXPECT_TRUE(at::equal(full_tensor(x.new_full({3, 5}, 2.0)), at::full({3, 5}, 2.0)));
  // The buffer autograd's CopySlices writes through as_strided views of.
  EXPECT_EQ(placements_of(x.new_empty_strided({8, 4}, {4, 1})), std::vector<Placement>{Replicate{}});
}

// ---- factories -----------------------------------------------------------------------------------

class DTensorFactory : public testing::DTensorOpTestBase {};

DTENSOR_TEST_F(DTensorFactory, CreatesOnlyTheLocalShard) {
  DTENSOR_REQUIRE_WORLD_SIZE(4);  // the expected shards are for 4 ranks
  auto mesh = build_device_mesh();
  at::Tensor z = dtensor::zeros({10, 4}, mesh, {Shard{0}});
  EXPECT_EQ(local_tensor(z).sizes(), c10::IntArrayRef({rank() < 3 ? 3 : 1, 4}));  // 3,3,3,1 rows
  EXPECT_TRUE(at::equal(full_tensor(z), at::zeros({10, 4})));
  auto mesh2 = init_device_mesh(device_type(), mesh_shape_2d(), {}, group_ptr());
  at::Tensor o = dtensor::ones({5, 3}, mesh2, {Shard{0}, Shard{1}}, at::kDouble);
  EXPECT_EQ(o.scalar_type(), at::kDouble);
  EXPECT_TRUE(at::equal(full_tensor(o), at::ones({5, 3}, at::kDouble)));
  at::Tensor f = dtensor::full({6}, 7, mesh, {Shard{0}});
  EXPECT_EQ(f.scalar_type(), at::kLong);  // from the value, as at::full
  EXPECT_TRUE(at::equal(full_tensor(f), at::full({6}, 7)));
  at::Tensor e = dtensor::empty({2, 9}, mesh, {Shard{1}}, at::kHalf);
  EXPECT_EQ(e.sizes(), c10::IntArrayRef({2, 9}));
  EXPECT_EQ(local_tensor(e).sizes(), c10::IntArrayRef({2, rank() < 3 ? 3 : 0}));
  at::Tensor r = dtensor::arange(1, 4, 0.25, mesh, {Shard{0}});
  EXPECT_TRUE(at::equal(full_tensor(r), at::arange(1, 4, 0.25)));
  EXPECT_EQ(local_tensor(r).size(0), 3);  // 12 values
}

DTENSOR_TEST_F(DTensorFactory, RequiresGradGivesALeaf) {
  auto mesh = build_device_mesh();
  at::Tensor w = dtensor::ones({8, 4}, mesh, {Shard{0}}, at::TensorOptions().requires_grad(true));
  EXPECT_TRUE(w.requires_grad());
  EXPECT_TRUE(w.is_leaf());
  full_tensor(w * 3).sum().backward();
  ASSERT_TRUE(w.grad().defined());
  EXPECT_EQ(placements_of(w.grad()), std::vector<Placement>{Shard{0}});
  EXPECT_TRUE(at::equal(full_tensor(w.grad()), at::full({8, 4}, 3.0)));
}

DTENSOR_TEST_F(DTensorFactory, RejectsPartialOfNonZerosAndWrongPlacementCounts) {
  auto mesh = build_device_mesh();
  EXPECT_PRED2(contains, error_of([&] { (void)dtensor::ones({4}, mesh, {Partial{}}); }),
               "dtensor::ones: placements (Partial(sum),) on DeviceMesh('cpu', ");
  at::Tensor z = dtensor::zeros({4}, mesh, {Partial{}});  // zeros sum to zeros
  EXPECT_TRUE(at::equal(full_tensor(z), at::zeros({4})));
  EXPECT_PRED2(contains, error_of([&] { (void)dtensor::zeros({4}, mesh, {Shard{0}, Shard{0}}); }),
               "dtensor::zeros: 2 placements for the 1-D mesh");
  EXPECT_PRED2(contains, error_of([&] { (void)dtensor::zeros({4}, mesh, {Shard{1}}); }),
               "dtensor::zeros: Shard(dim=1) is out of range for a tensor with ndim=1");
}

// NOTE: [Factories and the DTensor key]: an aten factory reaches the fallback only when the
// key is included by hand, and there is no mesh to create on.
DTENSOR_TEST_F(DTensorFactory, AtenFactoriesUnderTheDTensorKeyRaise) {
  c10::impl::IncludeDispatchKeyGuard include(kDTensorKey);
  EXPECT_PRED2(contains, error_of([] { (void)at::zeros({2, 3}); }),
               "aten::zeros reached the DTensor fallback without a DTensor argument");
}

}  // namespace
}  // namespace dtensor
