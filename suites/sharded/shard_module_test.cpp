// dtensor/sharded: shard_parameter, shard_module with ShardingPlan (every error path of the
// seed), the output hooks, custom Sharders and planners, as 4 ranks (gloo processes and
// threads). A sharded MLPModule computes what the plain one does, forward and backward.
#include "dtensor/comm/comm.h"
#include "dtensor/nn/hooks.h"
#include "dtensor/sharded/sharded.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "models/mlp.h"
#include "suites/testing/errors.h"
#include "suites/testing/rank_modes.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>

#include <numeric>

namespace dtensor {
namespace {

using sharded::ChunkShardingSpec;
using sharded::RemoteDevice;
using sharded::ShardedTensor;
using sharded::ShardingPlan;
using testing::contains;
using testing::error_of;

std::shared_ptr<const ChunkShardingSpec> chunk(int64_t dim, std::vector<int> ranks = {0, 1, 2, 3}) {
  std::vector<RemoteDevice> placements;
  for (int r : ranks) placements.emplace_back("rank:" + std::to_string(r) + "/cpu");
  return std::make_shared<ChunkShardingSpec>(dim, placements);
}

// The same input on every rank.
at::Tensor input() { return at::arange(80, at::kFloat).view({8, 10}) / 40.0 - 1.0; }

// NOTE: [Written for 4 ranks]
// Like PyTorch's ShardedTensor suites (world_size 4), the tests across ranks below spell out
// their sharding specs (rank:0/cpu .. rank:3/cpu), the shard each rank holds and the rank that
// plays each part (the source, the one that errs); they declare DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4)
// and skip, with that reason, at other world sizes.
DTENSOR_RANK_FIXTURES(ShardModuleGloo, ShardModuleThreads);

// A Linear whose weight holds `value + row index` (so ranks can start with different values).
torch::nn::Linear linear_filled(double value) {
  torch::nn::Linear lin(10, 16);
  at::NoGradGuard g;
  lin->weight.copy_(at::arange(16, at::kFloat).unsqueeze(1).expand({16, 10}) + value);
  return lin;
}

// ---- shard_parameter --------------------------------------------------------------------------

DTENSOR_TEST_BOTH(ShardModuleGloo, ShardModuleThreads, ShardParameterPutsAShardedTensorInPlace) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  torch::nn::Linear lin = linear_filled(100 * r);  // rank 1 is the source
  sharded::shard_parameter(*lin, "weight", *chunk(0), /*src_rank=*/1);
  ASSERT_TRUE(is_dtensor(lin->weight));
  EXPECT_TRUE(lin->named_parameters()["weight"].is_same(lin->weight));  // registry and member agree
  EXPECT_TRUE(lin->weight.requires_grad());
  ShardedTensor st = ShardedTensor::from_dtensor(lin->weight);
  EXPECT_EQ(*st.sharding_spec(), *chunk(0));
  EXPECT_TRUE(at::equal(st.local_tensor(), linear_filled(100)->weight.narrow(0, 4 * r, 4)));
  EXPECT_TRUE(at::equal(full_tensor(lin->weight), linear_filled(100)->weight));
  EXPECT_FALSE(is_dtensor(lin->bias));  // the other parameters stay as they were
}

struct ScaleImpl : torch::nn::Module {
  at::Tensor w;
  ScaleImpl() { w = register_parameter("w", at::ones({4})); }
  at::Tensor forward(const at::Tensor& x) { return x * w; }
};
TORCH_MODULE(Scale);

DTENSOR_TEST_BOTH(ShardModuleGloo, ShardModuleThreads, ShardParameterErrorsReachEveryRank) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  torch::nn::Linear lin = linear_filled(0);
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_parameter(*lin, "biass", *chunk(0)); }),
               "shard_parameter: rank 0: torch::nn::LinearImpl has no attribute `biass`");
  torch::nn::BatchNorm1d bn(4);
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_parameter(*bn, "running_mean", *chunk(0)); }),
               "Expected torch::nn::BatchNorm1dImpl.running_mean to be a Tensor parameter, but found a buffer");
  Scale scale;
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_parameter(*scale, "w", *chunk(0)); }),
               "no member of dtensor::(anonymous namespace)::ScaleImpl is known to hold parameter 'w'");
  // A problem on one rank only still stops every rank before any data moves.
  if (r == 1) lin->weight.set_data(at::zeros({10, 16}).t());  // same shape, not contiguous
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_parameter(*lin, "weight", *chunk(0)); }),
               "param: weight is not a contiguous Tensor (on rank 1)");
  EXPECT_FALSE(is_dtensor(lin->weight));
  torch::nn::Linear fine = linear_filled(0);
  torch::nn::ReLU relu;
  EXPECT_PRED2(contains, error_of([&] {
                 sharded::shard_parameter(r == 2 ? static_cast<torch::nn::Module&>(*relu) : *fine, "weight", *chunk(0));
               }),
               "shard_parameter: rank 2: torch::nn::ReLUImpl has no attribute `weight`");
  sharded::shard_parameter(*fine, "weight", *chunk(1));
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_parameter(*fine, "weight", *chunk(1)); }),
               "param: weight of torch::nn::LinearImpl is a DTensor already");
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_parameter(*fine, "bias", *chunk(0, {0, 1})); }),
               "ShardedTensor.to_dtensor: needs a ChunkShardingSpec layout with one shard on each rank of the");
}

// ---- shard_module on MLPModule ------------------------------------------------------------------

ShardingPlan megatron_plan() {
  ShardingPlan plan;
  plan.plan = {{"net1.weight", chunk(0)}, {"net2.weight", chunk(1)}};
  return plan;
}

DTENSOR_TEST_BOTH(ShardModuleGloo, ShardModuleThreads, ShardModuleMLPMatchesThePlainModuleForwardAndBackward) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  models::MLPModule plain, mlp;
  sharded::shard_module(*mlp, megatron_plan());
  EXPECT_EQ(*ShardedTensor::from_dtensor(mlp->net1->weight).sharding_spec(), *chunk(0));
  EXPECT_EQ(*ShardedTensor::from_dtensor(mlp->net2->weight).sharding_spec(), *chunk(1));
  // The other parameters of the sharded modules became Replicate DTensors of their values.
  ASSERT_TRUE(is_dtensor(mlp->net1->bias));
  EXPECT_TRUE(get_spec(mlp->net1->bias).is_replicated());
  EXPECT_TRUE(at::equal(local_tensor(mlp->net2->bias), plain->net2->bias));

  at::Tensor x = input().requires_grad_();
  at::Tensor x_plain = input().requires_grad_();
  at::Tensor out = nn::call(mlp, x);  // net2's output: a partial sum (PyTorch's _PartialTensor)
  ASSERT_TRUE(is_dtensor(out));
  at::Tensor expected = nn::call(plain, x_plain);
  EXPECT_TRUE(testing::tensors_close(expected, full_tensor(out)));
  (full_tensor(out) * full_tensor(out)).sum().backward();
  (expected * expected).sum().backward();
  EXPECT_TRUE(testing::tensors_close(plain->net1->weight.grad(), full_tensor(mlp->net1->weight.grad())));
  EXPECT_TRUE(testing::tensors_close(plain->net2->weight.grad(), full_tensor(mlp->net2->weight.grad())));
  EXPECT_TRUE(testing::tensors_close(plain->net1->bias.grad(), full_tensor(mlp->net1->bias.grad())));
  EXPECT_TRUE(testing::tensors_close(x_plain.grad(), x.grad()));
}

DTENSOR_TEST_BOTH(ShardModuleGloo, ShardModuleThreads, ShardModuleOutputPlanAndLocalShards) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  models::MLPModule plain;
  const at::Tensor expected = nn::call(plain, input());
  // net2's output resharded to batch rows; the root returns this rank's rows.
  {
    models::MLPModule mlp;
    ShardingPlan plan = megatron_plan();
    plan.output_plan = {{{"net2", chunk(0)}}};
    plan.return_local_tensor = {{""}};
    sharded::shard_module(*mlp, plan);
    at::Tensor out = nn::call(mlp, input());
    ASSERT_FALSE(is_dtensor(out));
    EXPECT_TRUE(testing::tensors_close(expected.narrow(0, 2 * r, 2), out));
  }
  // The same on the root, in another rank order (no grad: that order is not differentiable).
  {
    models::MLPModule mlp;
    ShardingPlan plan = megatron_plan();
    plan.output_plan = {{{"", chunk(0, {3, 2, 1, 0})}}};
    plan.return_local_tensor = {{""}};
    sharded::shard_module(*mlp, plan);
    at::NoGradGuard no_grad;
    at::Tensor out = nn::call(mlp, input());
    EXPECT_TRUE(testing::tensors_close(expected.narrow(0, 2 * (3 - r), 2), out));
    EXPECT_TRUE(testing::tensors_close(expected.narrow(0, 2 * (3 - r), 2), nn::call(mlp, input())));  // cached mesh
  }
  // One row per rank: the local shard loses its dim (PyTorch squeezes a size-1 shard dim).
  {
    models::MLPModule mlp;
    ShardingPlan plan = megatron_plan();
    plan.output_plan = {{{"net2", chunk(0)}}};
    plan.return_local_tensor = {{"net2"}};
    sharded::shard_module(*mlp, plan);
    at::Tensor out = nn::call(mlp, input().narrow(0, 0, 4));
    EXPECT_EQ(out.sizes(), c10::IntArrayRef({10}));
    EXPECT_TRUE(testing::tensors_close(expected[r], out));
  }
}

DTENSOR_TEST_BOTH(ShardModuleGloo, ShardModuleThreads, ShardModuleEveryParameterWithAPlanner) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  // PyTorch's ChunkAllShardingPlanner: every parameter chunked on dim 0.
  struct ChunkAll : sharded::ShardingPlanner {
    ShardingPlan build_plan(torch::nn::Module& module) override {
      ShardingPlan plan;
      for (const auto& kv : module.named_parameters()) plan.plan.emplace_back(kv.key(), chunk(0));
      return plan;
    }
  };
  models::MLPModule plain, mlp;
  ChunkAll planner;
  sharded::shard_module(*mlp, planner.build_plan(*mlp));
  for (const auto& kv : mlp->named_parameters()) {
    SCOPED_TRACE(kv.key());
    ASSERT_TRUE(is_dtensor(kv.value()));
    EXPECT_EQ(*ShardedTensor::from_dtensor(kv.value()).sharding_spec(), *chunk(0));
  }
  EXPECT_TRUE(testing::tensors_close(nn::call(plain, input()), full_tensor(nn::call(mlp, input()))));
}

DTENSOR_TEST_BOTH(ShardModuleGloo, ShardModuleThreads, ShardModuleOnASubProcessGroup) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  comm::GroupPtr pair = comm::new_group({2, 3});
  if (!pair) return;  // ranks 0 and 1 take no part, as in PyTorch's test
  models::MLPModule plain, mlp;
  ShardingPlan plan;
  plan.plan = {{"net1.weight", chunk(0, {2, 3})}, {"net2.weight", chunk(1, {2, 3})}};
  sharded::shard_module(*mlp, plan, /*src_rank=*/0, pair);
  ShardedTensor w1 = ShardedTensor::from_dtensor(mlp->net1->weight);
  EXPECT_EQ(*w1.sharding_spec(), *chunk(0, {2, 3}));
  EXPECT_EQ(w1.process_group().get(), pair.get());
  EXPECT_TRUE(at::equal(w1.local_tensor(), plain->net1->weight.narrow(0, 8 * (r - 2), 8)));
  EXPECT_TRUE(testing::tensors_close(nn::call(plain, input()), full_tensor(nn::call(mlp, input()))));
}

// ---- plan errors (PyTorch's _shard/api.py ones, and the cross-rank ones) -------------------------------------------------

// A Sharder that wraps the module in a Sequential-like holder, or changes it in place.
struct WrapSharder : sharded::Sharder {
  bool in_place = false;
  std::shared_ptr<torch::nn::Module> seen;
  std::shared_ptr<torch::nn::Module> shard(const std::shared_ptr<torch::nn::Module>& module) override {
    seen = module;
    if (in_place) return module;
    auto wrapper = std::make_shared<torch::nn::Module>("ShardedWrapper");
    wrapper->register_module("inner", module);
    return wrapper;
  }
};

DTENSOR_TEST_BOTH(ShardModuleGloo, ShardModuleThreads, ShardModulePlanErrorsReachEveryRankBeforeAnythingMoves) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  const int r = t.rank();
  models::MLPModule mlp;
  auto shard = [&](const ShardingPlan& plan) { return error_of([&] { sharded::shard_module(*mlp, plan); }); };
  ShardingPlan wrong_plan;
  wrong_plan.plan = {{"net1.weight", std::shared_ptr<const sharded::ShardingSpec>()}};
  EXPECT_PRED2(contains, shard(wrong_plan), "Only `ShardingSpec` and `Sharder` are supported to shard 'net1.weight'");
  ShardingPlan wrong_output = megatron_plan();
  wrong_output.output_plan = {{{"", nullptr}}};
  EXPECT_PRED2(contains, shard(wrong_output), "Only `ShardingSpec` is supported as output_plan for ''");
  ShardingPlan wrong_module;
  wrong_module.plan = {{"net3.weight", chunk(1)}};
  EXPECT_PRED2(contains, shard(wrong_module), "dtensor::models::MLPModuleImpl has no attribute `net3`");
  ShardingPlan wrong_param;
  wrong_param.plan = {{"net1.biass", chunk(1)}};
  EXPECT_PRED2(contains, shard(wrong_param), "torch::nn::LinearImpl has no attribute `biass`");
  ShardingPlan conflict;
  conflict.plan = {{"net1", std::make_shared<WrapSharder>()}, {"net1.weight", chunk(0)}};
  EXPECT_PRED2(contains, shard(conflict),
               "ShardingPlan is in-valid, trying to shard a parameter: net1.weight, but there's already a Sharder "
               "entry for module net1, parameter sharding should not conflict with the submodule tree that a Sharder "
               "is working with!");
  ShardingPlan root_sharder;
  root_sharder.plan = {{"", std::make_shared<WrapSharder>()}};
  EXPECT_PRED2(contains, shard(root_sharder), "Module path must not be empty for custom sharder!");
  ShardingPlan twice;
  twice.plan = {{"net1.weight", chunk(0)}, {"net1.weight", chunk(1)}};
  EXPECT_PRED2(contains, shard(twice), "ShardingPlan has 'net1.weight' twice");
  ShardingPlan bad_local = megatron_plan();
  bad_local.return_local_tensor = {{"net1.relu"}};
  EXPECT_PRED2(contains, shard(bad_local), "torch::nn::LinearImpl has no attribute `relu`");
  // Plans that differ across ranks, or a problem on one rank only: every rank raises.
  ShardingPlan mine = megatron_plan();
  if (r == 3) mine.plan[1].second = chunk(0);
  EXPECT_PRED2(contains, shard(mine), "shard_module: the plan of rank 3 differs from the plan of rank 0");
  ShardingPlan one_bad = megatron_plan();
  if (r == 1) one_bad.plan.emplace_back("net2.bias2", chunk(0));
  EXPECT_PRED2(contains, shard(one_bad), "shard_module: rank 1: torch::nn::LinearImpl has no attribute `bias2`");
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_module(*mlp, megatron_plan(), r == 2 ? 1 : 0); }),
               "shard_module: src_rank=1 on rank 2 does not match src_rank=0 on rank 0");
  // Nothing was sharded by the failed calls.
  for (const auto& kv : mlp->named_parameters()) EXPECT_FALSE(is_dtensor(kv.value())) << kv.key();
  EXPECT_EQ(nn::num_forward_hooks(*mlp), 0u);
}

DTENSOR_TEST_BOTH(ShardModuleGloo, ShardModuleThreads, ShardModuleRunsCustomSharders) {
  models::MLPModule mlp;
  std::shared_ptr<torch::nn::Module> old_net1 = mlp->named_children()["net1"];
  auto wrap = std::make_shared<WrapSharder>();
  auto in_place = std::make_shared<WrapSharder>();
  in_place->in_place = true;
  ShardingPlan plan;
  plan.plan = {{"net1", wrap}, {"net2", in_place}, {"relu", std::shared_ptr<sharded::Sharder>()}};
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_module(*mlp, plan); }),
               "Only `ShardingSpec` and `Sharder` are supported to shard 'relu'");
  plan.plan.pop_back();
  sharded::shard_module(*mlp, plan);
  EXPECT_EQ(wrap->seen.get(), old_net1.get());
  auto children = mlp->named_children();
  EXPECT_EQ(children["net1"]->name(), "ShardedWrapper");  // registered in place of the old one
  EXPECT_EQ(children["net1"]->named_children()["inner"].get(), old_net1.get());
  EXPECT_EQ(children["net2"].get(), mlp->net2.ptr().get());  // sharded in place: not replaced
  struct NullSharder : sharded::Sharder {
    std::shared_ptr<torch::nn::Module> shard(const std::shared_ptr<torch::nn::Module>&) override { return nullptr; }
  };
  ShardingPlan null_plan;
  null_plan.plan = {{"relu", std::make_shared<NullSharder>()}};
  EXPECT_PRED2(contains, error_of([&] { sharded::shard_module(*mlp, null_plan); }),
               "shard_module: the Sharder of 'relu' returned no module");
}

// ---- the hooks alone ----------------------------------------------------------------------------------

DTENSOR_TEST_BOTH(ShardModuleGloo, ShardModuleThreads, OutputHooksLeaveOtherOutputsAlone) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  torch::nn::Linear lin = linear_filled(0);
  auto h1 = sharded::reshard_output(*lin, chunk(0));
  auto h2 = sharded::collect_local_shard(*lin);
  at::Tensor plain = nn::call(lin, input());  // not a DTensor: both hooks pass it on
  EXPECT_FALSE(is_dtensor(plain));
  EXPECT_EQ(plain.sizes(), c10::IntArrayRef({8, 16}));
  h1.remove();
  h2.remove();
  EXPECT_PRED2(contains, error_of([&] { sharded::reshard_output(*lin, nullptr); }), "reshard_output: the spec is null");
  // A spec that does not place one shard on each rank of the output's mesh.
  models::MLPModule mlp;
  sharded::shard_module(*mlp, megatron_plan());
  sharded::reshard_output(*mlp->net2, chunk(0, {0, 1}));
  EXPECT_PRED2(contains, error_of([&] { nn::call(mlp, input()); }),
               "must place one shard on each rank of the output's DeviceMesh('cpu', [0, 1, 2, 3])");
}

// An output on a 2-D mesh must raise (it once passed through unchanged, silently).
DTENSOR_TEST_F(ShardModuleThreads, ReshardOutputOnA2DMeshRaises) {
  auto mesh = init_device_mesh(device_type(), {1, ranks()});
  torch::nn::Identity id;
  std::vector<int> all_ranks(static_cast<size_t>(ranks()));
  std::iota(all_ranks.begin(), all_ranks.end(), 0);
  sharded::reshard_output(*id, chunk(0, all_ranks));
  at::Tensor x = distribute_tensor(input(), mesh, {Shard{0}, Replicate{}});
  EXPECT_PRED2(contains, error_of([&] { nn::call(*id, x); }),
               "the output is a DTensor on the 2-D mesh " + mesh.to_string() + " with placements "
               "(Shard(dim=0), Replicate()), but ChunkShardingSpec");
}

DTENSOR_TEST_BOTH(ShardModuleGloo, ShardModuleThreads, ReshardOutputInAnotherOrderNeedsNoGrad) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE(4);  // NOTE: [Written for 4 ranks]
  models::MLPModule mlp;
  ShardingPlan plan = megatron_plan();
  plan.output_plan = {{{"net2", chunk(0, {1, 0, 3, 2})}}};
  sharded::shard_module(*mlp, plan);
  EXPECT_PRED2(contains, error_of([&] { nn::call(mlp, input()); }),
               "moves them as a ShardedTensor, which autograd cannot follow");
}

}  // namespace
}  // namespace dtensor
