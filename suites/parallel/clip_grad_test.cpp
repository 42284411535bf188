// clip_grad_norm_ over DTensor gradients (dtensor/nn/clip_grad.h, NOTE: [Gradient norms of
// DTensors]): the total norm and the clipped gradients against libtorch's
// torch::nn::utils::clip_grad_norm_ on the same gradients unsharded, for the norms PyTorch's
// test_clip_grad_norm_ cases use (2, 1, infinity, 3), and the collectives counted: one per mesh
// dim, whatever the number of gradients.
#include "dtensor/nn/clip_grad.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <torch/nn/utils/clip_grad.h>

#include <limits>

namespace dtensor {
namespace {

using testing::contains;
using testing::error_of;
using testing::values;

class ClipGrad : public testing::DTensorOpTestBase {};

// Parameters with gradients `grads` (plain), and their copies laid out by `layout`.
struct Params {
  std::vector<at::Tensor> plain, sharded;
};

Params make_params(const std::vector<at::Tensor>& grads, const std::function<at::Tensor(const at::Tensor&, size_t)>& layout) {
  Params p;
  for (size_t i = 0; i < grads.size(); ++i) {
    at::Tensor a = at::zeros_like(grads[i]).requires_grad_(true);
    a.mutable_grad() = grads[i].clone();
    p.plain.push_back(a);
    at::Tensor b = layout(at::zeros_like(grads[i]), i).detach().requires_grad_(true);
    b.mutable_grad() = layout(grads[i], i);
    p.sharded.push_back(b);
  }
  return p;
}

std::vector<at::Tensor> some_grads(int64_t n) {
  return {values({2 * n, 3}) * 0.1, values({n, 4}, 1.0) * -0.2, values({3}, 2.0), values({4 * n}, 3.0) * 0.05};
}

DTENSOR_TEST_F(ClipGrad, ShardedGradientsClipAsTheUnshardedDo) {
  const int64_t n = ranks();
  for (double norm : {2.0, 1.0, std::numeric_limits<double>::infinity(), 3.0}) {
    for (double max_norm : {0.5, 1e6}) {  // clipping, and not
      testing::CommCounter counting;
      auto mesh = init_device_mesh(device_type(), {n}, {}, group_ptr());
      Params p = make_params(some_grads(n), [&](const at::Tensor& t, size_t i) {
        return distribute_tensor(t, mesh, {i == 2 ? Placement{Replicate{}} : Placement{Shard{0}}});
      });
      counting.reset();
      const at::Tensor total = nn::clip_grad_norm_(p.sharded, max_norm, norm);
      EXPECT_EQ(counting.collectives(), 1) << "one all-reduce for the one mesh dim, norm " << norm;
      const double expected = torch::nn::utils::clip_grad_norm_(p.plain, max_norm, norm);
      EXPECT_FALSE(is_dtensor(total));
      EXPECT_NEAR(total.item<double>(), expected, 1e-5 * std::max(1.0, expected)) << "norm " << norm;
      for (size_t i = 0; i < p.plain.size(); ++i)
        EXPECT_TRUE(at::allclose(full_tensor(p.sharded[i].grad()), p.plain[i].grad(), 1e-5, 1e-7))
            << "gradient " << i << ", norm " << norm << ", max_norm " << max_norm;
    }
  }
}

// FSDP x TP layouts: (Shard(0), Shard(1)), (Shard(0), Replicate) and a plain gradient on a
// 2-D mesh take one all-reduce per mesh dim.
DTENSOR_TEST_F(ClipGrad, TwoDimensionalLayoutsTakeOneReductionPerMeshDim) {
  const auto shape = mesh_shape_2d();
  testing::CommCounter counting;
  auto mesh = init_device_mesh(device_type(), shape, {"dp", "tp"}, group_ptr());
  const std::vector<at::Tensor> grads = {values({2 * shape[0], 2 * shape[1]}), values({3 * shape[0], 2}, 1.0) * 0.3,
                                         values({2, 2}, 2.0)};
  Params p = make_params(grads, [&](const at::Tensor& t, size_t i) {
    if (i == 0) return distribute_tensor(t, mesh, {Shard{0}, Shard{1}});
    if (i == 1) return distribute_tensor(t, mesh, {Shard{0}, Replicate{}});
    return t.clone();
  });
  counting.reset();
  const at::Tensor total = nn::clip_grad_norm_(p.sharded, 0.25);
  EXPECT_EQ(counting.collectives(), 2);
  const double expected = torch::nn::utils::clip_grad_norm_(p.plain, 0.25);
  EXPECT_NEAR(total.item<double>(), expected, 1e-5 * expected);
  for (size_t i = 0; i < grads.size(); ++i) {
    const at::Tensor g = p.sharded[i].grad();
    EXPECT_TRUE(at::allclose(is_dtensor(g) ? full_tensor(g) : g, p.plain[i].grad(), 1e-5, 1e-7)) << i;
  }
}

// A Partial gradient is reduced before its norm is taken.
DTENSOR_TEST_F(ClipGrad, PartialGradientsAreSummedFirst) {
  auto mesh = build_device_mesh();
  const at::Tensor full = values({4, 3});
  // Each rank holds full / n: their sum is `full`.
  at::Tensor g = from_local(full / static_cast<double>(ranks()), mesh, {Partial{}});
  const at::Tensor total = nn::get_total_norm({g});
  EXPECT_NEAR(total.item<double>(), full.norm().item<double>(), 1e-5);
}

DTENSOR_TEST_F(ClipGrad, NonFiniteNormsAndBadOrdersAreErrors) {
  auto mesh = build_device_mesh();
  at::Tensor g = values({2 * ranks(), 2});
  g[0][0] = std::numeric_limits<double>::quiet_NaN();
  const at::Tensor d = distribute_tensor(g, mesh, {Shard{0}});
  std::string e = error_of([&] { nn::get_total_norm({d}, 2.0, /*error_if_nonfinite=*/true); });
  EXPECT_TRUE(contains(e, "is non-finite, so it cannot be clipped")) << e;
  EXPECT_TRUE(std::isnan(nn::get_total_norm({d}).item<double>()));  // as PyTorch without the flag
  e = error_of([&] { nn::get_total_norm({d}, -1.0); });
  EXPECT_TRUE(contains(e, "norm_type must be positive or infinity, got -1")) << e;
  // No gradients: a zero norm, nothing to clip.
  at::Tensor p = at::ones({2}).requires_grad_(true);
  EXPECT_EQ(nn::clip_grad_norm_({p}, 1.0).item<double>(), 0.0);
}

}  // namespace
}  // namespace dtensor
