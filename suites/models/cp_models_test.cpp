// The reference Transformer under context parallel (NOTE: [Context parallel]), as PyTorch's
// test/distributed/tensor/test_context_parallel*.py and torchtitan train it: tokens, labels and
// positions sharded along the sequence over the ranks, causal attention by ring attention; the
// loss, the gradients and the parameters after SGD steps equal one rank's on the whole sequence.
// Then the 3-D layout of torchtitan: FSDP x TP x CP ((W/4) x 2 x 2: dp, cp, tp; 2x2x2 on 8
// ranks), FSDP over the flattened (dp, cp) dims.
#include "dtensor/experimental/context_parallel.h"
#include "dtensor/fsdp/fully_shard.h"
#include "dtensor/nn/nn.h"
#include "dtensor/parallel/parallel.h"
#include "harness/harness.h"
#include "models/models.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/training.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

namespace dtensor {
namespace {

using experimental::context_parallel;
using models::ModelArgs;
using models::Transformer;
namespace F = torch::nn::functional;

class ContextParallelModels : public testing::DTensorOpTestBase {};

constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

ModelArgs cp_args(int64_t seq) {
  ModelArgs args;
  args.dropout_p = 0.0;
  args.max_seq_len = seq;
  args.vocab_size = 11;
  return args;  // causal attention (use_attn_mask), tied output weights
}

at::Tensor tokens_of(int64_t batch, int64_t seq, int64_t vocab, int64_t salt) {
  return (at::arange(batch * seq, at::kLong) * (7 + salt) + salt).remainder(vocab).view({batch, seq});
}

at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& labels) {
  return F::cross_entropy(logits.flatten(0, 1), labels.flatten());
}

// The mean of `x` (a 0-dim plain tensor) over the ranks of `mesh`.
double mean_over(const DeviceMesh& mesh, const at::Tensor& x) {
  at::Tensor t = x.detach().clone();
  mesh.get_group()->all_reduce(t);
  return t.item<double>() / static_cast<double>(mesh.size());
}

// test_context_parallel's Transformer case: the model replicated on every rank, the sequence
// sharded (the ranks' gradients are averaged, as data parallel over the cp ranks would).
DTENSOR_TEST_F(ContextParallelModels, TransformerMatchesOneRankOverTheWholeSequence) {
  auto mesh = build_device_mesh();
  const int64_t w = ranks(), seq = 4 * w;
  const ModelArgs args = cp_args(seq);
  const at::Tensor tokens = tokens_of(2, seq, args.vocab_size, 0), labels = tokens_of(2, seq, args.vocab_size, 3);
  for (bool balance : {true, false}) {
    SCOPED_TRACE(balance ? "head-tail load balancer" : "contiguous shards");
    Transformer ref(args), model(args);
    testing::init_deterministic(*ref);
    testing::init_deterministic(*model);
    torch::optim::SGD opt_ref(nn::parameters(*ref), 0.5), opt(nn::parameters(*model), 0.5);
    for (int step = 0; step < 2; ++step) {
      const std::string when = "step " + std::to_string(step);
      opt_ref.zero_grad();
      opt.zero_grad();
      at::Tensor loss_ref = loss_of(ref->forward(tokens), labels);
      loss_ref.backward();
      at::Tensor t = tokens.clone(), l = labels.clone(), pos = at::arange(seq, at::kLong);
      experimental::ContextParallelOptions o;
      o.load_balance = balance;
      at::Tensor loss;
      {
        auto cp = context_parallel(mesh, {t, l, pos}, {1, 1, 0}, {}, o);
        ASSERT_EQ(t.size(1), seq / w);
        loss = loss_of(model->forward(t, pos), l);
        loss.backward();
      }
      EXPECT_NEAR(mean_over(mesh, loss), loss_ref.item<double>(), 1e-5) << when;
      auto r = nn::named_parameters(*ref), m = nn::named_parameters(*model);
      for (size_t i = 0; i < r.size(); ++i) {
        at::Tensor g = m[i].second.grad().clone();
        mesh.get_group()->all_reduce(g);
        g.div_(static_cast<double>(w));
        EXPECT_TRUE(testing::tensors_close(r[i].second.grad(), g, kRtol, kAtol)) << when << ": gradient of " << r[i].first;
        m[i].second.mutable_grad() = g;
      }
      opt_ref.step();
      opt.step();
    }
    auto r = nn::named_parameters(*ref), m = nn::named_parameters(*model);
    for (size_t i = 0; i < r.size(); ++i)
      EXPECT_TRUE(testing::tensors_close(r[i].second, m[i].second, kRtol, kAtol)) << "after 2 steps: " << r[i].first;
  }
}

// torchtitan's 3-D parallelism: TP on "tp", CP on "cp", FSDP over the flattened ("dp", "cp")
// dims (the cp ranks hold different tokens of the same rows, so their gradients are averaged
// with the dp ranks'). dp rank d trains on rows [2d, 2d + 2) of the global batch. The loss and
// every parameter after 2 SGD steps equal one rank's on the whole batch and sequence. Without
// `tp` the model is not parallelized (FSDP x CP); without `fsdp` the gradients are averaged over
// (dp, cp) by hand.
void check_3d(testing::MultiRankTest& t, bool tp, bool fsdp) {
  const int64_t dp = t.ranks() / 4, seq = 8;
  auto mesh = init_device_mesh(t.device_type(), {dp, 2, 2}, {"dp", "cp", "tp"}, t.group_ptr());
  const DeviceMesh dp_cp = mesh[{"dp", "cp"}]._flatten("dp_cp");
  const ModelArgs args = cp_args(seq);
  const at::Tensor tokens = tokens_of(2 * dp, seq, args.vocab_size, 0), labels = tokens_of(2 * dp, seq, args.vocab_size, 3);
  Transformer ref(args), model(args);
  testing::init_deterministic(*ref);
  testing::init_deterministic(*model);
  if (tp) Transformer::parallelize(model, mesh["tp"], Transformer::ParallelOptions{});
  if (fsdp) {
    fsdp::FullyShardOptions fo;
    fo.mesh = dp_cp;
    for (size_t i = 0; i < model->layers->size(); ++i) fsdp::fully_shard(*model->layers->ptr(i), fo);
    fsdp::fully_shard(model, fo);
  }
  torch::optim::SGD opt_ref(nn::parameters(*ref), 0.5), opt(nn::parameters(*model), 0.5);
  const int64_t d = mesh.get_local_rank("dp");
  for (int step = 0; step < 2; ++step) {
    const std::string when = "step " + std::to_string(step);
    opt_ref.zero_grad();
    opt.zero_grad();
    at::Tensor loss_ref = loss_of(ref->forward(tokens), labels);
    loss_ref.backward();
    at::Tensor tk = tokens.narrow(0, 2 * d, 2).clone(), l = labels.narrow(0, 2 * d, 2).clone();
    at::Tensor pos = at::arange(seq, at::kLong);
    at::Tensor loss;
    {
      auto cp = context_parallel(mesh["cp"], {tk, l, pos}, {1, 1, 0});
      loss = loss_of(nn::call(model, tk, pos), l);
      loss.backward();
    }
    EXPECT_NEAR(mean_over(dp_cp, loss), loss_ref.item<double>(), 1e-5) << when;
    if (!fsdp) {
      for (auto& p : nn::parameters(*model)) {
        at::Tensor g = is_dtensor(p.grad()) ? to_local(p.grad()).clone() : p.grad().clone();
        dp_cp.get_group()->all_reduce(g);
        g.div_(static_cast<double>(dp_cp.size()));
        if (is_dtensor(p.grad())) to_local(p.grad()).copy_(g);
        else p.mutable_grad() = g;
      }
    }
    opt_ref.step();
    opt.step();
  }
  auto r = nn::named_parameters(*ref), m = nn::named_parameters(*model);
  ASSERT_EQ(r.size(), m.size());
  for (size_t i = 0; i < r.size(); ++i)
    EXPECT_TRUE(testing::tensors_close(r[i].second.detach(), testing::gathered(m[i].second.detach()), kRtol, kAtol))
        << "after 2 steps: " << r[i].first;
}

DTENSOR_TEST_F(ContextParallelModels, FsdpTpCpTransformerTrainsAsOneRank) {
  DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(4);
  check_3d(*this, /*tp=*/true, /*fsdp=*/true);
}
DTENSOR_TEST_F(ContextParallelModels, FsdpCpTransformerTrainsAsOneRank) {
  DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(4);
  check_3d(*this, /*tp=*/false, /*fsdp=*/true);
}
DTENSOR_TEST_F(ContextParallelModels, TpCpTransformerTrainsAsOneRank) {
  DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(4);
  check_3d(*this, /*tp=*/true, /*fsdp=*/false);
}

}  // namespace
}  // namespace dtensor
