// DeviceMesh (construction, coordinates, per-dim groups, slicing, printing, errors),
// placements, DTensorSpec, and the local shape / offset math. Mesh tests run as threads
// (ThreadGroup); one runs as processes (Gloo, or the backend DTENSOR_BACKEND names) to check
// the per-dim groups over c10d. Meshes are built over all ranks of any even world size
// (ranks(), mesh_shape_2d()); the expected values are computed from it.
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/mesh/mesh_collectives.h"
#include "dtensor/placement/placement.h"
#include "harness/harness.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>
#include <set>
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

// A rank tensor for a DeviceMesh: `values` laid out as `shape`.
at::Tensor rank_tensor(std::vector<int64_t> values, Shape shape) {
  return at::tensor(values, at::kLong).reshape(shape);
}

// The ranks begin, begin + step, ... below end, as a rank tensor.
at::Tensor rank_range(int64_t begin, int64_t end, int64_t step = 1) {
  return at::arange(begin, end, step, at::kLong);
}

// PyTorch's repr of the rank list begin, begin + step, ... below end: "[0, 1, 2, 3]".
std::string py_list(int64_t begin, int64_t end, int64_t step = 1) {
  std::string s = "[";
  for (int64_t r = begin; r < end; r += step) s += (r == begin ? "" : ", ") + std::to_string(r);
  return s + "]";
}

// PyTorch's repr of arange(rows * cols) as rows x cols: "[[0, 1], [2, 3]]".
std::string py_grid(int64_t rows, int64_t cols) {
  std::string s = "[";
  for (int64_t i = 0; i < rows; ++i) s += (i ? ", " : "") + py_list(i * cols, (i + 1) * cols);
  return s + "]";
}

// The sum 0 + 1 + ... + (n - 1), what an all_reduce of the world ranks over n ranks gives.
int64_t rank_sum(int64_t n) { return n * (n - 1) / 2; }

// This rank's coordinate in the rank tensor `mesh` (empty when it is not in it).
Shape coordinate_in(const at::Tensor& mesh, int64_t rank) {
  const at::Tensor where = at::nonzero(mesh == rank);
  if (where.size(0) == 0) return {};
  const at::Tensor c = where[0].to(at::kLong).contiguous();
  return Shape(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel());
}

// The sum of the ranks of `mesh` along `dim` at `coordinate` (the other coordinates fixed):
// what an all_reduce of the world ranks over that rank's group of `dim` gives.
int64_t line_sum(const at::Tensor& mesh, const Shape& coordinate, int64_t dim) {
  at::Tensor line = mesh.movedim(dim, -1);
  for (int64_t i = 0; i < mesh.dim(); ++i)
    if (i != dim) line = line.select(0, coordinate[static_cast<size_t>(i)]);
  return line.sum().item<int64_t>();
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
  const int64_t n = ranks();
  struct Case {
    std::string name;
    at::Tensor mesh;
  };
  // On 4 ranks: [0, 1, 2, 3], [3, 2, 1, 0], [[0, 1], [2, 3]], [[2, 0], [3, 1]], 4x1, 1x2x2.
  const std::vector<Case> cases = {
      {"1d", rank_range(0, n)},
      {"1d_reversed", rank_range(0, n).flip(0)},
      {"2d", rank_range(0, n).reshape(mesh_shape_2d())},
      // Not in rank order: group ranks must still follow the mesh coordinate.
      {"2d_permuted", rank_range(0, n).reshape({2, n / 2}).t().flip(1).contiguous()},
      {"nx1", rank_range(0, n).reshape({n, 1})},
      {"1x(n/2)x2", rank_range(0, n).reshape({1, n / 2, 2})},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    // The expected coordinate and per-dim group sums, read off the rank tensor.
    const Shape coordinate = coordinate_in(c.mesh, rank());
    ASSERT_EQ(static_cast<int64_t>(coordinate.size()), c.mesh.dim());
    DeviceMesh mesh(device_type(), c.mesh);
    EXPECT_EQ(mesh.device_type(), device_type());
    EXPECT_TRUE(at::equal(mesh.mesh(), c.mesh));
    EXPECT_EQ(mesh.ndim(), c.mesh.dim());
    EXPECT_EQ(mesh.size(), n);
    EXPECT_EQ(mesh.shape(), c.mesh.sizes().vec());
    EXPECT_EQ(mesh.get_rank(), rank());
    EXPECT_TRUE(mesh.mesh_dim_names().empty());
    EXPECT_FALSE(mesh.get_parent_mesh().has_value());
    ASSERT_TRUE(mesh.get_coordinate().has_value());
    EXPECT_EQ(*mesh.get_coordinate(), coordinate);
    ASSERT_EQ(mesh.get_all_groups().size(), static_cast<size_t>(mesh.ndim()));
    for (int64_t d = 0; d < mesh.ndim(); ++d) {
      SCOPED_TRACE("dim " + std::to_string(d));
      EXPECT_EQ(mesh.size(d), c.mesh.size(d));
      EXPECT_EQ(mesh.get_local_rank(d), coordinate[static_cast<size_t>(d)]);
      comm::GroupPtr g = mesh.get_group(d);
      EXPECT_EQ(g, mesh.get_all_groups()[d]);
      EXPECT_EQ(g->size(), mesh.size(d));
      EXPECT_EQ(g->rank(), mesh.get_local_rank(d));
      EXPECT_EQ(reduce_world_rank_over(mesh, d), line_sum(c.mesh, coordinate, d));
    }
    EXPECT_EQ(mesh.size(-1), c.mesh.size(-1));
    EXPECT_EQ(mesh.get_group(-1), mesh.get_group(mesh.ndim() - 1));
  }
}

DTENSOR_TEST_F(DeviceMeshThreaded, NamedDimsLookUpLikeIndices) {
  DeviceMesh mesh = init_device_mesh(device_type(), mesh_shape_2d(), {"dp", "tp"});
  EXPECT_EQ(mesh, DeviceMesh(device_type(), rank_range(0, ranks()).reshape(mesh_shape_2d()), {"dp", "tp"}));
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
  const int64_t n = ranks();
  struct Case {
    std::string name;
    DeviceMesh parent;
    std::vector<std::string> names;
    at::Tensor expected_ranks;  // for this rank
  };
  DeviceMesh m2 = init_device_mesh(device_type(), mesh_shape_2d(), {"dp", "tp"});
  DeviceMesh m3 = init_device_mesh(device_type(), {n / 2, 1, 2}, {"pp", "dp", "tp"});
  const at::Tensor row = rank_tensor({r / 2 * 2, r / 2 * 2 + 1}, {2});  // this rank's tp group
  const at::Tensor column = rank_range(r % 2, n, 2);                  // this rank's dp / pp group
  const std::vector<Case> cases = {
      {"2d['tp']", m2, {"tp"}, row},
      {"2d['dp']", m2, {"dp"}, column},
      {"3d['pp','tp']", m3, {"pp", "tp"}, rank_range(0, n).reshape(mesh_shape_2d())},
      {"3d['dp','tp']", m3, {"dp", "tp"}, row.reshape({1, 2})},
      {"3d['pp']", m3, {"pp"}, column},
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
  const int64_t n = ranks();
  const std::string dt = device_type();
  DeviceMesh named = init_device_mesh(dt, mesh_shape_2d(), {"dp", "tp"});
  const std::string row = py_list(rank() / 2 * 2, rank() / 2 * 2 + 2);
  struct Case {
    DeviceMesh mesh;
    std::string expected;
  };
  // On 4 ranks: "DeviceMesh('cpu', [[0, 1], [2, 3]], mesh_dim_names=('dp', 'tp'))" and so on.
  const std::vector<Case> cases = {
      {named, "DeviceMesh('" + dt + "', " + py_grid(n / 2, 2) + ", mesh_dim_names=('dp', 'tp'))"},
      {init_device_mesh(dt, {n}), "DeviceMesh('" + dt + "', " + py_list(0, n) + ")"},
      {init_device_mesh("cuda", {n}, {"tp"}),
       "DeviceMesh('cuda', " + py_list(0, n) + ", mesh_dim_names=('tp',))"},
      {DeviceMesh(dt, rank_tensor({1, 0}, {1, 1, 2})), "DeviceMesh('" + dt + "', [[[1, 0]]])"},
      {named["tp"], "DeviceMesh('" + dt + "', " + row + ", mesh_dim_names=('tp',))"},
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
  const int64_t n = ranks();
  const std::string dt = device_type();
  const Shape shape = mesh_shape_2d();
  DeviceMesh a = init_device_mesh(dt, shape, {"dp", "tp"});
  DeviceMesh same = DeviceMesh(dt, rank_range(0, n).reshape(shape), {"dp", "tp"});
  EXPECT_EQ(a, a);
  EXPECT_EQ(a, same);
  EXPECT_EQ(hash_value(a), hash_value(same));
  EXPECT_EQ(std::hash<DeviceMesh>{}(a), hash_value(same));
  struct Case {
    std::string what;
    DeviceMesh other;
  };
  const std::vector<Case> differ = {
      {"device type", init_device_mesh(dt == "cpu" ? "cuda" : "cpu", shape, {"dp", "tp"})},
      {"ranks", DeviceMesh(dt, rank_range(0, n).flip(0).reshape(shape), {"dp", "tp"})},
      {"shape", init_device_mesh(dt, {n, 1}, {"dp", "tp"})},
      {"names", init_device_mesh(dt, shape, {"x", "tp"})},
      {"no names", init_device_mesh(dt, shape)},
  };
  for (const auto& c : differ) {
    SCOPED_TRACE(c.what);
    EXPECT_NE(a, c.other);
    EXPECT_NE(hash_value(a), hash_value(c.other));
  }
}

DTENSOR_TEST_F(DeviceMeshThreaded, ConstructionErrorsNameTheMeshAndTheFix) {
  const int64_t n = ranks();
  const std::string dt = device_type();
  const std::string world = std::to_string(n), over = std::to_string(n + 1);
  const Shape shape = mesh_shape_2d();
  // Every rank passes the same bad arguments and throws before any collective.
  expect_errors({
      {"larger than the world", [&] { DeviceMesh(dt, rank_range(0, n + 1)); },
       "DeviceMesh('" + dt + "', " + py_list(0, n + 1) + "): the mesh has " + over +
           " ranks, more than the world (" + world},
      {"init_device_mesh size", [&] { init_device_mesh(dt, {n + 1}); },
       "init_device_mesh('" + dt + "', mesh_shape=(" + over + ",)): the mesh size (" + over +
           ") is larger than the world size (" + world},
      {"init_device_mesh zero dim", [&] { init_device_mesh(dt, {n, 0}); },
       "every dim of mesh_shape needs at least one rank"},
      {"duplicate rank", [&] { DeviceMesh(dt, rank_tensor({1, 1}, {1, 2})); },
       "DeviceMesh('" + dt + "', [[1, 1]]): rank 1 appears more than once"},
      {"rank too large", [&] { DeviceMesh(dt, rank_tensor({0, n + 3}, {2})); },
       "rank " + std::to_string(n + 3) + " is out of range for a world of size " + world +
           " (valid ranks: 0.." + std::to_string(n - 1) + ")"},
      {"negative rank", [&] { DeviceMesh(dt, rank_tensor({0, -1}, {2})); },
       "rank -1 is out of range"},
      {"name count", [&] { DeviceMesh(dt, rank_range(0, n).reshape(shape), {"dp"}); },
       "got 1 mesh_dim_names ('dp',) for a 2-D mesh; pass one name per mesh dim, or none"},
      {"duplicate names", [&] { init_device_mesh(dt, shape, {"dp", "dp"}); },
       "mesh_dim_names has 'dp' more than once"},
      {"float ranks", [&] { DeviceMesh(dt, at::arange(n, at::kFloat)); },
       "the rank tensor must hold integer ranks"},
      {"0-d ranks", [&] { DeviceMesh(dt, at::scalar_tensor(0, at::kLong)); },
       "the rank tensor needs at least one dim"},
      {"device type", [&] { init_device_mesh("tpu", {n}); },
       "device_type 'tpu' is not supported; use \"cpu\", \"cuda\" or (on a fake world) \"meta\""},
  });
  // The world is still usable.
  EXPECT_EQ(reduce_world_rank_over(init_device_mesh(dt, {n}), 0), rank_sum(n));
}

DTENSOR_TEST_F(DeviceMeshThreaded, LookupAndSliceErrorsNameTheMesh) {
  DeviceMesh m = init_device_mesh(device_type(), mesh_shape_2d(), {"dp", "tp"});
  DeviceMesh unnamed = init_device_mesh(device_type(), mesh_shape_2d());
  const std::string ranks_repr = "DeviceMesh('" + device_type() + "', " + py_grid(ranks() / 2, 2);
  const std::string repr = ranks_repr + ", mesh_dim_names=('dp', 'tp'))";
  expect_errors({
      {"unknown name: get_group", [&] { m.get_group("pp"); },
       repr + " has no dim named 'pp'; its dims are ('dp', 'tp')"},
      {"unknown name: get_local_rank", [&] { m.get_local_rank("pp"); }, "has no dim named 'pp'"},
      {"unknown name: slice", [&] { m["pp"]; }, "has no dim named 'pp'"},
      {"no names", [&] { unnamed.get_group("dp"); }, ranks_repr + ") has no dim names"},
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
  EXPECT_PRED2(contains, error_of([&] { init_device_mesh(device_type(), mesh_shape_2d(), names); }),
               "the ranks passed different meshes to the DeviceMesh constructor");
  // The world is still usable, and agreeing ranks build the mesh: tp groups are the rows
  // {2k, 2k + 1}.
  EXPECT_EQ(reduce_world_rank_over(init_device_mesh(device_type(), mesh_shape_2d(), {"dp", "tp"}), 1),
            rank() / 2 * 4 + 1);
}

// ---- DeviceMesh over a subset of the world, get_local_rank() / get_group() without a dim,
// _flatten, mesh_broadcast / mesh_scatter (PyTorch test_device_mesh.py) ---------------------

DTENSOR_TEST_F(DeviceMeshThreaded, SubsetMeshRanksOutsideHoldNothing) {
  DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // the even and the odd ranks are two halves
  const int r = rank();
  const int64_t n = ranks(), half = n / 2;
  const std::string dt = device_type();
  // PyTorch: DeviceMesh(device_type, [0, 2]) on 4 ranks (test_dtensor.py *_sub_mesh): here the
  // even ranks.
  const std::string evens = "DeviceMesh('" + dt + "', " + py_list(0, n, 2) + ")";
  DeviceMesh mesh(dt, rank_range(0, n, 2));
  EXPECT_EQ(mesh.size(), half);
  EXPECT_EQ(mesh.get_rank(), r);
  if (r % 2 == 0) {
    ASSERT_TRUE(mesh.get_coordinate().has_value());
    EXPECT_EQ(*mesh.get_coordinate(), Shape{r / 2});
    EXPECT_EQ(mesh.get_local_rank(), r / 2);
    EXPECT_EQ(mesh.get_group()->size(), half);
    EXPECT_EQ(reduce_world_rank_over(mesh, 0), 2 * rank_sum(half));  // 0 + 2 + ...
  } else {
    EXPECT_FALSE(mesh.get_coordinate().has_value());
    EXPECT_EQ(mesh.get_all_groups(), std::vector<comm::GroupPtr>{nullptr});
    EXPECT_PRED2(contains, error_of([&] { mesh.get_group(0); }),
                 "get_group: rank " + std::to_string(r) + " is not in " + evens);
    EXPECT_PRED2(contains, error_of([&] { mesh.get_local_rank(); }), "is not in " + evens);
  }
  // A 2-D subset in another order (the odd ranks, descending), and init_device_mesh over the
  // first ranks.
  const at::Tensor odds_down = rank_range(1, n, 2).flip(0);
  DeviceMesh m2(dt, odds_down.reshape({half, 1}), {"dp", "tp"});
  if (r % 2 == 1) {
    EXPECT_EQ(*m2.get_coordinate(), (Shape{(n - 1 - r) / 2, 0}));
    EXPECT_EQ(reduce_world_rank_over(m2, 0), half * half);  // 1 + 3 + ...
    EXPECT_EQ(reduce_world_rank_over(m2, 1), r);
    EXPECT_TRUE(at::equal(m2["dp"].mesh(), odds_down));
  } else {
    EXPECT_FALSE(m2.get_coordinate().has_value());
    EXPECT_PRED2(contains, error_of([&] { m2["dp"]; }), "is not in the mesh, so it has no slice");
  }
  DeviceMesh first = init_device_mesh(dt, {n - 1});
  EXPECT_EQ(first.get_coordinate().has_value(), r < n - 1);
  if (r < n - 1) EXPECT_EQ(reduce_world_rank_over(first, 0), rank_sum(n - 1));
  // The world is still usable.
  EXPECT_EQ(reduce_world_rank_over(init_device_mesh(dt, {n}), 0), rank_sum(n));
}

DTENSOR_TEST_F(DeviceMeshThreaded, LocalRankAndGroupWithoutADimOnlyOnA1DMesh) {
  DeviceMesh m1 = init_device_mesh(device_type(), {ranks()});
  EXPECT_EQ(m1.get_local_rank(), rank());
  EXPECT_EQ(m1.get_group(), m1.get_group(0));
  DeviceMesh m2 = init_device_mesh(device_type(), mesh_shape_2d(), {"dp", "tp"});
  EXPECT_EQ(m2["tp"].get_local_rank(), rank() % 2);
  EXPECT_PRED2(contains, error_of([&] { m2.get_local_rank(); }),
               "get_local_rank() on DeviceMesh('" + device_type() + "', " + py_grid(ranks() / 2, 2) +
                   ", mesh_dim_names=('dp', 'tp')): the mesh has 2 dims; pass the mesh dim");
  EXPECT_PRED2(contains, error_of([&] { m2.get_group(); }), "the mesh has 2 dims; pass the mesh dim");
}

// test_device_mesh.py TestDeviceMeshGetItem test_flatten_mesh_1d/_3d (world 8 and 2x2x2 there;
// here meshes (1, n/2, 2) and (n/2, 1, 2) over the n ranks).
DTENSOR_TEST_F(DeviceMeshThreaded, FlattenMakesA1DMeshTheRootKnows) {
  const int r = rank();
  const int64_t n = ranks(), half = n / 2;
  const std::string dt = device_type();
  DeviceMesh m3 = init_device_mesh(dt, {1, half, 2}, {"dp", "cp", "tp"});
  // dp x cp: the ranks that share tp: the even ranks and the odd ranks.
  DeviceMesh dp_cp = m3[{"dp", "cp"}]._flatten();
  EXPECT_TRUE(at::equal(dp_cp.mesh(), rank_range(r % 2, n, 2))) << dp_cp;
  EXPECT_EQ(dp_cp.mesh_dim_names(), std::vector<std::string>{"dp_cp"});
  EXPECT_EQ(*dp_cp.get_coordinate(), Shape{r / 2});
  EXPECT_EQ(reduce_world_rank_over(dp_cp, 0), 2 * rank_sum(half) + (r % 2) * half);
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
  EXPECT_TRUE(at::equal(two_d.mesh(), rank_range(0, n).reshape({half, 2}))) << two_d;
  EXPECT_EQ(*two_d.get_coordinate(), (Shape{r / 2, r % 2}));
  EXPECT_EQ(two_d.get_group(0), dp_cp.get_group());
  EXPECT_EQ(two_d.get_group(1), m3.get_group("tp"));
  EXPECT_EQ(two_d.get_parent_mesh_dims(), (std::vector<int64_t>{-1, 2}));
  // The whole mesh, named: every rank in one group.
  DeviceMesh all = m3._flatten("world");
  EXPECT_TRUE(at::equal(all.mesh(), at::arange(n)));
  EXPECT_EQ(reduce_world_rank_over(all, 0), rank_sum(n));
  // A 1-D mesh flattened under its own name is itself; under another name, a new mesh.
  DeviceMesh tp = m3["tp"];
  EXPECT_EQ(tp._flatten(), tp);
  EXPECT_EQ(tp._flatten("tp2").mesh_dim_names(), std::vector<std::string>{"tp2"});
  EXPECT_TRUE(at::equal(tp._flatten("tp2").mesh(), tp.mesh()));
  // Non-adjacent dims (dp, tp of a (n/2, 1, 2) mesh): row-major over those dims.
  DeviceMesh m3b = init_device_mesh(dt, {half, 1, 2}, {"dp", "cp", "tp"});
  DeviceMesh dp_tp = m3b[{"dp", "tp"}]._flatten();
  EXPECT_TRUE(at::equal(dp_tp.mesh(), at::arange(n)));
  EXPECT_EQ(dp_tp.get_local_rank(), r);
  EXPECT_EQ((m3b[{"cp", "dp_tp"}].shape()), (Shape{1, n}));
  // Errors: every rank raises alike, before any collective.
  DeviceMesh unnamed = init_device_mesh(dt, mesh_shape_2d());
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
  EXPECT_EQ(reduce_world_rank_over(m3[{"cp", "tp"}]._flatten("cp_tp"), 0), rank_sum(n));
}

// DeviceMesh._unflatten (PyTorch 2.9's test_device_mesh.py test_unflatten_mesh_*): a dim split
// into named dims in row-major order, with groups that reduce over the right ranks.
DTENSOR_TEST_F(DeviceMeshThreaded, UnflattenSplitsADimIntoNamedDims) {
  const int r = rank();
  const int64_t n = ranks(), half = n / 2;
  DeviceMesh world = init_device_mesh(device_type(), {n}, {"world"});
  DeviceMesh m = world._unflatten(0, {half, 2}, {"dp", "tp"});
  EXPECT_TRUE(at::equal(m.mesh(), rank_range(0, n).reshape({half, 2}))) << m;
  EXPECT_EQ(m.mesh_dim_names(), (std::vector<std::string>{"dp", "tp"}));
  EXPECT_EQ(*m.get_coordinate(), (Shape{r / 2, r % 2}));
  EXPECT_EQ(reduce_world_rank_over(m, 1), 2 * (r / 2) * 2 + 1);  // {2k, 2k + 1}
  EXPECT_EQ(reduce_world_rank_over(m, 0), rank_sum(half) * 2 + half * (r % 2));  // {c, c + 2, ...}
  EXPECT_FALSE(m.get_parent_mesh().has_value());
  // A middle dim of a 2-D mesh, by name; the other dim keeps its name.
  DeviceMesh m2 = init_device_mesh(device_type(), {half, 2}, {"dp", "tp"});
  DeviceMesh m3 = m2._unflatten("dp", {1, half}, {"pp", "dp_shard"});
  EXPECT_EQ(m3.mesh_dim_names(), (std::vector<std::string>{"pp", "dp_shard", "tp"}));
  EXPECT_EQ(m3.shape(), (Shape{1, half, 2}));
  EXPECT_EQ(m3.get_local_rank("tp"), r % 2);
  expect_errors({
      {"sizes that do not multiply to the dim", [&] { world._unflatten(0, {half, 3}, {"a", "b"}); },
       "the sizes multiply to " + std::to_string(half * 3) + " but dim 0 ('world') has " + std::to_string(n) + " ranks"},
      {"names not one per size", [&] { world._unflatten(0, {half, 2}, {"a"}); }, "give one name per size"},
      {"a clashing name", [&] { m2._unflatten("dp", {1, half}, {"tp", "x"}); }, "the dim name 'tp' would appear twice"},
      {"a sliced mesh", [&] { m2["dp"]._unflatten(0, {half}, {"x"}); }, "unflatten a root mesh"},
  });
}


// test_device_mesh.py TestDeviceMeshCollectives (world 8 and mesh (2, 2, 2) there; here a 1-D
// mesh over the n ranks and an (n/2, 2) one).
DTENSOR_TEST_F(DeviceMeshThreaded, MeshBroadcastAndScatterAlongEachDim) {
  const int r = rank();
  const int64_t n = ranks();
  const std::string dt = device_type();
  DeviceMesh m1 = init_device_mesh(dt, {n});
  at::Tensor t = at::ones({3, 3}) * r;
  mesh_broadcast(t, m1, 0);
  EXPECT_TRUE(at::equal(t, at::zeros({3, 3})));  // test_broadcast_1d
  // test_scatter_1d: every scatter dim of a [3, 3, 3] tensor grown n-fold along it.
  for (int64_t dim = 0; dim < 3; ++dim) {
    std::vector<int64_t> shape = {3, 3, 3};
    shape[dim] *= n;
    at::Tensor global = at::arange(shape[0] * shape[1] * shape[2], at::kFloat).reshape(shape);
    std::vector<at::Tensor> pieces;
    for (auto& p : global.tensor_split(n, dim)) pieces.push_back(p.contiguous());
    at::Tensor recv = at::empty_like(pieces[r]);
    mesh_scatter(recv, r == 0 ? pieces : std::vector<at::Tensor>{}, m1, 0);
    EXPECT_TRUE(at::equal(recv, pieces[r])) << "scatter dim " << dim;
  }
  // test_broadcast_nd / test_scatter_nd on an (n/2, 2) mesh: each dim's groups, from their
  // first rank and from their last.
  DeviceMesh m2 = init_device_mesh(dt, mesh_shape_2d());
  for (int64_t dim = 0; dim < 2; ++dim) {
    const int64_t size = m2.size(dim);
    // This rank's group along `dim`: its row of the mesh with `dim` moved last.
    const at::Tensor groups = m2.mesh().movedim(dim, -1).reshape({-1, size});
    std::vector<int64_t> mine;
    for (int64_t row = 0; row < groups.size(0); ++row) {
      const at::Tensor g = groups[row].contiguous();
      if ((g == r).any().item<bool>()) mine.assign(g.data_ptr<int64_t>(), g.data_ptr<int64_t>() + size);
    }
    ASSERT_EQ(static_cast<int64_t>(mine.size()), size);
    const int64_t my_pos = std::find(mine.begin(), mine.end(), r) - mine.begin();
    for (int64_t src : std::set<int64_t>{0, size - 1}) {
      SCOPED_TRACE("dim " + std::to_string(dim) + " src " + std::to_string(src));
      at::Tensor b = at::ones({3, 3}) * r;
      mesh_broadcast(b, m2, dim, src);
      EXPECT_TRUE(at::equal(b, at::ones({3, 3}) * mine[src]));
      std::vector<at::Tensor> list;
      for (int64_t k = 0; k < size; ++k) list.push_back(at::ones({3, 3}) * (r * 10 + k));
      at::Tensor out = at::empty({3, 3});
      mesh_scatter(out, list, m2, dim, src);
      EXPECT_TRUE(at::equal(out, at::ones({3, 3}) * (mine[src] * 10 + my_pos)));
    }
  }
  // Meta tensors are left alone (no collective: ranks need not match).
  at::Tensor meta = at::empty({2}, at::TensorOptions().device(at::kMeta));
  if (r == 0) mesh_broadcast(meta, m1);
  // Errors.
  DeviceMesh sub(dt, rank_tensor({0, 1}, {2}));
  if (r >= 2) {
    at::Tensor x = at::ones({1});
    EXPECT_PRED2(contains, error_of([&] { mesh_broadcast(x, sub); }),
                 "mesh_broadcast: rank " + std::to_string(r) + " is not in DeviceMesh('" + dt + "', [0, 1])");
  }
  at::Tensor y = at::ones({1});
  EXPECT_PRED2(contains, error_of([&] { mesh_scatter(y, {}, m1, 0, n); }),
               "mesh_scatter: group_src " + std::to_string(n) + " is not a rank of mesh dim 0");
  // mesh_all_gather_object: every rank of the mesh, in row-major mesh order.
  const at::Tensor permuted = rank_range(0, n).reshape({2, n / 2}).t().flip(1).contiguous();  // [[2, 0], [3, 1]]
  DeviceMesh perm(dt, permuted);
  std::vector<int> expected;
  for (int64_t k = 0; k < n; ++k) expected.push_back(static_cast<int>(permuted.view({-1})[k].item<int64_t>()) * 100);
  EXPECT_EQ(mesh_all_gather_object(perm, r * 100), expected);
  const at::Tensor odds_down = rank_range(1, n, 2).flip(0).contiguous();  // [3, 1]
  DeviceMesh odd(dt, odds_down);  // collective over the world: every rank builds it
  if (r % 2 == 1) {
    std::vector<std::string> letters;
    for (int64_t k = 0; k < odds_down.numel(); ++k)
      letters.emplace_back(1, static_cast<char>('a' + odds_down[k].item<int64_t>()));
    EXPECT_EQ(mesh_all_gather_object(odd, std::string(1, static_cast<char>('a' + r))), letters);
  }
}

DTENSOR_TEST_F(DeviceMeshGloo, TwoDimNamedMeshGroupsReduceOverEachDim) {
  ASSERT_NE(group().backend(), "threads");  // per-dim groups over c10d
  const int r = rank();
  const int64_t n = ranks(), half = n / 2;
  DeviceMesh mesh = init_device_mesh(device_type(), mesh_shape_2d(), {"dp", "tp"});
  const auto on_device = at::TensorOptions().device(mesh.device());
  EXPECT_EQ(*mesh.get_coordinate(), (Shape{r / 2, r % 2}));
  // dp groups are the even and the odd ranks; tp groups are rows {2k, 2k + 1}.
  const int64_t dp_sum = 2 * rank_sum(half) + (r % 2) * half, tp_sum = r / 2 * 4 + 1;
  EXPECT_EQ(reduce_world_rank_over(mesh, mesh.get_mesh_dim("dp")), dp_sum);
  EXPECT_EQ(reduce_world_rank_over(mesh, mesh.get_mesh_dim("tp")), tp_sum);
  EXPECT_EQ(mesh.get_group("dp")->rank(), mesh.get_local_rank("dp"));
  DeviceMesh tp = mesh["tp"];
  EXPECT_EQ(tp.get_group(0), mesh.get_group("tp"));
  EXPECT_EQ(reduce_world_rank_over(tp, 0), tp_sum);
  // Over c10d: a subset mesh, a flattened dim, mesh_broadcast and mesh_scatter.
  DeviceMesh odd(device_type(), rank_range(1, n, 2));
  if (r % 2 == 1) EXPECT_EQ(reduce_world_rank_over(odd, 0), half * half);
  else EXPECT_FALSE(odd.get_coordinate().has_value());
  DeviceMesh flat = mesh._flatten();
  EXPECT_EQ(reduce_world_rank_over(flat, 0), rank_sum(n));
  at::Tensor b = at::ones({2}, on_device) * r;
  mesh_broadcast(b, mesh, 0, half - 1);  // dp groups: from their last rank
  EXPECT_TRUE(at::equal(b.cpu(), at::ones({2}) * (n - 2 + r % 2)));
  at::Tensor out = at::empty({2}, on_device);
  std::vector<at::Tensor> pieces;
  for (int64_t i = 0; i < n; ++i) pieces.push_back(at::ones({2}, on_device) * (i + 10));
  mesh_scatter(out, pieces, flat, 0);
  EXPECT_TRUE(at::equal(out.cpu(), at::ones({2}) * (r + 10)));
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
  const int64_t n = ranks();
  DeviceMesh mesh = init_device_mesh(device_type(), {n});
  // On 4 ranks: 10 rows are 3, 3, 3, 1; 5 rows 2, 2, 1, 0; 2 rows 1, 1, 0, 0.
  for (int64_t rows : {2 * n + 2, n + 1, n / 2}) {
    SCOPED_TRACE(std::to_string(rows) + " rows");
    // torch.chunk's pieces; ranks past the last piece get none.
    const std::vector<at::Tensor> chunks = rows ? at::arange(rows).chunk(n) : std::vector<at::Tensor>{};
    const int64_t mine = rank() < static_cast<int64_t>(chunks.size()) ? chunks[rank()].numel() : 0;
    auto [shape, offset] = compute_local_shape_and_global_offset({rows, 3}, mesh, {Shard{0}});
    EXPECT_EQ(shape, (Shape{mine, 3}));
    EXPECT_EQ(compute_local_shape({rows, 3}, mesh, {Shard{0}}), shape);
    // Every rank's rows, gathered, tile the tensor exactly once.
    at::Tensor sizes = at::zeros({n}, at::kLong);
    sizes[rank()] = shape[0];
    mesh.get_group(0)->all_reduce(sizes);
    EXPECT_EQ(offset[0], sizes.narrow(0, 0, rank()).sum().item<int64_t>());
    EXPECT_EQ(sizes.sum().item<int64_t>(), rows);
  }
}

DTENSOR_TEST_F(ShardMathThreaded, TwoDimMeshUsesThisRanksCoordinate) {
  DeviceMesh mesh = init_device_mesh(device_type(), mesh_shape_2d(), {"dp", "tp"});
  const std::vector<Placement> ps = {Shard{0}, Shard{0}};
  EXPECT_EQ(compute_local_shape_and_global_offset({10, 5}, mesh, ps),
            compute_local_shape_and_global_offset({10, 5}, mesh_shape_2d(), ps, mesh.get_coordinate()));
  // Slicing keeps this rank's coordinate: a 1-D sub-mesh splits like a 1-D mesh.
  EXPECT_EQ(compute_local_shape({9, 5}, mesh["tp"], {Shard{0}}), (Shape{rank() % 2 ? 4 : 5, 5}));
}

// ---- DTensorSpec ------------------------------------------------------------------------

TensorMeta contiguous_meta(Shape shape, at::ScalarType dtype = at::kFloat) {
  return {shape, at::empty(shape, at::kFloat).strides().vec(), dtype};
}

DTENSOR_TEST_F(DTensorSpecThreaded, DimMapShardCountAndPredicates) {
  DeviceMesh mesh = init_device_mesh(device_type(), mesh_shape_2d(), {"dp", "tp"});
  const int64_t dp = mesh.size(0), tp = mesh.size(1), n = ranks();
  struct Case {
    std::vector<Placement> placements;
    std::vector<std::vector<int64_t>> dim_map;
    int64_t num_shards;
    bool replicated, partial;
  };
  const std::vector<Case> cases = {
      {{Shard{0}, Replicate{}}, {{0}, {}}, dp, false, false},
      {{Shard{0}, Shard{0}}, {{0, 1}, {}}, n, false, false},
      {{Shard{-1}, Shard{0}}, {{1}, {0}}, n, false, false},
      {{Replicate{}, Replicate{}}, {{}, {}}, 1, true, false},
      {{Partial{}, Shard{1}}, {{}, {1}}, tp, false, true},
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
  DeviceMesh mesh = init_device_mesh(device_type(), mesh_shape_2d(), {"dp", "tp"});
  DTensorSpec spec{mesh, {Shard{-2}, Replicate{}}, contiguous_meta({8, 4})};
  const std::string expected =
      "DTensorSpec(mesh=DeviceMesh('" + device_type() + "', " + py_grid(ranks() / 2, 2) +
      ", mesh_dim_names=('dp', 'tp')), placements=(Shard(dim=0), Replicate()), shape=[8, 4])";
  EXPECT_EQ(spec.to_string(), expected);
  std::ostringstream os;
  os << spec;
  EXPECT_EQ(os.str(), expected);
}

DTENSOR_TEST_F(DTensorSpecThreaded, EqualityAndHashMakeACacheKey) {
  DeviceMesh mesh = init_device_mesh(device_type(), mesh_shape_2d(), {"dp", "tp"});
  const DTensorSpec base{mesh, {Shard{0}, Replicate{}}, contiguous_meta({8, 4})};
  // Built separately (negative dim, a separately built equal mesh): still the same key.
  const DTensorSpec same{DeviceMesh(device_type(), rank_range(0, ranks()).reshape(mesh_shape_2d()), {"dp", "tp"}),
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
      {"mesh", {init_device_mesh(device_type(), mesh_shape_2d()), {Shard{0}, Replicate{}}, contiguous_meta({8, 4})}},
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
  DeviceMesh mesh = init_device_mesh(device_type(), mesh_shape_2d(), {"dp", "tp"});
  expect_errors({
      {"placement count", [&] { DTensorSpec(mesh, {Shard{0}}, contiguous_meta({8})); },
       "DTensorSpec: 1 placements (Shard(dim=0),) for DeviceMesh('" + device_type() + "', " +
           py_grid(ranks() / 2, 2) + ", mesh_dim_names=('dp', 'tp')) with 2 dims; pass one placement per mesh dim"},
      {"shard dim", [&] { DTensorSpec(mesh, {Shard{2}, Replicate{}}, contiguous_meta({8, 4})); },
       "placements=(Shard(dim=2), Replicate()), shape=[8, 4]): Shard(dim=2) is out of range for "
       "a tensor with ndim=2"},
  });
}

}  // namespace
}  // namespace dtensor
