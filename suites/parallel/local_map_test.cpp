// local_map (PyTorch's torch/distributed/tensor/experimental/_func_map.py), tested as PyTorch's
// test/distributed/tensor/experimental/test_local_map.py does: the mapped function's result
// against the single-device op, the declared placements of inputs, outputs and gradients, and the
// errors for inputs whose placements do not match.
#include "dtensor/experimental/local_map.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>

namespace dtensor {
namespace {

using experimental::local_map;
using experimental::LocalMapOptions;
using testing::contains;
using testing::error_of;
using testing::values;

class LocalMap : public testing::DTensorOpTestBase {};

std::vector<at::Tensor> local_mm(const std::vector<at::Tensor>& in) { return {at::mm(in[0], in[1])}; }

// test_local_map_correctness: X column-wise and W row-wise give a Partial product.
DTENSOR_TEST_F(LocalMap, ColumnTimesRowShardsGiveAPartialProduct) {
  auto mesh = build_device_mesh();
  const int64_t n = ranks();
  const at::Tensor x = values({4, 2 * n}), w = values({2 * n, 3}, 1.0);
  LocalMapOptions o;
  o.in_placements = {{{Shard{1}}}, {{Shard{0}}}};
  auto mm = local_map(local_mm, {{{Partial{}}}}, o);
  const at::Tensor xd = distribute_tensor(x, mesh, {Shard{1}}), wd = distribute_tensor(w, mesh, {Shard{0}});
  const at::Tensor y = mm({xd, wd})[0];
  ASSERT_TRUE(is_dtensor(y));
  EXPECT_EQ(get_spec(y).placements, std::vector<Placement>{Partial{}});
  EXPECT_TRUE(at::allclose(full_tensor(y), at::mm(x, w)));
}

// test_local_map_out_placements: a Replicate output, and an output left as it is.
DTENSOR_TEST_F(LocalMap, OutputsTakeTheirDeclaredPlacementsOrStayPlain) {
  auto mesh = build_device_mesh();
  const at::Tensor x = values({2 * ranks(), 3});
  auto f = local_map(
      [](const std::vector<at::Tensor>& in) {
        return std::vector<at::Tensor>{in[0] * 2, at::tensor({in[0].size(0)})};
      },
      {{{Shard{0}}}, std::nullopt});
  const auto out = f({distribute_tensor(x, mesh, {Shard{0}})});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_TRUE(at::equal(full_tensor(out[0]), x * 2));
  EXPECT_FALSE(is_dtensor(out[1]));
  EXPECT_EQ(out[1].item<int64_t>(), 2);  // the local shard's rows
}

// Without DTensor inputs the function runs on the plain tensors and returns plain outputs.
DTENSOR_TEST_F(LocalMap, PlainInputsGivePlainOutputs) {
  auto f = local_map(local_mm, {{{Partial{}}}});
  const at::Tensor x = values({3, 4}), w = values({4, 2});
  const at::Tensor y = f({x, w})[0];
  EXPECT_FALSE(is_dtensor(y));
  EXPECT_TRUE(at::equal(y, at::mm(x, w)));
}

// test_local_map_redistribute: a mismatched input is an error, or is redistributed when asked.
DTENSOR_TEST_F(LocalMap, MismatchedInputsAreRefusedOrRedistributed) {
  auto mesh = build_device_mesh();
  const int64_t n = ranks();
  const at::Tensor x = values({4, 2 * n}), w = values({2 * n, 3}, 1.0);
  LocalMapOptions o;
  o.in_placements = {{{Shard{1}}}, {{Shard{0}}}};
  const at::Tensor xr = distribute_tensor(x, mesh, {Replicate{}}), wd = distribute_tensor(w, mesh, {Shard{0}});
  const std::string e = error_of([&] { local_map(local_mm, {{{Partial{}}}}, o)({xr, wd}); });
  EXPECT_TRUE(contains(e, "input 0 has placements (Replicate(),) but in_placements expects (Shard(dim=1),)")) << e;
  EXPECT_TRUE(contains(e, "redistribute_inputs")) << e;
  o.redistribute_inputs = true;
  testing::CommCounter counting;
  auto cmesh = init_device_mesh(device_type(), {n}, {}, group_ptr());
  const at::Tensor xc = distribute_tensor(x, cmesh, {Replicate{}}), wc = distribute_tensor(w, cmesh, {Shard{0}});
  counting.reset();
  const at::Tensor y = local_map(local_mm, {{{Partial{}}}}, o)({xc, wc})[0];
  EXPECT_EQ(counting.collectives(), 0) << "Replicate -> Shard is a local slice";
  EXPECT_TRUE(at::allclose(full_tensor(y), at::mm(x, w)));
}

DTENSOR_TEST_F(LocalMap, DeclarationsThatDoNotFitAreErrors) {
  auto mesh = build_device_mesh();
  const at::Tensor xd = distribute_tensor(values({ranks(), 2}), mesh, {Shard{0}});
  LocalMapOptions o;
  o.in_placements = {{{Shard{0}}}, {{Replicate{}}}};
  auto two = [](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{in[0] + in[1]}; };
  // A plain tensor declared as a DTensor.
  std::string e = error_of([&] { local_map(two, {{{Shard{0}}}}, o)({xd, at::ones({1, 2})}); });
  EXPECT_TRUE(contains(e, "input 1 is not a DTensor but in_placements gives it the placements")) << e;
  // A DTensor declared plain.
  o.in_placements = {{{Shard{0}}}, std::nullopt};
  e = error_of([&] { local_map(two, {{{Shard{0}}}}, o)({xd, xd}); });
  EXPECT_TRUE(contains(e, "input 1 is a DTensor (Shard(dim=0),) but in_placements gives it None")) << e;
  // Counts that do not match.
  o.in_placements = {{{Shard{0}}}};
  e = error_of([&] { local_map(two, {{{Shard{0}}}}, o)({xd, xd}); });
  EXPECT_TRUE(contains(e, "in_placements has 1 entries for 2 inputs")) << e;
  e = error_of([&] { local_map(two, {{{Shard{0}}}, {{Shard{0}}}})({xd, xd}); });
  EXPECT_TRUE(contains(e, "out_placements has 2 entries but the function returned 1 outputs")) << e;
  // A function returning a DTensor.
  e = error_of([&] {
    local_map([&](const std::vector<at::Tensor>&) { return std::vector<at::Tensor>{xd}; }, {{{Shard{0}}}})({xd});
  });
  EXPECT_TRUE(contains(e, "output 0 is a DTensor")) << e;
}

// in_grad_placements: the gradient of a Shard(1) input declared Shard(1) is laid out so, and
// equals the single-device gradient.
DTENSOR_TEST_F(LocalMap, GradientsFlowWithTheirDeclaredPlacements) {
  auto mesh = build_device_mesh();
  const int64_t n = ranks();
  const at::Tensor x = values({4, 2 * n}), w = values({2 * n, 3}, 1.0);
  LocalMapOptions o;
  o.in_placements = {{{Shard{1}}}, {{Shard{0}}}};
  o.in_grad_placements = {{{Shard{1}}}, {{Shard{0}}}};
  const at::Tensor xd = distribute_tensor(x, mesh, {Shard{1}}).detach().requires_grad_(true);
  const at::Tensor wd = distribute_tensor(w, mesh, {Shard{0}}).detach().requires_grad_(true);
  const at::Tensor y = local_map(local_mm, {{{Partial{}}}}, o)({xd, wd})[0];
  redistribute(y, mesh, {Replicate{}}).sum().backward();
  const at::Tensor xr = x.clone().requires_grad_(true), wr = w.clone().requires_grad_(true);
  at::mm(xr, wr).sum().backward();
  ASSERT_TRUE(xd.grad().defined() && wd.grad().defined());
  EXPECT_EQ(get_spec(xd.grad()).placements, std::vector<Placement>{Shard{1}});
  EXPECT_TRUE(at::allclose(full_tensor(xd.grad()), xr.grad()));
  EXPECT_TRUE(at::allclose(full_tensor(wd.grad()), wr.grad()));
}

}  // namespace
}  // namespace dtensor
