// loss_parallel() (dtensor/parallel/loss.h, NOTE: [Loss parallel]), tested as PyTorch's
// test/distributed/tensor/parallel/test_tp_style.py / test_tp_examples.py loss-parallel cases:
// cross-entropy of logits sharded on the class dim equals the single-device loss, and so does
// the logits' gradient, for every reduction, with a class weight and an ignore_index, with a
// plain and a replicated target; the logits are never gathered (collectives counted); logits
// not sharded on the class dim are an error naming their placements.
#include "dtensor/parallel/loss.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>

namespace dtensor {
namespace {

namespace funcol = debug::c10d_functional;  // PyTorch's alias of the functional collectives

namespace F = torch::nn::functional;
using testing::contains;
using testing::error_of;
using testing::values;

class LossParallel : public testing::DTensorOpTestBase {};

// Targets of N rows over `classes` classes, a few of them ignore_index (-100).
at::Tensor targets(int64_t n, int64_t classes) {
  at::Tensor t = at::arange(n, at::kLong).mul(7).remainder(classes);
  t[1] = -100;
  return t;
}

DTENSOR_TEST_F(LossParallel, CrossEntropyAndGradientsEqualTheSingleDeviceOnes) {
  const int64_t n_rows = 6, classes = 3 * ranks() + 1;  // uneven class shards
  const at::Tensor logits = values({n_rows, classes}) * 0.3;
  const at::Tensor target = targets(n_rows, classes);
  const at::Tensor weight = at::linspace(0.5, 2.0, classes, at::kFloat);
  testing::CommCounter counting;
  auto mesh = init_device_mesh(device_type(), {ranks()}, {}, group_ptr());
  for (auto reduction : {0, 1, 2}) {
    for (bool with_weight : {false, true}) {
      for (bool dtensor_target : {false, true}) {
        F::CrossEntropyFuncOptions o;
        if (reduction == 0) o.reduction(torch::kNone);
        if (reduction == 1) o.reduction(torch::kMean);
        if (reduction == 2) o.reduction(torch::kSum);
        if (with_weight) o.weight(weight);
        const std::string what = "reduction " + std::to_string(reduction) + ", weight " +
                                 std::to_string(with_weight) + ", DTensor target " + std::to_string(dtensor_target);
        // The single-device reference.
        const at::Tensor ref_in = logits.clone().requires_grad_(true);
        const at::Tensor ref = F::cross_entropy(ref_in, target, o);
        ref.sum().backward();
        // Sharded on the class dim.
        const at::Tensor in = distribute_tensor(logits, mesh, {Shard{1}}).detach().requires_grad_(true);
        const at::Tensor t = dtensor_target ? distribute_tensor(target, mesh, {Replicate{}}) : target;
        counting.reset();
        at::Tensor loss;
        {
          auto guard = loss_parallel();
          loss = F::cross_entropy(in, t, o);
          ASSERT_TRUE(is_dtensor(loss)) << what;
          EXPECT_TRUE(get_spec(loss).is_replicated()) << what;
          loss.sum().backward();
        }
        const auto counts = counting.counts();
        EXPECT_EQ(counts.count(funcol::all_gather_into_tensor), 0u) << what;
        EXPECT_EQ(counting.collectives(), counts.at(funcol::all_reduce)) << what;
        // max, sum of exponentials, picked targets; the log_softmax backward's sum.
        EXPECT_EQ(counts.at(funcol::all_reduce), 4) << what;
        EXPECT_TRUE(at::allclose(full_tensor(loss), ref, 1e-5, 1e-6)) << what;
        ASSERT_TRUE(in.grad().defined()) << what;
        EXPECT_EQ(get_spec(in.grad()).placements, std::vector<Placement>{Shard{1}}) << what;
        EXPECT_TRUE(at::allclose(full_tensor(in.grad()), ref_in.grad(), 1e-5, 1e-6)) << what;
      }
    }
  }
}

// The same logits through the sharding rules (no scope): the loss is right, and the logits
// are gathered, which is what the scope avoids.
DTENSOR_TEST_F(LossParallel, WithoutTheScopeTheRulesGatherTheLogits) {
  const at::Tensor logits = values({4, 2 * ranks()});
  const at::Tensor target = at::arange(4, at::kLong).remainder(2 * ranks());
  testing::CommCounter counting;
  auto mesh = init_device_mesh(device_type(), {ranks()}, {}, group_ptr());
  const at::Tensor in = distribute_tensor(logits, mesh, {Shard{1}});
  counting.reset();
  const at::Tensor loss = F::cross_entropy(in, distribute_tensor(target, mesh, {Replicate{}}));
  EXPECT_TRUE(at::allclose(full_tensor(loss), F::cross_entropy(logits, target)));
  EXPECT_GT(counting.counts().count(funcol::all_gather_into_tensor), 0u);
}

DTENSOR_TEST_F(LossParallel, LogitsNotShardedOnTheClassDimAreAnError) {
  auto mesh = build_device_mesh();
  const at::Tensor target = at::zeros({2 * ranks()}, at::kLong);
  const at::Tensor rows = distribute_tensor(values({2 * ranks(), 3}), mesh, {Shard{0}});
  auto guard = loss_parallel();
  const std::string e = error_of([&] { F::cross_entropy(rows, target); });
  EXPECT_TRUE(contains(e, "loss_parallel: _log_softmax expects its input sharded on dim 1 (the class dim), but its "
                          "placements are (Shard(dim=0),)")) << e;
  const at::Tensor cols = distribute_tensor(values({2, 2 * ranks()}), mesh, {Shard{1}});
  const std::string bad = error_of([&] { F::cross_entropy(cols, at::full({2}, 2 * ranks() + 5, at::kLong)); });
  EXPECT_TRUE(contains(bad, "a target is out of bounds")) << bad;
}

}  // namespace
}  // namespace dtensor
