// DTensorConverter (choices, combinations, descriptions, conversion) and the test_op helper
// of DTensorTestBase / DTensorOpTestBase. Converter tests run as threads; the test_op tests
// run once as processes and once as threads.
//
// Expected counts follow NOTE: [Converter sharding choices] (converters/dtensor_converter.h):
// a tensor gets Replicate plus Shard(i) for each dim of size > 1 divisible by the mesh size.
// The tables of counts are worked out for 4 ranks and declare it; the other tests use dims of
// 8 (divisible by 2, 4 and 8 ranks) and odd dims (divisible by none), so their counts hold at
// every world size the suites run at.
#include "converters/dtensor_converter.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/placement/placement.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/dtensor_test_base.h"
#include "harness/harness.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

namespace dtensor {
namespace {

using c10::IValue;
using testing::DTensorConverter;
using testing::DTensorConverterOptions;
using Shape = std::vector<int64_t>;
using Placements = std::vector<Placement>;

// Deterministic values (not at::randn: threads share the global generator, and every rank
// must compute the same reference).
at::Tensor values(const Shape& shape, double offset = 0.0) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return (at::arange(numel, at::kDouble) * 0.37 + offset).sin().to(at::kFloat).reshape(shape);
}

DTensorConverterOptions with(bool mesh_2d, bool partial, bool uneven) {
  DTensorConverterOptions o;
  o.mesh_2d = mesh_2d;
  o.partial = partial;
  o.uneven = uneven;
  return o;
}
const DTensorConverterOptions kPlain = with(false, false, false);
const DTensorConverterOptions kPartial = with(false, true, false);
const DTensorConverterOptions kUneven = with(false, false, true);
const DTensorConverterOptions kMesh2d = with(true, false, false);

using testing::error_of;
using testing::contains;
class ConverterThreaded : public testing::DTensorOpTestBase {
 protected:
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(120); }
};

struct CountCase {
  std::string what;
  std::vector<IValue> args;
  DTensorConverterOptions options;
  int64_t expected;
};

void expect_counts(const DeviceMesh& mesh, const std::vector<CountCase>& cases) {
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    DTensorConverter converter(mesh, c.args, c.options);
    EXPECT_EQ(converter.num_combinations(), c.expected);
    int64_t product = 1;
    for (int64_t i = 0; i < converter.num_tensors(); ++i) {
      product *= static_cast<int64_t>(converter.choices(i).size());
    }
    EXPECT_EQ(product, converter.num_combinations());
    EXPECT_EQ(converter.hits(), 0);
    EXPECT_EQ(converter.misses(), 0);
    EXPECT_EQ(converter.current_placements_string(), "");
  }
}

// ---- Choices and counts (no DTensor op runs) ------------------------------------------

DTENSOR_TEST_F(ConverterThreaded, CountsOn1dMesh) {
  DTENSOR_REQUIRE_WORLD_SIZE(4);  // the expected choices are worked out for 4 ranks
  DeviceMesh mesh = build_device_mesh();
  const at::Tensor m84 = values({8, 4});
  expect_counts(mesh, {
      // [8, 4]: Replicate, Shard(0), Shard(1) -> 3 per tensor.
      {"[8,4] x [8,4]", {m84, values({8, 4}, 1)}, kPlain, 3 * 3},
      {"[8,3]: dim 1 not divisible", {values({8, 3})}, kPlain, 2},
      {"[6,5]: nothing divisible", {values({6, 5})}, kPlain, 1},
      {"[1,4]: size-1 dim", {values({1, 4})}, kPlain, 2},
      {"[2,8,4]", {values({2, 8, 4})}, kPlain, 3},
      {"[8,4] x [4] x scalar x None", {m84, values({4}), IValue(2), IValue()}, kPlain, 3 * 2},
      {"bool [8,4]: sharded like any tensor", {at::ones({8, 4}, at::kBool)}, kPlain, 3},
      {"0-dim: replicate only", {at::scalar_tensor(3.0)}, kPlain, 1},
      {"int64 [8]", {at::arange(8)}, kPlain, 2},
      {"no tensor: one empty combination", {IValue(1), IValue(2.5)}, kPlain, 1},
      {"undefined tensor is absent", {IValue(at::Tensor()), m84}, kPlain, 3},
  });
}

DTENSOR_TEST_F(ConverterThreaded, CountsWithPartialAndUneven) {
  DTENSOR_REQUIRE_WORLD_SIZE(4);  // the expected choices are worked out for 4 ranks
  DeviceMesh mesh = build_device_mesh();
  expect_counts(mesh, {
      {"partial [8,4]", {values({8, 4})}, kPartial, 4},
      {"partial [8,4] x [8,4]", {values({8, 4}), values({8, 4})}, kPartial, 4 * 4},
      {"partial bool: no Partial", {at::ones({8, 4}, at::kBool)}, kPartial, 3},
      {"partial 0-dim", {at::scalar_tensor(3.0)}, kPartial, 1},
      {"partial [6,5]", {values({6, 5})}, kPartial, 2},
      {"uneven [6,5]", {values({6, 5})}, kUneven, 3},
      {"uneven [1,5]", {values({1, 5})}, kUneven, 2},
      {"uneven [2,4]: fewer rows than ranks", {values({2, 4})}, kUneven, 3},
      {"uneven bool", {at::ones({6, 5}, at::kBool)}, kUneven, 3},
      {"uneven + partial [6,5]", {values({6, 5})}, with(false, true, true), 4},
  });
}

DTENSOR_TEST_F(ConverterThreaded, CountsOn2dMesh) {
  DTENSOR_REQUIRE_WORLD_SIZE(4);  // the expected choices are worked out for 4 ranks
  DeviceMesh mesh = init_device_mesh(device_type(), mesh_shape_2d());
  expect_counts(mesh, {
      // Without mesh_2d one choice covers the whole mesh: divisibility by 4.
      {"[8,4]", {values({8, 4})}, kPlain, 3},
      {"[2,4]", {values({2, 4})}, kPlain, 2},
      // mesh_2d: {R, S0, S1} per mesh dim = 9, minus the lists that split a dim unevenly.
      {"mesh_2d [8,4]", {values({8, 4})}, kMesh2d, 9},
      {"mesh_2d [2,4]: no (S0, S0)", {values({2, 4})}, kMesh2d, 8},
      {"mesh_2d [2,3]: {R, S0} per dim, no (S0, S0)", {values({2, 3})}, kMesh2d, 3},
      {"mesh_2d uneven [2,3]", {values({2, 3})}, with(true, false, true), 9},
      {"mesh_2d partial [8,4]", {values({8, 4})}, with(true, true, false), 16},
      {"mesh_2d bool", {at::ones({8, 4}, at::kBool)}, kMesh2d, 9},
      {"mesh_2d partial bool: no Partial", {at::ones({8, 4}, at::kBool)}, with(true, true, false), 9},
      {"mesh_2d 0-dim", {at::scalar_tensor(1.0)}, kMesh2d, 1},
      {"mesh_2d [8,4] x [8,4]", {values({8, 4}), values({8, 4})}, kMesh2d, 81},
  });
}

// NOTE: [Converter covering design]: above the cap, every pair of tensors still sees every
// pair of their choices (so every tensor every choice), all Replicate comes first, and the
// random extras are the same on every run.
DTENSOR_TEST_F(ConverterThreaded, CapVisitsAPairwiseCoveringDesign) {
  DeviceMesh mesh = init_device_mesh(device_type(), mesh_shape_2d());
  DTensorConverterOptions o = with(true, true, false);
  o.max_combinations = 48;
  const std::vector<IValue> three = {values({8, 8}), values({8, 8}, 1), values({8, 8}, 2)};
  DTensorConverter c(mesh, three, o);
  ASSERT_EQ(c.num_combinations(), 16 * 16 * 16);
  const std::vector<int64_t>& plan = c.plan();
  EXPECT_EQ(plan.front(), 0);
  EXPECT_EQ(std::set<int64_t>(plan.begin(), plan.end()).size(), plan.size());
  EXPECT_GE(c.num_visited(), 256);
  EXPECT_LT(c.num_visited(), 4096);
  std::set<std::tuple<int64_t, int64_t, std::string, std::string>> pairs;
  for (int64_t index : plan) {
    const auto combination = c.combination(index);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = i + 1; j < 3; ++j)
        pairs.emplace(i, j, dtensor::to_string(combination[i]), dtensor::to_string(combination[j]));
  }
  EXPECT_EQ(pairs.size(), 3u * 16 * 16);
  EXPECT_PRED2(contains, c.design(), "pairwise covering");
  DTensorConverter again(mesh, three, o);
  EXPECT_EQ(again.plan(), plan);

  // Two tensors: every pair of choices is the whole product, whatever the cap.
  DTensorConverter two(mesh, {values({8, 8}), values({8, 8}, 1)}, o);
  EXPECT_EQ(two.num_visited(), 256);
  // Under the cap: the product, in order.
  o.max_combinations = 300;
  DTensorConverter full(mesh, {values({8, 8}), values({8, 8}, 1)}, o);
  EXPECT_EQ(full.design(), "full product");
  EXPECT_EQ(full.plan()[5], 5);
}

DTENSOR_TEST_F(ConverterThreaded, ChoicesAreFullPlacementLists) {
  DTENSOR_REQUIRE_WORLD_SIZE(4);  // the expected choices are worked out for 4 ranks
  DeviceMesh mesh1 = build_device_mesh();
  DTensorConverter c1(mesh1, {values({8, 4})}, kPartial);
  EXPECT_EQ(c1.choices(0), (std::vector<Placements>{{Replicate{}},
                                                     {Shard{0}},
                                                     {Shard{1}},
                                                     {Partial(comm::ReduceOp::SUM)}}));

  DeviceMesh mesh2 = init_device_mesh(device_type(), mesh_shape_2d());
  DTensorConverter flat(mesh2, {values({8, 4})});
  EXPECT_EQ(flat.choices(0), (std::vector<Placements>{{Replicate{}, Replicate{}},
                                                       {Shard{0}, Shard{0}},
                                                       {Shard{1}, Shard{1}}}));
  DTensorConverter per_dim(mesh2, {values({2, 4})}, kMesh2d);
  const Placements s0s0 = {Shard{0}, Shard{0}};
  const Placements s1s1 = {Shard{1}, Shard{1}};
  const Placements s0s1 = {Shard{0}, Shard{1}};
  const auto& choices = per_dim.choices(0);
  EXPECT_EQ(std::count(choices.begin(), choices.end(), s0s0), 0);
  EXPECT_EQ(std::count(choices.begin(), choices.end(), s1s1), 1);
  EXPECT_EQ(std::count(choices.begin(), choices.end(), s0s1), 1);
  EXPECT_EQ(choices.front(), (Placements{Replicate{}, Replicate{}}));
  EXPECT_EQ(choices[1], (Placements{Replicate{}, Shard{0}}));  // last mesh dim fastest
}

DTENSOR_TEST_F(ConverterThreaded, NamesTensorsByStackPosition) {
  DeviceMesh mesh = build_device_mesh();
  c10::List<c10::optional<at::Tensor>> indices;
  indices.push_back(values({8}));
  indices.push_back(c10::nullopt);
  indices.push_back(values({8}));
  const std::vector<IValue> args = {
      IValue(c10::List<at::Tensor>({values({8, 8}), values({3})})),  // TensorList
      IValue(2),
      IValue(),                                                     // absent Tensor?
      IValue(indices),                                              // List<Tensor?>
      IValue(values({8, 8})),
  };
  DTensorConverter converter(mesh, args);
  ASSERT_EQ(converter.num_tensors(), 5);
  const std::vector<std::string> names = {"arg0[0]", "arg0[1]", "arg3[0]", "arg3[2]", "arg4"};
  for (int64_t i = 0; i < 5; ++i) EXPECT_EQ(converter.tensor_name(i), names[i]);
  EXPECT_EQ(converter.num_combinations(), 3 * 1 * 2 * 2 * 3);
  EXPECT_PRED2(contains, error_of([&] { converter.tensor_name(5); }), "tensor 5 out of range");
}

DTENSOR_TEST_F(ConverterThreaded, DescribesCombinationsInProductOrder) {
  DeviceMesh mesh = build_device_mesh();
  DTensorConverter converter(mesh, {values({8, 8}), IValue(1), values({8, 8})}, kPartial);
  ASSERT_EQ(converter.num_combinations(), 16);
  EXPECT_EQ(converter.current_placements_string(), "");
  EXPECT_EQ(converter.combination_string(0), "arg0=Replicate(), arg2=Replicate()");
  EXPECT_EQ(converter.combination_string(1), "arg0=Replicate(), arg2=Shard(dim=0)");
  EXPECT_EQ(converter.combination_string(4), "arg0=Shard(dim=0), arg2=Replicate()");
  EXPECT_EQ(converter.combination_string(15), "arg0=Partial(sum), arg2=Partial(sum)");
  EXPECT_EQ(converter.combination(6), (std::vector<Placements>{{Shard{0}}, {Shard{1}}}));
  EXPECT_PRED2(contains, error_of([&] { converter.combination(16); }),
               "index 16 out of range [0, 16)");

  DeviceMesh mesh2 = init_device_mesh(device_type(), mesh_shape_2d());
  DTensorConverter per_dim(mesh2, {values({8, 8})}, kMesh2d);
  EXPECT_EQ(per_dim.combination_string(1), "arg0=(Replicate(), Shard(dim=0))");
  DTensorConverter flat(mesh2, {values({8, 8})});
  EXPECT_EQ(flat.combination_string(2), "arg0=(Shard(dim=1), Shard(dim=1))");

  DTensorConverter none(mesh, {IValue(1)});
  EXPECT_EQ(none.combination_string(0), "");
}

DTENSOR_TEST_F(ConverterThreaded, UnsupportedTensorIsAMiss) {
  DeviceMesh mesh = build_device_mesh();
  const at::Tensor sparse = values({8, 4}).to_sparse();
  DTensorConverter converter(mesh, {sparse, IValue(1)});
  EXPECT_EQ(converter.num_combinations(), 1);  // replicate only
  std::vector<IValue> converted;
  ASSERT_TRUE(converter.next(converted));  // yielded, with the tensor left plain
  ASSERT_EQ(converted.size(), 2u);
  EXPECT_TRUE(converted[0].toTensor().is_same(sparse));
  EXPECT_EQ(converted[1].toInt(), 1);
  EXPECT_EQ(converter.current_placements_string(), "arg0=Replicate()");
  EXPECT_FALSE(converter.next(converted));
  EXPECT_EQ(converter.hits(), 0);
  EXPECT_EQ(converter.misses(), 1);
  EXPECT_FALSE(converter.successful());
  ASSERT_EQ(converter.errors().size(), 1u);
  EXPECT_PRED2(contains, converter.errors()[0], "arg0=Replicate(): arg0 left plain");
  EXPECT_FALSE(testing::is_supported_tensor(sparse));
  EXPECT_FALSE(testing::is_supported_tensor(values({2})._neg_view()));
  EXPECT_TRUE(testing::is_supported_tensor(values({2})));
}

// ---- Conversion (runs distribute_tensor / from_local) ---------------------------------

// Iterates `converter` to the end, checking every combination: each tensor became a DTensor
// with the combination's placements, the same requires_grad, and gathers back to the
// original; other values are untouched. Returns the number of combinations produced.
int64_t check_conversions(DTensorConverter& converter, const std::vector<IValue>& args) {
  const std::vector<at::Tensor> originals = testing::detail::flatten_tensors(args);
  std::vector<IValue> converted;
  int64_t index = 0;
  while (converter.next(converted)) {
    SCOPED_TRACE(converter.current_placements_string());
    EXPECT_EQ(converter.current_placements_string(), converter.combination_string(index));
    const std::vector<Placements> expected = converter.combination(index);
    const std::vector<at::Tensor> tensors = testing::detail::flatten_tensors(converted);
    EXPECT_EQ(converted.size(), args.size());
    if (tensors.size() != originals.size()) {
      ADD_FAILURE() << "converted stack holds " << tensors.size() << " tensors, expected "
                    << originals.size();
      return index + 1;
    }
    for (size_t i = 0; i < tensors.size(); ++i) {
      SCOPED_TRACE(converter.tensor_name(static_cast<int64_t>(i)));
      if (!is_dtensor(tensors[i])) {
        ADD_FAILURE() << "not converted";
        continue;
      }
      EXPECT_EQ(get_spec(tensors[i]).placements, expected[i]);
      EXPECT_EQ(tensors[i].requires_grad(), originals[i].requires_grad());
      EXPECT_TRUE(testing::tensors_close(originals[i], full_tensor(tensors[i])));
    }
    for (size_t k = 0; k < args.size(); ++k) {
      if (!args[k].isTensor() && !args[k].isList()) {
        EXPECT_TRUE(converted[k] == args[k]) << "argument " << k;
      }
    }
    ++index;
  }
  EXPECT_EQ(converter.hits(), index);
  EXPECT_EQ(converter.misses(), 0) << ::testing::PrintToString(converter.errors());
  EXPECT_TRUE(converter.successful());
  return index;
}

DTENSOR_TEST_F(ConverterThreaded, ConvertsEveryCombination) {
  DeviceMesh mesh = build_device_mesh();
  const std::vector<IValue> args = {values({8, 8}).requires_grad_(true), IValue(2),
                                    values({8, 8}, 1.0)};
  DTensorConverter converter(mesh, args);
  EXPECT_EQ(check_conversions(converter, args), 9);
  EXPECT_EQ(converter.current_placements_string(), "arg0=Shard(dim=1), arg2=Shard(dim=1)");
}

DTENSOR_TEST_F(ConverterThreaded, ConvertsBoolZeroDimAndLists) {
  DeviceMesh mesh = build_device_mesh();
  const std::vector<IValue> args = {
      IValue(at::ones({8, 8}, at::kBool)),
      IValue(at::scalar_tensor(3.0)),
      IValue(c10::List<at::Tensor>({values({8, 8}), values({8})})),
  };
  DTensorConverter converter(mesh, args);
  EXPECT_EQ(check_conversions(converter, args), 3 * 1 * 3 * 2);
  std::vector<IValue> converted;
  DTensorConverter again(mesh, args);
  ASSERT_TRUE(again.next(converted));
  EXPECT_TRUE(converted[2].isTensorList());  // still a Tensor[] for the schema
}

DTENSOR_TEST_F(ConverterThreaded, PartialHoldsValuesOnCoordinateZero) {
  DeviceMesh mesh = build_device_mesh();
  const at::Tensor x = values({8, 8});
  const std::vector<IValue> args = {x};
  DTensorConverter converter(mesh, args, kPartial);
  EXPECT_EQ(check_conversions(converter, args), 4);

  DTensorConverter partial_only(mesh, args, kPartial);
  std::vector<IValue> converted;
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(partial_only.next(converted));
  ASSERT_EQ(partial_only.current_placements_string(), "arg0=Partial(sum)");
  const at::Tensor local = local_tensor(converted[0].toTensor());
  EXPECT_TRUE(at::equal(local, rank() == 0 ? x : at::zeros_like(x)));
}

DTENSOR_TEST_F(ConverterThreaded, ConvertsUnevenShards) {
  DeviceMesh mesh = build_device_mesh();
  const std::vector<IValue> args = {values({6, 5}), values({2, 4}, 0.5)};
  DTensorConverter converter(mesh, args, with(false, true, true));
  EXPECT_EQ(check_conversions(converter, args), 4 * 4);
}

DTENSOR_TEST_F(ConverterThreaded, ConvertsPerMeshDimOn2dMesh) {
  DeviceMesh mesh = init_device_mesh(device_type(), mesh_shape_2d());
  const std::vector<IValue> args = {values({8, 8}).requires_grad_(true)};
  DTensorConverter converter(mesh, args, with(true, true, false));
  EXPECT_EQ(check_conversions(converter, args), 16);
}

// ---- tensors_close ----------------------------------------------------------------------

TEST(TensorsClose, NamesWhatDiffers) {
  const at::Tensor x = values({2, 3});
  EXPECT_TRUE(testing::tensors_close(x, x.clone()));
  EXPECT_TRUE(testing::tensors_close(x, x + 1e-7f));
  struct Case {
    std::string what;
    at::Tensor actual;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"shape", values({3, 2}), "shape [3, 2] differs from the expected [2, 3]"},
      {"dtype", x.to(at::kDouble), "dtype Double differs from the expected Float"},
      {"values", x + 0.5f, "values differ: max abs diff 0.5"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    const ::testing::AssertionResult r = testing::tensors_close(x, c.actual);
    EXPECT_FALSE(r);
    EXPECT_PRED2(contains, r.message(), c.message);
  }
  // NaN equals NaN (as PyTorch's assertEqual); integers must be exact.
  const at::Tensor nan = at::full({2}, std::nan(""));
  EXPECT_TRUE(testing::tensors_close(nan, nan.clone()));
  EXPECT_FALSE(testing::tensors_close(at::arange(4), at::arange(4) + 1, 1.0, 1.0));
}

// ---- test_op, as processes and as threads ----------------------------------------------

class TestOpGloo : public testing::DTensorTestBase {
 protected:
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(240); }
};
class TestOpThreaded : public testing::DTensorOpTestBase {
 protected:
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(120); }
};

// Defines the body once and a test for each fixture; the body gets the 1-D mesh.
#define TEST_OP_TEST(name)                                                             \
  void name##_body(const DeviceMesh& mesh);                                            \
  DTENSOR_TEST_F(TestOpGloo, name) { name##_body(build_device_mesh()); }              \
  DTENSOR_TEST_F(TestOpThreaded, name) { name##_body(build_device_mesh()); }          \
  void name##_body(const DeviceMesh& mesh)

TEST_OP_TEST(Add) {
  testing::test_op(mesh, "aten::add", "Tensor", {values({8, 4}), values({8, 4}, 1.0), IValue(1)});
  // Broadcasting: [8, 4] + [4].
  testing::test_op(mesh, "aten::add", "Tensor", {values({8, 4}), values({4}, 2.0), IValue(2)});
}

TEST_OP_TEST(Mul) {
  testing::test_op(mesh, "aten::mul", "Tensor", {values({8, 4}), values({8, 4}, 1.0)});
}

TEST_OP_TEST(Mm) {
  testing::test_op(mesh, "aten::mm", "", {values({8, 4}), values({4, 8}, 1.0)});
}

TEST_OP_TEST(Sum) {
  testing::test_op(mesh, "aten::sum", "", {values({8, 4}), IValue()});
  testing::test_op(mesh, "aten::sum", "dim_IntList",
                   {values({8, 4}), IValue(std::vector<int64_t>{0}), IValue(false), IValue()});
}

TEST_OP_TEST(FunctionOp) {
  testing::TestOpOptions options;
  options.op_name = "scale_and_shift";
  testing::test_op(
      mesh, [](const std::vector<IValue>& a) { return a[0].toTensor() * 2 + a[1].toTensor(); },
      {values({8, 4}), values({8, 4}, 1.0)}, options);
}

TEST_OP_TEST(AddWithPartialAndUnevenShards) {
  testing::TestOpOptions options;
  options.converter = with(false, true, true);
  testing::test_op(mesh, "aten::add", "Tensor", {values({6, 4}), values({6, 4}, 1.0), IValue(1)},
                   options);
}

// The fixtures' own members forward to the free functions.
DTENSOR_TEST_F(TestOpThreaded, FixtureMembersAndUnknownOp) {
  DeviceMesh mesh = build_device_mesh();
  EXPECT_EQ(mesh.ndim(), 1);
  EXPECT_EQ(mesh.size(), group().size());
  EXPECT_EQ(mesh.device_type(), device_type());
  test_op(mesh, "aten::mul", "Tensor", {values({8, 4}), values({8, 4}, 1.0)});
  EXPECT_PRED2(contains, error_of([&] { test_op(mesh, "aten::no_such_op", "", {}); }),
               "aten::no_such_op");
}

}  // namespace
}  // namespace dtensor
