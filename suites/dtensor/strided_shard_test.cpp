// _StridedShard (NOTE: [Strided shards] in dtensor/placement/placement.h): construction,
// printing, equality and hashing; the split order and the local shape / offset math against
// hand-written orders on 2-D and 3-D meshes, even and uneven; the refusals PyTorch makes; and
// distribute_tensor / redistribute / full_tensor / from_local against the single-device tensor
// on meshes over all ranks of any even world size (threads, and processes for the (n/2, 2)
// case).
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>

#include <functional>
#include <unordered_set>

namespace dtensor {
namespace {

using testing::contains;
using testing::error_of;
using Shape = std::vector<int64_t>;
using Placements = std::vector<Placement>;

TEST(StridedShard, ConstructionPrintingEqualityAndHash) {
  const Placement s = StridedShard(0, 2);
  EXPECT_TRUE(is_shard(s));
  EXPECT_TRUE(is_shard(s, 0));
  EXPECT_FALSE(is_shard(s, 1));
  EXPECT_TRUE(is_strided_shard(s));
  EXPECT_FALSE(is_strided_shard(Shard{0}));
  EXPECT_FALSE(is_strided_shard(Replicate{}));
  EXPECT_EQ(std::get<Shard>(s).dim, 0);
  EXPECT_EQ(std::get<Shard>(s).split_factor, 2);
  // PyTorch's repr.
  EXPECT_EQ(to_string(s), "_StridedShard(dim=0, sf=2)");
  EXPECT_EQ(to_string(Placements{StridedShard(0, 2), Shard{0}}), "(_StridedShard(dim=0, sf=2), Shard(dim=0))");
  std::ostringstream os;
  os << s;
  EXPECT_EQ(os.str(), "_StridedShard(dim=0, sf=2)");
  // split_factor 1 is a plain Shard.
  EXPECT_EQ(Placement(StridedShard(1, 1)), Placement(Shard{1}));
  EXPECT_EQ(to_string(StridedShard(1, 1)), "Shard(dim=1)");
  // Unlike PyTorch's __eq__, a strided shard never equals the plain one (the layouts differ).
  EXPECT_NE(s, Placement(Shard{0}));
  EXPECT_NE(s, Placement(StridedShard(0, 3)));
  EXPECT_NE(s, Placement(StridedShard(1, 2)));
  EXPECT_EQ(s, Placement(StridedShard(0, 2)));
  EXPECT_EQ(hash_value(s), hash_value(Placement(StridedShard(0, 2))));
  std::unordered_set<std::size_t> hashes = {hash_value(s), hash_value(Placement(Shard{0})),
                                            hash_value(Placement(StridedShard(0, 3))),
                                            hash_value(Placement(StridedShard(1, 2)))};
  EXPECT_EQ(hashes.size(), 4u);
  EXPECT_PRED2(contains, error_of([] { StridedShard(0, 0); }),
               "_StridedShard(dim=0, split_factor=0): split_factor must be at least 1");
  // Negative dims normalise like Shard's, keeping the split factor.
  EXPECT_EQ(normalize_placements({StridedShard(-2, 2), Shard{-2}}, 2), (Placements{StridedShard(0, 2), Shard{0}}));
}

// PyTorch's test_1d_mesh_strided_sharding / test_2d_mesh_strided_sharding pieces.
TEST(StridedShard, SplitTensorInterleavesAsPyTorch) {
  auto values = [](const std::vector<at::Tensor>& pieces) {
    std::vector<std::vector<int64_t>> out;
    for (const auto& p : pieces) {
      at::Tensor c = p.contiguous().to(at::kLong);
      out.emplace_back(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
    }
    return out;
  };
  const at::Tensor x = at::arange(8, at::kLong);
  using V = std::vector<std::vector<int64_t>>;
  EXPECT_EQ(values(split_tensor(StridedShard(0, 2), x, 4)), (V{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(values(split_tensor(StridedShard(0, 1), x, 4)), (V{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(values(split_tensor(StridedShard(0, 2), x, 2)), (V{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  // Along dim 1 of a [2, 4] tensor.
  EXPECT_EQ(values(split_tensor(StridedShard(1, 2), x.reshape({2, 4}), 2)), (V{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  // Uneven: 5 rows, sf 2 -> pieces of 3 and 2 rows, each cut in 2; padded to the longest.
  std::vector<int64_t> pads;
  EXPECT_EQ(values(split_tensor(StridedShard(0, 2), at::arange(5, at::kLong), 2)), (V{{0, 1, 3}, {2, 4}}));
  auto padded = split_tensor(StridedShard(0, 2), at::arange(5, at::kLong), 2, /*with_padding=*/true, &pads);
  EXPECT_EQ(values(padded), (V{{0, 1, 3}, {2, 4, 0}}));
  EXPECT_EQ(pads, (std::vector<int64_t>{0, 1}));
}

// A hand-written split order: for tensor dim 0, the mesh dims in the order they split it.
struct OrderCase {
  std::string name;
  Shape mesh_shape;
  Placements placements;
  std::vector<int64_t> order;  // of tensor dim 0
};

std::vector<OrderCase> order_cases() {
  return {
      // FSDP x TP (PyTorch's _StridedShard docstring): tp splits first, then dp.
      {"fsdp_tp_2x2", {2, 2}, {StridedShard(0, 2), Shard{0}}, {1, 0}},
      {"fsdp_tp_3x2", {3, 2}, {StridedShard(0, 2), Shard{0}}, {1, 0}},
      {"fsdp_tp_2x3", {2, 3}, {StridedShard(0, 3), Shard{0}}, {1, 0}},
      {"plain_2x2", {2, 2}, {Shard{0}, Shard{0}}, {0, 1}},
      // HSDP x TP: (replicate, shard, tp).
      {"hsdp_tp_2x2x2", {2, 2, 2}, {Replicate{}, StridedShard(0, 2), Shard{0}}, {2, 1}},
      // PyTorch's _explicit_order_placements example.
      {"shard_strided_shard_2x2x2", {2, 2, 2}, {Shard{0}, StridedShard(0, 2), Shard{0}}, {0, 2, 1}},
      // Two strided mesh dims: the last one waits for the Shard, the first for both.
      {"strided_strided_shard_2x3x2", {2, 3, 2}, {StridedShard(0, 6), StridedShard(0, 2), Shard{0}}, {2, 1, 0}},
      // A strided dim of size 1 (HSDP with one replica group).
      {"size1_strided_1x2x2", {1, 2, 2}, {StridedShard(0, 4), StridedShard(0, 2), Shard{0}}, {2, 1, 0}},
  };
}

// Reference: the rows of dim 0 that coordinate `coord` holds, by splitting [0, n) with
// torch.chunk mesh dim after mesh dim in the hand-written order.
std::pair<int64_t, int64_t> reference_rows(int64_t n, const OrderCase& c, const Shape& coord) {
  at::Tensor rows = at::arange(n, at::kLong);
  for (int64_t i : c.order) {
    const int64_t k = c.mesh_shape[i];
    const int64_t chunk = (rows.size(0) + k - 1) / k;
    const int64_t begin = std::min(coord[i] * chunk, rows.size(0));
    const int64_t end = std::min(begin + chunk, rows.size(0));
    rows = rows.slice(0, begin, end);
  }
  return {rows.size(0), rows.size(0) ? rows[0].item<int64_t>() : -1};
}

std::vector<Shape> coordinates(const Shape& mesh_shape) {
  std::vector<Shape> out{Shape(mesh_shape.size(), 0)};
  for (size_t d = mesh_shape.size(); d-- > 0;) {
    std::vector<Shape> next;
    for (const auto& c : out)
      for (int64_t x = 0; x < mesh_shape[d]; ++x) {
        Shape e = c;
        e[d] = x;
        next.push_back(e);
      }
    out = next;
  }
  return out;
}

TEST(StridedShard, SplitOrderAndLocalShapeOffsetFollowTorchChunkInThatOrder) {
  for (const auto& c : order_cases()) {
    SCOPED_TRACE(c.name);
    EXPECT_EQ(shard_order(c.mesh_shape, c.placements, 2), (std::vector<Shape>{c.order, {}}));
    for (int64_t n : {0, 1, 2, 3, 5, 7, 8, 11, 12, 13, 24}) {
      SCOPED_TRACE("rows " + std::to_string(n));
      std::vector<int64_t> covered(static_cast<size_t>(n), 0);
      for (const auto& coord : coordinates(c.mesh_shape)) {
        SCOPED_TRACE(c10::str(c10::IntArrayRef(coord)));
        auto [shape, offset] = compute_local_shape_and_global_offset({n, 3}, c.mesh_shape, c.placements, coord);
        auto [size, first] = reference_rows(n, c, coord);
        EXPECT_EQ(shape, (Shape{size, 3}));
        if (size > 0) EXPECT_EQ(offset, (Shape{first, 0}));
        for (int64_t r = offset[0]; r < offset[0] + shape[0]; ++r) covered[static_cast<size_t>(r)] += 1;
      }
      // Every row is held by (number of coordinates / number of shards) ranks: the replicas.
      int64_t shards = 1;
      for (int64_t i : c.order) shards *= c.mesh_shape[i];
      int64_t ranks = 1;
      for (int64_t s : c.mesh_shape) ranks *= s;
      for (int64_t r = 0; r < n; ++r) EXPECT_EQ(covered[static_cast<size_t>(r)], ranks / shards) << "row " << r;
    }
  }
  // PyTorch's docstring table: 8 rows on a 2x2 (dp, tp) mesh, (_StridedShard(0, sf=2), Shard(0)).
  const Placements fsdp_tp = {StridedShard(0, 2), Shard{0}};
  const std::vector<std::pair<Shape, int64_t>> table = {{{0, 0}, 0}, {{0, 1}, 4}, {{1, 0}, 2}, {{1, 1}, 6}};
  for (const auto& [coord, first] : table) {
    auto [shape, offset] = compute_local_shape_and_global_offset({8, 8}, {2, 2}, fsdp_tp, coord);
    EXPECT_EQ(shape, (Shape{2, 8}));
    EXPECT_EQ(offset, (Shape{first, 0}));
  }
  // A strided dim next to a plainly sharded other dim.
  auto [shape, offset] =
      compute_local_shape_and_global_offset({6, 4}, {2, 2, 2}, {Shard{1}, StridedShard(0, 2), Shard{0}}, Shape{1, 0, 1});
  EXPECT_EQ(shape, (Shape{2, 2}));   // dim 0: tp piece 1 = rows 3-5, dp piece 0 of it = rows 3-4
  EXPECT_EQ(offset, (Shape{3, 2}));
}

TEST(StridedShard, RefusesWhatPyTorchRefuses) {
  const std::vector<std::tuple<std::string, Shape, Placements, std::string>> cases = {
      {"split factor is not the later mesh size", {2, 2}, {StridedShard(0, 3), Shard{0}},
       "Can only convert _StridedShard to ordered Shard if split_factor(3) == aggregate mesh size (2): "
       "_StridedShard(dim=0, sf=3) at mesh dim 0"},
      {"split factors of two strided dims", {2, 2, 2}, {StridedShard(0, 2), StridedShard(0, 2), Shard{0}},
       "split_factor(2) == aggregate mesh size (4)"},
      {"shard after the strided part", {2, 2, 2}, {StridedShard(0, 2), Shard{0}, Shard{0}},
       "Strided sharding does not allow Shard() to appear after the strided part has ended: Shard(dim=0) at mesh dim 2"},
      {"no later shard of the dim", {2, 2}, {StridedShard(0, 2), Replicate{}},
       "_StridedShard(dim=0, sf=2) at mesh dim 0 of placements (_StridedShard(dim=0, sf=2), Replicate()) on a mesh of "
       "shape [2, 2]: a _StridedShard needs a later Shard(dim=0) mesh dim"},
      {"later shard of another dim", {2, 2}, {StridedShard(0, 2), Shard{1}}, "needs a later Shard(dim=0) mesh dim"},
  };
  for (const auto& [what, mesh_shape, placements, expected] : cases) {
    SCOPED_TRACE(what);
    EXPECT_PRED2(contains, error_of([&] { shard_order(mesh_shape, placements, 2); }), expected);
    EXPECT_PRED2(contains, error_of([&] {
                   compute_local_shape_and_global_offset({8, 8}, mesh_shape, placements, Shape(mesh_shape.size(), 0));
                 }),
                 expected);
  }
}

class StridedShardThreads : public testing::MultiThreadedTest {};
class StridedShardGloo : public testing::MultiProcessTest {};

at::Tensor global_input(const Shape& shape) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return (at::arange(n, at::kDouble) * 0.37).sin().reshape(shape).to(at::kFloat);
}

// This rank's box of `g` as compute_local_shape_and_global_offset says (checked against the
// hand-written orders above).
at::Tensor box_of(const at::Tensor& g, const DeviceMesh& mesh, const Placements& ps) {
  auto [shape, offset] = compute_local_shape_and_global_offset(g.sizes(), mesh, ps);
  at::Tensor t = g;
  for (int64_t d = 0; d < g.dim(); ++d) t = t.narrow(d, std::min(offset[d], g.size(d)), shape[d]);
  return t;
}

// Every transition into and out of the strided layouts of `strided` on `mesh_shape` (on the
// rank's device), against the single-device tensor.
void check_strided_redistribution(const testing::MultiRankTest& t, const Shape& mesh_shape,
                                  const std::vector<Placements>& strided, const std::vector<Placements>& others,
                                  const std::vector<Shape>& shapes) {
  auto mesh = init_device_mesh(t.device_type(), mesh_shape);
  for (const Shape& shape : shapes) {
    const at::Tensor g = global_input(shape);
    for (const Placements& s : strided) {
      SCOPED_TRACE(::testing::Message() << c10::IntArrayRef(shape) << " " << to_string(s));
      at::Tensor x = distribute_tensor(g, mesh, s);
      EXPECT_EQ(get_spec(x).placements, s);
      ASSERT_TRUE(at::equal(local_tensor(x).cpu(), box_of(g, mesh, s)));
      EXPECT_TRUE(at::equal(full_tensor(x).cpu(), g));
      // from_local with the global shape gives the same DTensor.
      at::Tensor y = from_local(box_of(g, mesh, s).clone(), mesh, s, FromLocalOptions::contiguous(shape, /*run_check=*/true));
      EXPECT_TRUE(at::equal(full_tensor(y).cpu(), g));
      for (const Placements& o : others) {
        SCOPED_TRACE(to_string(s) + " <-> " + to_string(o));
        at::Tensor to_other = redistribute(x, mesh, o);
        EXPECT_EQ(get_spec(to_other).placements, o);
        EXPECT_TRUE(at::equal(local_tensor(to_other).cpu(), box_of(g, mesh, o)));
        at::Tensor back = redistribute(distribute_tensor(g, mesh, o), mesh, s);
        EXPECT_EQ(get_spec(back).placements, s);
        EXPECT_TRUE(at::equal(local_tensor(back).cpu(), box_of(g, mesh, s)));
      }
    }
  }
}

// The split factor of a StridedShard is the size of the later mesh dims that shard the same
// tensor dim: 2 on an (n/2, 2) mesh at any world size.
DTENSOR_TEST_F(StridedShardThreads, Mesh2DRedistributionMatchesTheSingleDeviceTensor) {
  check_strided_redistribution(*this, mesh_shape_2d(), {{StridedShard(0, 2), Shard{0}}, {StridedShard(1, 2), Shard{1}}},
                               {{Shard{0}, Shard{0}}, {Replicate{}, Shard{0}}, {Shard{0}, Replicate{}},
                                {Replicate{}, Replicate{}}, {Shard{1}, Shard{0}}, {Replicate{}, Shard{1}}},
                               {{8, 4}, {7, 5}, {5, 3}, {3, 2}, {1, 3}, {0, 2}});
}

DTENSOR_TEST_F(StridedShardGloo, Mesh2DRedistributionMatchesTheSingleDeviceTensor) {
  check_strided_redistribution(*this, mesh_shape_2d(), {{StridedShard(0, 2), Shard{0}}},
                               {{Shard{0}, Shard{0}}, {Replicate{}, Shard{0}}, {Replicate{}, Replicate{}}},
                               {{8, 4}, {7, 5}});
}

DTENSOR_TEST_F(StridedShardThreads, Mesh3DRedistributionMatchesTheSingleDeviceTensor) {
  // HSDP x TP shapes, and two strided mesh dims (on 4 ranks (2, 1, 2) and (1, 2, 2)).
  const int64_t n = ranks();
  check_strided_redistribution(*this, {n / 2, 1, 2}, {{Replicate{}, StridedShard(0, 2), Shard{0}}},
                               {{Replicate{}, Shard{0}, Shard{0}}, {Shard{0}, Replicate{}, Shard{0}},
                                {Replicate{}, Replicate{}, Replicate{}}},
                               {{8, 2}, {5, 3}, {1, 2}});
  check_strided_redistribution(*this, {1, n / 2, 2},
                               {{Replicate{}, StridedShard(0, 2), Shard{0}},
                                {StridedShard(0, n), StridedShard(0, 2), Shard{0}},
                                {Shard{1}, StridedShard(0, 2), Shard{0}}},
                               {{Replicate{}, Shard{0}, Shard{0}}, {Shard{0}, Shard{0}, Shard{0}},
                                {Replicate{}, Replicate{}, Shard{1}}, {Replicate{}, Replicate{}, Replicate{}}},
                               {{8, 2}, {7, 3}, {3, 2}});
}

DTENSOR_TEST_F(StridedShardThreads, PartialAndStridedMeshDims) {
  auto mesh = init_device_mesh(device_type(), mesh_shape_2d());
  const at::Tensor g = global_input({7, 3});
  const Placements strided = {StridedShard(0, 2), Shard{0}};
  // (Partial(sum), Shard(0)): the dp rank 0 holds the tp piece, dp rank 1 zeros.
  const Placements partial = {Partial{}, Shard{0}};
  at::Tensor piece = box_of(g, mesh, {Replicate{}, Shard{0}});
  if (mesh.get_local_rank(0) != 0) piece = at::zeros_like(piece);
  at::Tensor p = from_local(piece, mesh, partial, FromLocalOptions::contiguous({7, 3}));
  at::Tensor s = redistribute(p, mesh, strided);
  EXPECT_TRUE(at::equal(local_tensor(s), box_of(g, mesh, strided)));
  // And back to a Partial through the engine's own transitions.
  at::Tensor q = detail::redistribute_to_any(s, partial);
  EXPECT_EQ(get_spec(q).placements, partial);
  EXPECT_TRUE(at::allclose(full_tensor(q), g));
}

// NOTE: [Ops on strided shards]: what an optimizer step does to an FSDP x TP parameter.
DTENSOR_TEST_F(StridedShardThreads, OpsKeepTheLayoutWithoutCommunication) {
  testing::CommCounter counting;
  auto mesh = init_device_mesh(device_type(), mesh_shape_2d(), {}, group_ptr());
  const Placements strided = {StridedShard(0, 2), Shard{0}};
  for (const Shape& shape : {Shape{8, 4}, Shape{7, 3}}) {
    SCOPED_TRACE(c10::str(c10::IntArrayRef(shape)));
    const at::Tensor g = global_input(shape), h = global_input(shape) * 0.5 + 1;
    at::Tensor x = distribute_tensor(g, mesh, strided);
    at::Tensor y = distribute_tensor(h, mesh, strided);
    counting.reset();
    at::Tensor z = x * 2 + y;
    at::Tensor m = at::zeros_like(x);
    m.mul_(0.9).add_(y, 0.1);
    at::Tensor v = at::zeros_like(x);
    v.mul_(0.999).addcmul_(y, y, 0.001);
    at::Tensor w = x.clone();
    w.addcdiv_(m, v.sqrt().add_(1e-8), -0.01);
    at::Tensor total = (x * y).sum();
    EXPECT_EQ(counting.collectives(), 0) << "the strided layout was redistributed";
    for (const at::Tensor& t : {z, m, v, w}) EXPECT_EQ(get_spec(t).placements, strided);
    EXPECT_TRUE(at::allclose(full_tensor(z), g * 2 + h));
    const at::Tensor m_ref = at::zeros_like(g).mul_(0.9).add_(h, 0.1);
    const at::Tensor v_ref = at::zeros_like(g).mul_(0.999).addcmul_(h, h, 0.001);
    EXPECT_TRUE(at::allclose(full_tensor(w), g.clone().addcdiv_(m_ref, v_ref.sqrt().add_(1e-8), -0.01)));
    EXPECT_TRUE(at::allclose(full_tensor(total), (g * h).sum()));
    // A strided tensor with a plainly sharded one: redistributed (counted), still right.
    at::Tensor plain = distribute_tensor(h, mesh, {Shard{0}, Shard{0}});
    counting.reset();
    at::Tensor mixed = x + plain;
    EXPECT_GT(counting.collectives(), 0);
    EXPECT_TRUE(at::allclose(full_tensor(mixed), g + h));
  }
}

DTENSOR_TEST_F(StridedShardThreads, BadTargetsAndSpecsFailOnEveryRank) {
  auto mesh = init_device_mesh(device_type(), mesh_shape_2d());
  at::Tensor x = distribute_tensor(global_input({8, 4}), mesh, {StridedShard(0, 2), Shard{0}});
  EXPECT_PRED2(contains, error_of([&] { redistribute(x, mesh, {StridedShard(0, 3), Shard{0}}); }),
               "split_factor(3) == aggregate mesh size (2)");
  EXPECT_PRED2(contains, error_of([&] { distribute_tensor(global_input({8, 4}), mesh, {StridedShard(0, 2), Replicate{}}); }),
               "needs a later Shard(dim=0) mesh dim");
  EXPECT_PRED2(contains, error_of([&] {
                 DTensorSpec(mesh, {Shard{0}, StridedShard(1, 2)}, TensorMeta{{8, 4}, {4, 1}, at::kFloat});
               }),
               "DTensorSpec(mesh=");
  // The DTensor prints its placements as PyTorch does.
  EXPECT_PRED2(contains, to_string(x), "placements=(_StridedShard(dim=0, sf=2), Shard(dim=0))");
}

}  // namespace
}  // namespace dtensor
