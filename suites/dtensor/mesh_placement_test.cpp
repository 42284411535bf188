// DeviceMesh (construction, coordinates, per-dim groups, slicing, printing, errors),
// placements, DTensorSpec, and the local shape / offset math. Mesh tests run as 4 threads
// (ThreadGroup); one runs as 4 Gloo processes to check the per-dim groups over c10d.
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/mesh_collectives.h"
#include "dtensor/placement/placement.h"
#include "harness/harness.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>

#include <functional>
#include <sstream>
#include <unordered_map>

namespace dtensor {
namespace {

using comm::ReduceOp;
using Shape = std::vector<int64_t>;

using testing::error_of;
using testing::contains;
struct ErrorCase {
  std::string what;
  std::function<void()> call;
  std::string expected;  // substring of the message
};

void expect_errors(const std::vector<ErrorCase>& cases) {
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    EXPECT_PRED2(contains, error_of(c.call), c.expected);
  }
}

at::Tensor ranks(std::vector<int64_t> values, Shape shape) {
  return at::tensor(values, at::kLong).reshape(shape);
}

// Sum of the world ranks in this rank's group of `dim`, by an all_reduce over that group.
int64_t reduce_world_rank_over(const DeviceMesh& mesh, int64_t dim) {
  at::Tensor x = at::full({1}, mesh.get_rank(), at::kLong);
  mesh.get_group(dim)->all_reduce(x);
  return x.item<int64_t>();
}

class DeviceMeshThreaded : public testing::MultiThreadedTest {
 protected:
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(60); }
};
class DeviceMeshGloo : public testing::MultiProcessTest {
 protected:
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(120); }
};
class DTensorSpecThreaded : public DeviceMeshThreaded {};
class ShardMathThreaded : public DeviceMeshThreaded {};

// ---- DeviceMesh -------------------------------------------------------------------------

DTENSOR_TEST_F(DeviceMeshThreaded, CoordinatesLocalRanksAndDimGroups) {
  ASSERT_EQ(group().size(), 4);
  struct Case {
    std::string name;
    at::Tensor mesh;
    std::vector<Shape> coordinate;        // per world rank
    std::vector<Shape> dim_group_sum;     // per world rank, per mesh dim
  };
  const std::vector<Case> cases = {
      {"1d", ranks({0, 1, 2, 3}, {4}), {{0}, {1}, {2}, {3}}, {{6}, {6}, {6}, {6}}},
      {"1d_reversed", ranks({3, 2, 1, 0}, {4}), {{3}, {2}, {1}, {0}}, {{6}, {6}, {6}, {6}}},
      {"2x2", ranks({0, 1, 2, 3}, {2, 2}),
       {{0, 0}, {0, 1}, {1, 0}, {1, 1}},
       {{2, 1}, {4, 1}, {2, 5}, {4, 5}}},
      // Not in rank order: group ranks must still follow the mesh coordinate.
      {"2x2_permuted", ranks({2, 0, 3, 1}, {2, 2}),
       {{0, 1}, {1, 1}, {0, 0}, {1, 0}},
       {{1, 2}, {1, 4}, {5, 2}, {5, 4}}},
      {"4x1", ranks({0, 1, 2, 3}, {4, 1}),
       {{0, 0}, {1, 0}, {2, 0}, {3, 0}},
       {{6, 0}, {6, 1}, {6, 2}, {6, 3}}},
      {"1x2x2", ranks({0, 1, 2, 3}, {1, 2, 2}),
       {{0, 0, 0}, {0, 0, 1}, {0, 1, 0}, {0, 1, 1}},
       {{0, 2, 1}, {1, 4, 1}, {2, 2, 5}, {3, 4, 5}}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    DeviceMesh mesh("cpu", c.mesh);
    EXPECT_EQ(mesh.device_type(), "cpu");
    EXPECT_TRUE(at::equal(mesh.mesh(), c.mesh));
    EXPECT_EQ(mesh.ndim(), c.mesh.dim());
    EXPECT_EQ(mesh.size(), 4);
    EXPECT_EQ(mesh.shape(), c.mesh.sizes().vec());
    EXPECT_EQ(mesh.get_rank(), rank());
    EXPECT_TRUE(mesh.mesh_dim_names().empty());
    EXPECT_FALSE(mesh.get_parent_mesh().has_value());
    ASSERT_TRUE(mesh.get_coordinate().has_value());
    EXPECT_EQ(*mesh.get_coordinate(), c.coordinate[rank()]);
    ASSERT_EQ(mesh.get_all_groups().size(), static_cast<size_t>(mesh.ndim()));
    for (int64_t d = 0; d < mesh.ndim(); ++d) {
      SCOPED_TRACE("dim " + std::to_string(d));
      EXPECT_EQ(mesh.size(d), c.mesh.size(d));
      EXPECT_EQ(mesh.get_local_rank(d), c.coordinate[rank()][d]);
      comm::GroupPtr g = mesh.get_group(d);
      EXPECT_EQ(g, mesh.get_all_groups()[d]);
      EXPECT_EQ(g->size(), mesh.size(d));
      EXPECT_EQ(g->rank(), mesh.get_local_rank(d));
      EXPECT_EQ(reduce_world_rank_over(mesh, d), c.dim_group_sum[rank()][d]);
    }
    EXPECT_EQ(mesh.size(-1), c.mesh.size(-1));
    EXPECT_EQ(mesh.get_group(-1), mesh.get_group(mesh.ndim() - 1));
  }
}

DTENSOR_TEST_F(DeviceMeshThreaded, NamedDimsLookUpLikeIndices) {
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  EXPECT_EQ(mesh, DeviceMesh("cpu", ranks({0, 1, 2, 3}, {2, 2}), {"dp", "tp"}));
  EXPECT_EQ(mesh.mesh_dim_names(), (std::vector<std::string>{"dp", "tp"}));
  EXPECT_EQ(mesh.get_mesh_dim("dp"), 0);
  EXPECT_EQ(mesh.get_mesh_dim("tp"), 1);
  EXPECT_EQ(mesh.get_local_rank("dp"), rank() / 2);
  EXPECT_EQ(mesh.get_local_rank("tp"), rank() % 2);
  EXPECT_EQ(mesh.get_group("dp"), mesh.get_group(0));
  EXPECT_EQ(mesh.get_group("tp"), mesh.get_group(1));
  EXPECT_EQ(mesh.get_group("tp")->global_ranks(),
            (std::vector<int>{rank() / 2 * 2, rank() / 2 * 2 + 1}));
}

DTENSOR_TEST_F(DeviceMeshThreaded, SlicesByNamesReuseParentGroups) {
  const int r = rank();
  struct Case {
    std::string name;
    DeviceMesh parent;
    std::vector<std::string> names;
    at::Tensor expected_ranks;  // for this rank
  };
  DeviceMesh m2 = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  DeviceMesh m3 = init_device_mesh("cpu", {2, 1, 2}, {"pp", "dp", "tp"});
  const std::vector<Case> cases = {
      {"2d['tp']", m2, {"tp"}, ranks({r / 2 * 2, r / 2 * 2 + 1}, {2})},
      {"2d['dp']", m2, {"dp"}, ranks({r % 2, r % 2 + 2}, {2})},
      {"3d['pp','tp']", m3, {"pp", "tp"}, ranks({0, 1, 2, 3}, {2, 2})},
      {"3d['dp','tp']", m3, {"dp", "tp"}, ranks({r / 2 * 2, r / 2 * 2 + 1}, {1, 2})},
      {"3d['pp']", m3, {"pp"}, ranks({r % 2, r % 2 + 2}, {2})},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    DeviceMesh sub = c.parent[c.names];
    EXPECT_TRUE(at::equal(sub.mesh(), c.expected_ranks)) << sub;
    EXPECT_EQ(sub.mesh_dim_names(), c.names);
    EXPECT_EQ(sub.get_rank(), r);
    ASSERT_TRUE(sub.get_parent_mesh().has_value());
    EXPECT_EQ(*sub.get_parent_mesh(), c.parent);
    ASSERT_EQ(sub.get_parent_mesh_dims().size(), c.names.size());
    for (size_t i = 0; i < c.names.size(); ++i) {
      const int64_t pd = c.parent.get_mesh_dim(c.names[i]);
      EXPECT_EQ(sub.get_parent_mesh_dims()[i], pd);
      // The same group object: slicing created no new groups (no collectives).
      EXPECT_EQ(sub.get_group(c.names[i]), c.parent.get_group(pd));
      EXPECT_EQ(sub.get_local_rank(static_cast<int64_t>(i)), c.parent.get_local_rank(pd));
    }
  }
  // Brace-list spelling, single-name spelling, slicing a slice, and naming every dim.
  EXPECT_EQ((m3[{"pp", "tp"}]), (m3[std::vector<std::string>{"pp", "tp"}]));
  EXPECT_EQ(m2["tp"], m2[{"tp"}]);
  DeviceMesh pp_tp = m3[{"pp", "tp"}];
  DeviceMesh tp = pp_tp["tp"];
  EXPECT_EQ(tp, m3["tp"]);
  EXPECT_EQ(*tp.get_parent_mesh(), pp_tp);
  EXPECT_EQ(tp.get_group(0), m3.get_group("tp"));
  DeviceMesh whole = m2[{"dp", "tp"}];
  EXPECT_EQ(whole, m2);
  EXPECT_EQ(whole.get_group(0), m2.get_group(0));
  EXPECT_FALSE(whole.get_parent_mesh().has_value());
}

DTENSOR_TEST_F(DeviceMeshThreaded, PrintsInPyTorchNotation) {
  DeviceMesh named = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const std::string row = rank() < 2 ? "[0, 1]" : "[2, 3]";
  struct Case {
    DeviceMesh mesh;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {named, "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))"},
      {init_device_mesh("cpu", {4}), "DeviceMesh('cpu', [0, 1, 2, 3])"},
      {init_device_mesh("cuda", {4}, {"tp"}),
       "DeviceMesh('cuda', [0, 1, 2, 3], mesh_dim_names=('tp',))"},
      {DeviceMesh("cpu", ranks({3, 1, 0, 2}, {1, 2, 2})), "DeviceMesh('cpu', [[[3, 1], [0, 2]]])"},
      {named["tp"], "DeviceMesh('cpu', " + row + ", mesh_dim_names=('tp',))"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.expected);
    EXPECT_EQ(c.mesh.to_string(), c.expected);
    std::ostringstream os;
    os << c.mesh;
    EXPECT_EQ(os.str(), c.expected);
  }
}

DTENSOR_TEST_F(DeviceMeshThreaded, EqualityAndHashCompareTypeRanksAndNames) {
  DeviceMesh a = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  DeviceMesh same = DeviceMesh("cpu", ranks({0, 1, 2, 3}, {2, 2}), {"dp", "tp"});
  EXPECT_EQ(a, a);
  EXPECT_EQ(a, same);
  EXPECT_EQ(hash_value(a), hash_value(same));
  EXPECT_EQ(std::hash<DeviceMesh>{}(a), hash_value(same));
  struct Case {
    std::string what;
    DeviceMesh other;
  };
  const std::vector<Case> differ = {
      {"device type", init_device_mesh("cuda", {2, 2}, {"dp", "tp"})},
      {"ranks", DeviceMesh("cpu", ranks({0, 2, 1, 3}, {2, 2}), {"dp", "tp"})},
      {"shape", init_device_mesh("cpu", {4, 1}, {"dp", "tp"})},
      {"names", init_device_mesh("cpu", {2, 2}, {"x", "tp"})},
      {"no names", init_device_mesh("cpu", {2, 2})},
  };
  for (const auto& c : differ) {
    SCOPED_TRACE(c.what);
    EXPECT_NE(a, c.other);
    EXPECT_NE(hash_value(a), hash_value(c.other));
  }
}

DTENSOR_TEST_F(DeviceMeshThreaded, ConstructionErrorsNameTheMeshAndTheFix) {
  // Every rank passes the same bad arguments and throws before any collective.
  expect_errors({
      {"larger than the world", [] { DeviceMesh("cpu", at::arange(5)); },
       "DeviceMesh('cpu', [0, 1, 2, 3, 4]): the mesh has 5 ranks, more than the world (4"},
      {"init_device_mesh size", [] { init_device_mesh("cpu", {5}); },
       "init_device_mesh('cpu', mesh_shape=(5,)): the mesh size (5) is larger than the world "
       "size (4"},
      {"init_device_mesh zero dim", [] { init_device_mesh("cpu", {4, 0}); },
       "every dim of mesh_shape needs at least one rank"},
      {"duplicate rank", [] { DeviceMesh("cpu", ranks({0, 1, 1, 3}, {2, 2})); },
       "DeviceMesh('cpu', [[0, 1], [1, 3]]): rank 1 appears more than once"},
      {"rank too large", [] { DeviceMesh("cpu", ranks({0, 1, 2, 7}, {4})); },
       "rank 7 is out of range for a world of size 4 (valid ranks: 0..3)"},
      {"negative rank", [] { DeviceMesh("cpu", ranks({0, -1, 2, 3}, {4})); },
       "rank -1 is out of range"},
      {"name count", [] { DeviceMesh("cpu", ranks({0, 1, 2, 3}, {2, 2}), {"dp"}); },
       "got 1 mesh_dim_names ('dp',) for a 2-D mesh; pass one name per mesh dim, or none"},
      {"duplicate names", [] { init_device_mesh("cpu", {2, 2}, {"dp", "dp"}); },
       "mesh_dim_names has 'dp' more than once"},
      {"float ranks", [] { DeviceMesh("cpu", at::arange(4, at::kFloat)); },
       "the rank tensor must hold integer ranks"},
      {"0-d ranks", [] { DeviceMesh("cpu", at::scalar_tensor(0, at::kLong)); },
       "the rank tensor needs at least one dim"},
      {"device type", [] { init_device_mesh("tpu", {4}); },
       "device_type 'tpu' is not supported; use \"cpu\" or \"cuda\""},
  });
  // The world is still usable.
  EXPECT_EQ(reduce_world_rank_over(init_device_mesh("cpu", {4}), 0), 6);
}

DTENSOR_TEST_F(DeviceMeshThreaded, LookupAndSliceErrorsNameTheMesh) {
  DeviceMesh m = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  DeviceMesh unnamed = init_device_mesh("cpu", {2, 2});
  const std::string repr = "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))";
  expect_errors({
      {"unknown name: get_group", [&] { m.get_group("pp"); },
       repr + " has no dim named 'pp'; its dims are ('dp', 'tp')"},
      {"unknown name: get_local_rank", [&] { m.get_local_rank("pp"); }, "has no dim named 'pp'"},
      {"unknown name: slice", [&] { m["pp"]; }, "has no dim named 'pp'"},
      {"no names", [&] { unnamed.get_group("dp"); },
       "DeviceMesh('cpu', [[0, 1], [2, 3]]) has no dim names"},
      {"dim too large: size", [&] { m.size(2); },
       "size(2) on " + repr + ": dim 2 is out of range for a 2-D mesh (valid: 0..1, or -2..-1)"},
      {"dim too small: get_local_rank", [&] { m.get_local_rank(-3); },
       "get_local_rank(-3) on " + repr + ": dim -3 is out of range"},
      {"dim too large: get_group", [&] { m.get_group(2); }, "get_group(2) on"},
      {"slice out of order", [&] { m[{"tp", "dp"}]; },
       "slicing " + repr + " by ('tp', 'dp'): names must follow the mesh's dim order ('dp', 'tp')"},
      {"slice repeats a name", [&] { m[{"dp", "dp"}]; }, "'dp' is named more than once"},
      {"slice with no names", [&] { m[std::vector<std::string>{}]; }, "no dim names given"},
  });
}

DTENSOR_TEST_F(DeviceMeshThreaded, DifferentMeshesOnRanksFailOnEveryRank) {
  const std::vector<std::string> names =
      rank() == 1 ? std::vector<std::string>{"x", "y"} : std::vector<std::string>{"dp", "tp"};
  EXPECT_PRED2(contains, error_of([&] { init_device_mesh("cpu", {2, 2}, names); }),
               "the ranks passed different meshes to the DeviceMesh constructor");
  // The world is still usable, and agreeing ranks build the mesh.
  EXPECT_EQ(reduce_world_rank_over(init_device_mesh("cpu", {2, 2}, {"dp", "tp"}), 1),
            rank() < 2 ? 1 : 5);
}

// ---- DeviceMesh over a subset of the world, get_local_rank() / get_group() without a dim,
// _flatten, mesh_broadcast / mesh_scatter (PyTorch test_device_mesh.py) ---------------------

DTENSOR_TEST_F(DeviceMeshThreaded, SubsetMeshRanksOutsideHoldNothing) {
  const int r = rank();
  // PyTorch: DeviceMesh(device_type, [0, 2]) on 4 ranks (test_dtensor.py *_sub_mesh).
  DeviceMesh mesh("cpu", ranks({0, 2}, {2}));
  EXPECT_EQ(mesh.size(), 2);
  EXPECT_EQ(mesh.get_rank(), r);
  if (r % 2 == 0) {
    ASSERT_TRUE(mesh.get_coordinate().has_value());
    EXPECT_EQ(*mesh.get_coordinate(), Shape{r / 2});
    EXPECT_EQ(mesh.get_local_rank(), r / 2);
    EXPECT_EQ(mesh.get_group()->size(), 2);
    EXPECT_EQ(reduce_world_rank_over(mesh, 0), 2);  // 0 + 2
  } else {
    EXPECT_FALSE(mesh.get_coordinate().has_value());
    EXPECT_EQ(mesh.get_all_groups(), std::vector<comm::GroupPtr>{nullptr});
    EXPECT_PRED2(contains, error_of([&] { mesh.get_group(0); }),
                 "get_group: rank " + std::to_string(r) + " is not in DeviceMesh('cpu', [0, 2])");
    EXPECT_PRED2(contains, error_of([&] { mesh.get_local_rank(); }), "is not in DeviceMesh('cpu', [0, 2])");
  }
  // A 2-D subset in another order, and init_device_mesh over the first ranks.
  DeviceMesh m2("cpu", ranks({3, 1}, {2, 1}), {"dp", "tp"});
  if (r == 3 || r == 1) {
    EXPECT_EQ(*m2.get_coordinate(), (Shape{r == 3 ? 0 : 1, 0}));
    EXPECT_EQ(reduce_world_rank_over(m2, 0), 4);
    EXPECT_EQ(reduce_world_rank_over(m2, 1), r);
    EXPECT_TRUE(at::equal(m2["dp"].mesh(), ranks({3, 1}, {2})));
  } else {
    EXPECT_FALSE(m2.get_coordinate().has_value());
    EXPECT_PRED2(contains, error_of([&] { m2["dp"]; }), "is not in the mesh, so it has no slice");
  }
  DeviceMesh first3 = init_device_mesh("cpu", {3});
  EXPECT_EQ(first3.get_coordinate().has_value(), r < 3);
  if (r < 3) EXPECT_EQ(reduce_world_rank_over(first3, 0), 3);
  // The world is still usable.
  EXPECT_EQ(reduce_world_rank_over(init_device_mesh("cpu", {4}), 0), 6);
}

DTENSOR_TEST_F(DeviceMeshThreaded, LocalRankAndGroupWithoutADimOnlyOnA1DMesh) {
  DeviceMesh m1 = init_device_mesh("cpu", {4});
  EXPECT_EQ(m1.get_local_rank(), rank());
  EXPECT_EQ(m1.get_group(), m1.get_group(0));
  DeviceMesh m2 = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  EXPECT_EQ(m2["tp"].get_local_rank(), rank() % 2);
  EXPECT_PRED2(contains, error_of([&] { m2.get_local_rank(); }),
               "get_local_rank() on DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp')): the mesh has "
               "2 dims; pass the mesh dim");
  EXPECT_PRED2(contains, error_of([&] { m2.get_group(); }), "the mesh has 2 dims; pass the mesh dim");
}

// test_device_mesh.py TestDeviceMeshGetItem test_flatten_mesh_1d/_3d (world 8 there, 4 here:
// mesh (1, 2, 2) and (2, 1, 2)).
DTENSOR_TEST_F(DeviceMeshThreaded, FlattenMakesA1DMeshTheRootKnows) {
  const int r = rank();
  DeviceMesh m3 = init_device_mesh("cpu", {1, 2, 2}, {"dp", "cp", "tp"});
  // dp x cp: the ranks that share tp: [0, 2] and [1, 3].
  DeviceMesh dp_cp = m3[{"dp", "cp"}]._flatten();
  EXPECT_TRUE(at::equal(dp_cp.mesh(), ranks({r % 2, r % 2 + 2}, {2}))) << dp_cp;
  EXPECT_EQ(dp_cp.mesh_dim_names(), std::vector<std::string>{"dp_cp"});
  EXPECT_EQ(*dp_cp.get_coordinate(), Shape{r / 2});
  EXPECT_EQ(reduce_world_rank_over(dp_cp, 0), r % 2 == 0 ? 2 : 4);
  EXPECT_EQ(*dp_cp.get_parent_mesh(), m3);
  EXPECT_EQ(dp_cp.get_root_mesh(), m3);
  // The root finds it by name: slicing, get_group, get_local_rank; no new group.
  EXPECT_EQ(m3["dp_cp"], dp_cp);
  EXPECT_EQ(m3["dp_cp"].get_group(), dp_cp.get_group());
  EXPECT_EQ(m3.get_group("dp_cp"), dp_cp.get_group());
  EXPECT_EQ(m3.get_local_rank("dp_cp"), r / 2);
  EXPECT_EQ(m3["tp"].get_group("dp_cp"), dp_cp.get_group());  // through the root of a slice
  // Flattening again with the same dims and name: the registered mesh, same group.
  EXPECT_EQ((m3[{"dp", "cp"}]._flatten().get_group()), dp_cp.get_group());
  EXPECT_EQ((m3[{"dp", "cp"}].flatten("dp_cp").get_group()), dp_cp.get_group());
  // A flattened dim slices together with the other dims (at its last dim's position).
  DeviceMesh two_d = m3[{"dp_cp", "tp"}];
  EXPECT_TRUE(at::equal(two_d.mesh(), ranks({0, 1, 2, 3}, {2, 2}))) << two_d;
  EXPECT_EQ(*two_d.get_coordinate(), (Shape{r / 2, r % 2}));
  EXPECT_EQ(two_d.get_group(0), dp_cp.get_group());
  EXPECT_EQ(two_d.get_group(1), m3.get_group("tp"));
  EXPECT_EQ(two_d.get_parent_mesh_dims(), (std::vector<int64_t>{-1, 2}));
  // The whole mesh, named: every rank in one group.
  DeviceMesh all = m3._flatten("world");
  EXPECT_TRUE(at::equal(all.mesh(), at::arange(4)));
  EXPECT_EQ(reduce_world_rank_over(all, 0), 6);
  // A 1-D mesh flattened under its own name is itself; under another name, a new mesh.
  DeviceMesh tp = m3["tp"];
  EXPECT_EQ(tp._flatten(), tp);
  EXPECT_EQ(tp._flatten("tp2").mesh_dim_names(), std::vector<std::string>{"tp2"});
  EXPECT_TRUE(at::equal(tp._flatten("tp2").mesh(), tp.mesh()));
  // Non-adjacent dims (dp, tp of a (2, 1, 2) mesh): row-major over those dims.
  DeviceMesh m3b = init_device_mesh("cpu", {2, 1, 2}, {"dp", "cp", "tp"});
  DeviceMesh dp_tp = m3b[{"dp", "tp"}]._flatten();
  EXPECT_TRUE(at::equal(dp_tp.mesh(), at::arange(4)));
  EXPECT_EQ(dp_tp.get_local_rank(), r);
  EXPECT_EQ((m3b[{"cp", "dp_tp"}].shape()), (Shape{1, 4}));
  // Errors: every rank raises alike, before any collective.
  DeviceMesh unnamed = init_device_mesh("cpu", {2, 2});
  expect_errors({
      {"no names", [&] { unnamed._flatten(); }, "Cannot flatten a DeviceMesh without mesh_dim_names"},
      {"a name of the root", [&] { m3[{"dp", "cp"}]._flatten("tp"); },
       "'tp' already exists as a dim of the root mesh"},
      {"a name taken by other dims", [&] { m3[{"cp", "tp"}]._flatten("dp_cp"); },
       "a flattened mesh named 'dp_cp' was created before from other dims"},
      {"overlapping slice", [&] { m3[{"cp", "dp_cp"}]; }, "overlaps another flattened dim"},
      {"flattened dim out of order", [&] { m3[{"dp_cp", "dp"}]; }, "is named more than once"},
  });
  // Ranks that disagree all raise; the world stays usable.
  EXPECT_PRED2(contains, error_of([&] { m3[{"cp", "tp"}]._flatten(r == 1 ? "x" : "y"); }),
               "the ranks flattened different dims or names");
  EXPECT_EQ(reduce_world_rank_over(m3[{"cp", "tp"}]._flatten("cp_tp"), 0), 6);
}

// test_device_mesh.py TestDeviceMeshCollectives (world 8 and mesh (2, 2, 2) there; 4 here).
DTENSOR_TEST_F(DeviceMeshThreaded, MeshBroadcastAndScatterAlongEachDim) {
  const int r = rank();
  DeviceMesh m1 = init_device_mesh("cpu", {4});
  at::Tensor t = at::ones({3, 3}) * r;
  mesh_broadcast(t, m1, 0);
  EXPECT_TRUE(at::equal(t, at::zeros({3, 3})));  // test_broadcast_1d
  // test_scatter_1d: every scatter dim of a [3, 3, 3] tensor grown 4x along it.
  for (int64_t dim = 0; dim < 3; ++dim) {
    std::vector<int64_t> shape = {3, 3, 3};
    shape[dim] *= 4;
    at::Tensor global = at::arange(shape[0] * shape[1] * shape[2], at::kFloat).reshape(shape);
    std::vector<at::Tensor> pieces;
    for (auto& p : global.tensor_split(4, dim)) pieces.push_back(p.contiguous());
    at::Tensor recv = at::empty_like(pieces[r]);
    mesh_scatter(recv, r == 0 ? pieces : std::vector<at::Tensor>{}, m1, 0);
    EXPECT_TRUE(at::equal(recv, pieces[r])) << "scatter dim " << dim;
  }
  // test_broadcast_nd / test_scatter_nd on a 2x2 mesh: each dim's groups, from their first
  // rank (and from group_src 1).
  DeviceMesh m2 = init_device_mesh("cpu", {2, 2});
  for (int64_t dim = 0; dim < 2; ++dim) {
    at::Tensor slice = m2.mesh().swapdims(-1, dim).reshape({-1, 2});
    std::vector<int64_t> mine;
    for (int64_t row = 0; row < 2; ++row)
      if (slice[row][0].item<int64_t>() == r || slice[row][1].item<int64_t>() == r)
        mine = {slice[row][0].item<int64_t>(), slice[row][1].item<int64_t>()};
    for (int src : {0, 1}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + " src " + std::to_string(src));
      at::Tensor b = at::ones({3, 3}) * r;
      mesh_broadcast(b, m2, dim, src);
      EXPECT_TRUE(at::equal(b, at::ones({3, 3}) * mine[src]));
      std::vector<at::Tensor> list = {at::ones({3, 3}) * (r * 10), at::ones({3, 3}) * (r * 10 + 1)};
      at::Tensor out = at::empty({3, 3});
      mesh_scatter(out, list, m2, dim, src);
      const int64_t my_pos = mine[0] == r ? 0 : 1;
      EXPECT_TRUE(at::equal(out, at::ones({3, 3}) * (mine[src] * 10 + my_pos)));
    }
  }
  // Meta tensors are left alone (no collective: ranks need not match).
  at::Tensor meta = at::empty({2}, at::TensorOptions().device(at::kMeta));
  if (r == 0) mesh_broadcast(meta, m1);
  // Errors.
  DeviceMesh sub("cpu", ranks({0, 1}, {2}));
  if (r >= 2) {
    at::Tensor x = at::ones({1});
    EXPECT_PRED2(contains, error_of([&] { mesh_broadcast(x, sub); }),
                 "mesh_broadcast: rank " + std::to_string(r) + " is not in DeviceMesh('cpu', [0, 1])");
  }
  at::Tensor y = at::ones({1});
  EXPECT_PRED2(contains, error_of([&] { mesh_scatter(y, {}, m1, 0, 4); }),
               "mesh_scatter: group_src 4 is not a rank of mesh dim 0");
  // mesh_all_gather_object: every rank of the mesh, in row-major mesh order.
  DeviceMesh perm("cpu", ranks({2, 0, 3, 1}, {2, 2}));
  EXPECT_EQ(mesh_all_gather_object(perm, r * 100), (std::vector<int>{200, 0, 300, 100}));
  if (r == 1 || r == 3) {
    DeviceMesh odd("cpu", ranks({3, 1}, {2}));
    EXPECT_EQ(mesh_all_gather_object(odd, std::string(1, static_cast<char>('a' + r))),
              (std::vector<std::string>{"d", "b"}));
  } else {
    DeviceMesh odd("cpu", ranks({3, 1}, {2}));  // collective over the world: every rank builds it
    (void)odd;
  }
}

DTENSOR_TEST_F(DeviceMeshGloo, TwoByTwoNamedMeshGroupsReduceOverEachDim) {
  ASSERT_EQ(group().backend(), "gloo");
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  EXPECT_EQ(*mesh.get_coordinate(), (Shape{rank() / 2, rank() % 2}));
  // dp groups are columns {0, 2} and {1, 3}; tp groups are rows {0, 1} and {2, 3}.
  EXPECT_EQ(reduce_world_rank_over(mesh, mesh.get_mesh_dim("dp")), rank() % 2 == 0 ? 2 : 4);
  EXPECT_EQ(reduce_world_rank_over(mesh, mesh.get_mesh_dim("tp")), rank() < 2 ? 1 : 5);
  EXPECT_EQ(mesh.get_group("dp")->rank(), mesh.get_local_rank("dp"));
  DeviceMesh tp = mesh["tp"];
  EXPECT_EQ(tp.get_group(0), mesh.get_group("tp"));
  EXPECT_EQ(reduce_world_rank_over(tp, 0), rank() < 2 ? 1 : 5);
  // Over c10d: a subset mesh, a flattened dim, mesh_broadcast and mesh_scatter.
  DeviceMesh odd("cpu", ranks({1, 3}, {2}));
  if (rank() % 2 == 1) EXPECT_EQ(reduce_world_rank_over(odd, 0), 4);
  else EXPECT_FALSE(odd.get_coordinate().has_value());
  DeviceMesh flat = mesh._flatten();
  EXPECT_EQ(reduce_world_rank_over(flat, 0), 6);
  at::Tensor b = at::ones({2}) * rank();
  mesh_broadcast(b, mesh, 0, 1);  // dp groups {0, 2}, {1, 3}: from 2 or 3
  EXPECT_TRUE(at::equal(b, at::ones({2}) * (rank() % 2 + 2)));
  at::Tensor out = at::empty({2});
  std::vector<at::Tensor> pieces;
  for (int i = 0; i < 4; ++i) pieces.push_back(at::ones({2}) * (i + 10));
  mesh_scatter(out, pieces, flat, 0);
  EXPECT_TRUE(at::equal(out, at::ones({2}) * (rank() + 10)));
}

// ---- Placements -------------------------------------------------------------------------

TEST(Placement, PrintsInPyTorchNotation) {
  struct Case {
    Placement p;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {Shard{0}, "Shard(dim=0)"},          {Shard{-1}, "Shard(dim=-1)"},
      {Replicate{}, "Replicate()"},        {Partial{}, "Partial(sum)"},
      {Partial{ReduceOp::AVG}, "Partial(avg)"}, {Partial{ReduceOp::MIN}, "Partial(min)"},
      {Partial{ReduceOp::MAX}, "Partial(max)"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.expected);
    EXPECT_EQ(to_string(c.p), c.expected);
    std::ostringstream os;
    os << c.p;
    EXPECT_EQ(os.str(), c.expected);
  }
  EXPECT_EQ(to_string(std::vector<Placement>{Shard{0}, Replicate{}}), "(Shard(dim=0), Replicate())");
  EXPECT_EQ(to_string(std::vector<Placement>{Partial{}}), "(Partial(sum),)");
  EXPECT_EQ(to_string(std::vector<Placement>{}), "()");
}

TEST(Placement, PredicatesAndEquality) {
  const std::vector<Placement> all = {Shard{0},  Shard{1}, Replicate{}, Partial{},
                                      Partial{ReduceOp::MAX}};
  for (size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(to_string(all[i]));
    EXPECT_EQ(is_shard(all[i]), i < 2);
    EXPECT_EQ(is_shard(all[i], 1), i == 1);
    EXPECT_EQ(is_replicate(all[i]), i == 2);
    EXPECT_EQ(is_partial(all[i]), i > 2);
    for (size_t j = 0; j < all.size(); ++j) {
      EXPECT_EQ(all[i] == all[j], i == j) << to_string(all[j]);
      EXPECT_EQ(hash_value(all[i]) == hash_value(all[j]), i == j) << to_string(all[j]);
    }
  }
}

TEST(Placement, PartialRejectsProduct) {
  EXPECT_PRED2(contains, error_of([] { Partial{ReduceOp::PRODUCT}; }),
               "Partial(product) is not supported");
}

TEST(Placement, NormalizesShardDims) {
  struct Case {
    int64_t dim, ndim, expected;
  };
  for (Case c : {Case{0, 2, 0}, Case{1, 2, 1}, Case{-1, 2, 1}, Case{-2, 2, 0}, Case{-1, 1, 0}}) {
    SCOPED_TRACE("dim " + std::to_string(c.dim) + ", ndim " + std::to_string(c.ndim));
    EXPECT_EQ(normalize_shard_dim(c.dim, c.ndim), c.expected);
  }
  expect_errors({
      {"too large", [] { normalize_shard_dim(2, 2); },
       "Shard(dim=2) is out of range for a tensor with ndim=2 (valid dims: -2..1)"},
      {"too small", [] { normalize_shard_dim(-3, 2); }, "Shard(dim=-3) is out of range"},
      {"0-d", [] { normalize_shard_dim(0, 0); }, "a 0-d tensor cannot be sharded"},
      {"in a list", [] { normalize_placements({Replicate{}, Shard{3}}, 3); },
       "Shard(dim=3) is out of range for a tensor with ndim=3"},
  });
  EXPECT_EQ(normalize_placements({Shard{-1}, Replicate{}, Shard{0}, Partial{}}, 3),
            (std::vector<Placement>{Shard{2}, Replicate{}, Shard{0}, Partial{}}));
}

// ---- Shard math -------------------------------------------------------------------------

TEST(ShardMath, SizesAndOffsetsFollowTorchChunk) {
  struct Case {
    int64_t n, k;
    Shape sizes;
  };
  for (Case c : {Case{10, 4, {3, 3, 3, 1}}, Case{5, 4, {2, 2, 1, 0}}, Case{2, 4, {1, 1, 0, 0}},
                 Case{8, 4, {2, 2, 2, 2}}, Case{0, 3, {0, 0, 0}}, Case{7, 1, {7}}}) {
    SCOPED_TRACE(std::to_string(c.n) + " rows on " + std::to_string(c.k));
    int64_t expected_offset = 0;
    for (int64_t i = 0; i < c.k; ++i) {
      auto [size, offset] = shard_size_and_offset(c.n, c.k, i);
      EXPECT_EQ(size, c.sizes[i]) << "shard " << i;
      EXPECT_EQ(offset, expected_offset) << "shard " << i;
      expected_offset += size;
    }
  }
  // Against torch.chunk itself (which drops trailing empty chunks).
  for (int64_t n = 0; n <= 12; ++n) {
    for (int64_t k = 1; k <= 5; ++k) {
      SCOPED_TRACE(std::to_string(n) + " rows on " + std::to_string(k));
      std::vector<at::Tensor> chunks = n ? at::arange(n).chunk(k) : std::vector<at::Tensor>{};
      for (int64_t i = 0; i < k; ++i) {
        auto [size, offset] = shard_size_and_offset(n, k, i);
        if (i < static_cast<int64_t>(chunks.size())) {
          EXPECT_EQ(size, chunks[i].numel());
          EXPECT_EQ(offset, chunks[i][0].item<int64_t>());
        } else {
          EXPECT_EQ(size, 0);
          EXPECT_EQ(offset, n);
        }
      }
    }
  }
  expect_errors({
      {"no chunks", [] { shard_size_and_offset(4, 0, 0); }, "num_chunks=0 must be at least 1"},
      {"index", [] { shard_size_and_offset(4, 2, 2); }, "index=2 is out of range for 2 chunks"},
  });
}

TEST(ShardMath, TwoDimMeshLocalShapesAndOffsetsAtEveryCoordinate) {
  struct Case {
    std::string name;
    std::vector<Placement> placements;
    // Per coordinate {0,0}, {0,1}, {1,0}, {1,1}.
    std::vector<Shape> shapes, offsets;
  };
  // A [10, 5] tensor on a 2x2 mesh.
  const std::vector<Case> cases = {
      {"S0,S1", {Shard{0}, Shard{1}},
       {{5, 3}, {5, 2}, {5, 3}, {5, 2}}, {{0, 0}, {0, 3}, {5, 0}, {5, 3}}},
      // Dim 0 split by mesh dim 0 (5, 5), then each half by mesh dim 1 (3, 2).
      {"S0,S0", {Shard{0}, Shard{0}},
       {{3, 5}, {2, 5}, {3, 5}, {2, 5}}, {{0, 0}, {3, 0}, {5, 0}, {8, 0}}},
      {"S-1,S0 (negative dim)", {Shard{-1}, Shard{0}},
       {{5, 3}, {5, 3}, {5, 2}, {5, 2}}, {{0, 0}, {5, 0}, {0, 3}, {5, 3}}},
      {"R,S1", {Replicate{}, Shard{1}},
       {{10, 3}, {10, 2}, {10, 3}, {10, 2}}, {{0, 0}, {0, 3}, {0, 0}, {0, 3}}},
      {"P,R", {Partial{}, Replicate{}},
       {{10, 5}, {10, 5}, {10, 5}, {10, 5}}, {{0, 0}, {0, 0}, {0, 0}, {0, 0}}},
      // 5 columns split 2 ways (3, 2), then the 2-wide piece 2 ways (1, 1).
      {"S1,S1", {Shard{1}, Shard{1}},
       {{10, 2}, {10, 1}, {10, 1}, {10, 1}}, {{0, 0}, {0, 2}, {0, 3}, {0, 4}}},
  };
  const std::vector<Shape> coords = {{0, 0}, {0, 1}, {1, 0}, {1, 1}};
  for (const auto& c : cases) {
    for (size_t i = 0; i < coords.size(); ++i) {
      SCOPED_TRACE(c.name + " at {" + std::to_string(coords[i][0]) + ", " +
                   std::to_string(coords[i][1]) + "}");
      auto [shape, offset] =
          compute_local_shape_and_global_offset({10, 5}, {2, 2}, c.placements, coords[i]);
      EXPECT_EQ(shape, c.shapes[i]);
      EXPECT_EQ(offset, c.offsets[i]);
      EXPECT_EQ(compute_local_shape({10, 5}, {2, 2}, c.placements, coords[i]), c.shapes[i]);
    }
  }
}

TEST(ShardMath, RankOutsideTheMeshGetsAnEmptyShard) {
  auto [shape, offset] =
      compute_local_shape_and_global_offset({8, 4}, {2}, {Shard{0}}, std::nullopt);
  EXPECT_EQ(shape, (Shape{0, 0}));
  EXPECT_EQ(offset, (Shape{0, 0}));
}

TEST(ShardMath, RejectsArgumentsThatDoNotFitTheMesh) {
  expect_errors({
      {"placement count", [] { compute_local_shape({8}, {2, 2}, {Shard{0}}, Shape{0, 0}); },
       "1 placements for a 2-D mesh; pass one per mesh dim"},
      {"coordinate length", [] { compute_local_shape({8}, {2}, {Shard{0}}, Shape{0, 0}); },
       "coordinate [0, 0] has 2 entries"},
      {"coordinate range", [] { compute_local_shape({8}, {2}, {Shard{0}}, Shape{2}); },
       "coordinate [2] is outside the mesh"},
      {"shard dim", [] { compute_local_shape({8}, {2}, {Shard{1}}, Shape{0}); },
       "compute_local_shape_and_global_offset(shape=[8], mesh shape [2], "
       "placements=(Shard(dim=1),)): Shard(dim=1) is out of range for a tensor with ndim=1"},
  });
}

DTENSOR_TEST_F(ShardMathThreaded, OneDimMeshUnevenRowsPerRank) {
  DeviceMesh mesh = init_device_mesh("cpu", {4});
  struct Case {
    int64_t rows;
    Shape per_rank;
  };
  for (Case c : {Case{10, {3, 3, 3, 1}}, Case{5, {2, 2, 1, 0}}, Case{2, {1, 1, 0, 0}}}) {
    SCOPED_TRACE(std::to_string(c.rows) + " rows");
    auto [shape, offset] = compute_local_shape_and_global_offset({c.rows, 3}, mesh, {Shard{0}});
    EXPECT_EQ(shape, (Shape{c.per_rank[rank()], 3}));
    EXPECT_EQ(compute_local_shape({c.rows, 3}, mesh, {Shard{0}}), shape);
    // Every rank's rows, gathered, tile the tensor exactly once.
    at::Tensor sizes = at::zeros({4}, at::kLong);
    sizes[rank()] = shape[0];
    mesh.get_group(0)->all_reduce(sizes);
    EXPECT_EQ(offset[0], sizes.narrow(0, 0, rank()).sum().item<int64_t>());
    EXPECT_EQ(sizes.sum().item<int64_t>(), c.rows);
  }
}

DTENSOR_TEST_F(ShardMathThreaded, TwoDimMeshUsesThisRanksCoordinate) {
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const std::vector<Placement> ps = {Shard{0}, Shard{0}};
  EXPECT_EQ(compute_local_shape_and_global_offset({10, 5}, mesh, ps),
            compute_local_shape_and_global_offset({10, 5}, {2, 2}, ps, mesh.get_coordinate()));
  // Slicing keeps this rank's coordinate: a 1-D sub-mesh splits like a 1-D mesh.
  EXPECT_EQ(compute_local_shape({9, 5}, mesh["tp"], {Shard{0}}), (Shape{rank() % 2 ? 4 : 5, 5}));
}

// ---- DTensorSpec ------------------------------------------------------------------------

TensorMeta contiguous_meta(Shape shape, at::ScalarType dtype = at::kFloat) {
  return {shape, at::empty(shape, at::kFloat).strides().vec(), dtype};
}

DTENSOR_TEST_F(DTensorSpecThreaded, DimMapShardCountAndPredicates) {
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  struct Case {
    std::vector<Placement> placements;
    std::vector<std::vector<int64_t>> dim_map;
    int64_t num_shards;
    bool replicated, partial;
  };
  const std::vector<Case> cases = {
      {{Shard{0}, Replicate{}}, {{0}, {}}, 2, false, false},
      {{Shard{0}, Shard{0}}, {{0, 1}, {}}, 4, false, false},
      {{Shard{-1}, Shard{0}}, {{1}, {0}}, 4, false, false},
      {{Replicate{}, Replicate{}}, {{}, {}}, 1, true, false},
      {{Partial{}, Shard{1}}, {{}, {1}}, 2, false, true},
  };
  for (const auto& c : cases) {
    DTensorSpec spec{mesh, c.placements, contiguous_meta({8, 4})};
    SCOPED_TRACE(spec.to_string());
    EXPECT_EQ(spec.ndim(), 2);
    EXPECT_EQ(spec.dim_map(), c.dim_map);
    EXPECT_EQ(spec.num_shards(), c.num_shards);
    EXPECT_EQ(spec.is_replicated(), c.replicated);
    EXPECT_EQ(spec.has_partial(), c.partial);
  }
}

DTENSOR_TEST_F(DTensorSpecThreaded, PrintsMeshPlacementsAndShape) {
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  DTensorSpec spec{mesh, {Shard{-2}, Replicate{}}, contiguous_meta({8, 4})};
  const std::string expected =
      "DTensorSpec(mesh=DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp')), "
      "placements=(Shard(dim=0), Replicate()), shape=[8, 4])";
  EXPECT_EQ(spec.to_string(), expected);
  std::ostringstream os;
  os << spec;
  EXPECT_EQ(os.str(), expected);
}

DTENSOR_TEST_F(DTensorSpecThreaded, EqualityAndHashMakeACacheKey) {
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  const DTensorSpec base{mesh, {Shard{0}, Replicate{}}, contiguous_meta({8, 4})};
  // Built separately (negative dim, a separately built equal mesh): still the same key.
  const DTensorSpec same{DeviceMesh("cpu", ranks({0, 1, 2, 3}, {2, 2}), {"dp", "tp"}),
                         {Shard{-2}, Replicate{}}, contiguous_meta({8, 4})};
  EXPECT_EQ(base, same);
  EXPECT_EQ(hash_value(base), hash_value(same));
  struct Case {
    std::string what;
    DTensorSpec other;
  };
  const std::vector<Case> differ = {
      {"placement", {mesh, {Shard{1}, Replicate{}}, contiguous_meta({8, 4})}},
      {"partial op", {mesh, {Partial{ReduceOp::MAX}, Replicate{}}, contiguous_meta({8, 4})}},
      {"shape", {mesh, {Shard{0}, Replicate{}}, contiguous_meta({4, 8})}},
      {"stride", {mesh, {Shard{0}, Replicate{}}, TensorMeta{{8, 4}, {1, 8}, at::kFloat}}},
      {"dtype", {mesh, {Shard{0}, Replicate{}}, contiguous_meta({8, 4}, at::kDouble)}},
      {"mesh", {init_device_mesh("cpu", {2, 2}), {Shard{0}, Replicate{}}, contiguous_meta({8, 4})}},
  };
  std::unordered_map<DTensorSpec, std::string> cache;
  cache.emplace(base, "base");
  for (const auto& c : differ) {
    SCOPED_TRACE(c.what);
    EXPECT_NE(base, c.other);
    EXPECT_NE(hash_value(base), hash_value(c.other));
    cache.emplace(c.other, c.what);
  }
  EXPECT_EQ(cache.size(), differ.size() + 1);
  EXPECT_EQ(cache.at(same), "base");
}

DTENSOR_TEST_F(DTensorSpecThreaded, RejectsPlacementsThatDoNotFit) {
  DeviceMesh mesh = init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
  expect_errors({
      {"placement count", [&] { DTensorSpec(mesh, {Shard{0}}, contiguous_meta({8})); },
       "DTensorSpec: 1 placements (Shard(dim=0),) for DeviceMesh('cpu', [[0, 1], [2, 3]], "
       "mesh_dim_names=('dp', 'tp')) with 2 dims; pass one placement per mesh dim"},
      {"shard dim", [&] { DTensorSpec(mesh, {Shard{2}, Replicate{}}, contiguous_meta({8, 4})); },
       "placements=(Shard(dim=2), Replicate()), shape=[8, 4]): Shard(dim=2) is out of range for "
       "a tensor with ndim=2"},
  });
}

}  // namespace
}  // namespace dtensor
