// The reference models on plain tensors: seeded MLPModule init, MLPStacked, RMSNorm, ModelArgs
// defaults, Attention / TransformerBlock against explicit computations, the Transformer's
// parameter names, weight tying, errors and activation checkpointing.
#include "dtensor/nn/nn.h"
#include "models/models.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

namespace dtensor {
namespace {

using models::ModelArgs;
using testing::contains;
using testing::error_of;
using testing::values;

TEST(MLPModule, SeededLikeLibtorchLinearsAfterManualSeed5) {
  at::manual_seed(models::kMLPSeed);
  torch::nn::Linear net1(10, 16), net2(16, 10);
  models::MLPModule mlp;
  EXPECT_TRUE(at::equal(mlp->net1->weight, net1->weight));
  EXPECT_TRUE(at::equal(mlp->net1->bias, net1->bias));
  EXPECT_TRUE(at::equal(mlp->net2->weight, net2->weight));
  EXPECT_TRUE(at::equal(mlp->net2->bias, net2->bias));
  models::MLPModule again;
  for (const auto& kv : mlp->named_parameters()) EXPECT_TRUE(at::equal(kv.value(), again->named_parameters()[kv.key()]));
}

TEST(MLPModule, ForwardBiasAndReset) {
  models::MLPModule mlp;
  const at::Tensor x = values({3, 10});
  const at::Tensor expected =
      at::linear(at::relu(at::linear(x, mlp->net1->weight, mlp->net1->bias)), mlp->net2->weight, mlp->net2->bias);
  EXPECT_TRUE(at::allclose(nn::call(mlp, x), expected));
  models::MLPModule no_bias(c10::Device(c10::kCPU), /*bias=*/false);
  EXPECT_EQ(no_bias->parameters().size(), 2u);
  EXPECT_FALSE(no_bias->net1->bias.defined());
  const at::Tensor before = mlp->net1->weight.clone();
  mlp->reset_parameters();
  EXPECT_FALSE(at::equal(before, mlp->net1->weight));
  EXPECT_LE(mlp->net1->weight.abs().max().item<float>(), 1 / std::sqrt(10.0f));
}

TEST(MLPStacked, RunsLayersInOrder) {
  models::MLPStacked stacked(c10::Device(c10::kCPU), 3);
  ASSERT_EQ(stacked->layers->size(), 3u);
  EXPECT_EQ(stacked->named_parameters().size(), 12u);
  EXPECT_TRUE(stacked->named_parameters().contains("layers.2.net2.bias"));
  const at::Tensor x = values({2, 10});
  at::Tensor expected = x;
  for (size_t i = 0; i < 3; ++i) expected = stacked->layers->ptr<models::MLPModuleImpl>(i)->forward(expected);
  EXPECT_TRUE(at::allclose(nn::call(stacked, x), expected));
  EXPECT_PRED2(contains, error_of([] { models::MLPStacked(c10::Device(c10::kCPU), -1); }),
               "MLPStacked: n_layers must be >= 0, got -1");
}

TEST(RMSNorm, NormalisesLastDimAndSwapsWeight) {
  models::RMSNorm norm(4, 1e-5);
  EXPECT_TRUE(at::equal(norm->weight, at::ones({4})));
  const at::Tensor x = values({2, 3, 4});
  const at::Tensor expected = x / (x.pow(2).mean({-1}, true) + 1e-5).sqrt();
  EXPECT_TRUE(at::allclose(nn::call(norm, x), expected, 1e-5, 1e-6));
  // The member is registered with dtensor::nn, so the weight can be swapped.
  nn::swap_parameter(*norm, "weight", values({4}, 1));
  EXPECT_TRUE(at::allclose(norm->forward(x), expected * values({4}, 1), 1e-5, 1e-6));
}

TEST(ModelArgs, SeedDefaults) {
  ModelArgs a;
  EXPECT_EQ(a.n_layers, 2);
  EXPECT_EQ(a.vocab_size, 8);
  EXPECT_EQ(a.max_seq_len, 16);
  EXPECT_EQ(a.dim, 16);
  EXPECT_EQ(a.n_heads, 4);
  EXPECT_DOUBLE_EQ(a.dropout_p, 0.1);
  EXPECT_TRUE(a.use_attn_mask);
  EXPECT_TRUE(a.weight_tying);
  EXPECT_FALSE(a.checkpoint_activations);
}

// Attention written out: projections, heads, softmax(q k^T / sqrt(d) + causal mask) v, wo.
at::Tensor explicit_attention(models::AttentionImpl& a, const at::Tensor& x, bool causal) {
  const int64_t b = x.size(0), s = x.size(1), h = a.n_heads, d = a.head_dim;
  auto heads = [&](const torch::nn::Linear& w) { return at::matmul(x, w->weight.t()).view({b, s, h, d}).transpose(1, 2); };
  at::Tensor scores = at::matmul(heads(a.wq), heads(a.wk).transpose(-2, -1)) / std::sqrt(static_cast<double>(d));
  if (causal) scores = scores.masked_fill(at::ones({s, s}, at::kBool).triu(1), -INFINITY);
  at::Tensor out = at::matmul(scores.softmax(-1), heads(a.wv)).transpose(1, 2).reshape({b, s, h * d});
  return at::matmul(out, a.wo->weight.t());
}

TEST(Attention, MatchesExplicitComputation) {
  at::manual_seed(1);
  for (bool causal : {true, false}) {
    ModelArgs args;
    args.use_attn_mask = causal;
    models::Attention attn(args);
    attn->eval();  // no dropout
    const at::Tensor x = values({2, 5, 16});
    EXPECT_TRUE(at::allclose(nn::call(attn, x), explicit_attention(*attn, x, causal), 1e-5, 1e-6)) << causal;
  }
  ModelArgs bad;
  bad.n_heads = 3;
  EXPECT_PRED2(contains, error_of([&] { models::Attention a(bad); }),
               "Attention: dim (16) must be a multiple of n_heads (3)");
}

TEST(TransformerBlock, MatchesExplicitComputation) {
  at::manual_seed(2);
  models::TransformerBlock block{ModelArgs()};
  block->eval();
  const at::Tensor x = values({2, 6, 16});
  auto ln = [](const torch::nn::LayerNorm& n, const at::Tensor& t) {
    return at::layer_norm(t, {16}, n->weight, n->bias, 1e-5);
  };
  const at::Tensor h = x + explicit_attention(*block->attention, ln(block->attention_norm, x), true);
  const auto& ff = block->feed_forward;
  const at::Tensor expected =
      h + at::linear(at::gelu(at::linear(ln(block->ffn_norm, h), ff->w1->weight, ff->w1->bias)), ff->w2->weight,
                     ff->w2->bias);
  EXPECT_TRUE(at::allclose(nn::call(block, x), expected, 1e-5, 1e-5));
}

TEST(Transformer, ParameterNamesFollowPyTorch) {
  ModelArgs args;
  args.n_layers = 1;
  args.weight_tying = false;
  models::Transformer model(args);
  std::vector<std::string> names;
  for (const auto& kv : nn::named_parameters(*model)) names.push_back(kv.first);
  const std::vector<std::string> expected = {
      "tok_embeddings.weight", "pos_embeddings.weight", "layers.0.attention_norm.weight",
      "layers.0.attention_norm.bias", "layers.0.attention.wq.weight", "layers.0.attention.wk.weight",
      "layers.0.attention.wv.weight", "layers.0.attention.wo.weight", "layers.0.ffn_norm.weight",
      "layers.0.ffn_norm.bias", "layers.0.feed_forward.w1.weight", "layers.0.feed_forward.w1.bias",
      "layers.0.feed_forward.w2.weight", "layers.0.feed_forward.w2.bias", "norm.weight", "norm.bias",
      "output.weight"};
  EXPECT_EQ(names, expected);
  EXPECT_EQ(model->named_parameters()["layers.0.feed_forward.w1.weight"].sizes(), (c10::IntArrayRef{64, 16}));
}

TEST(Transformer, WeightTyingSharesOneTensor) {
  models::Transformer tied{ModelArgs()};
  EXPECT_TRUE(tied->output->weight.is_same(tied->tok_embeddings->weight));
  EXPECT_TRUE(tied->named_parameters()["output.weight"].is_same(tied->tok_embeddings->weight));
  const size_t all = tied->named_parameters().size();
  EXPECT_EQ(nn::named_parameters(*tied).size(), all - 1);
  ModelArgs untied_args;
  untied_args.weight_tying = false;
  models::Transformer untied(untied_args);
  EXPECT_FALSE(untied->output->weight.is_same(untied->tok_embeddings->weight));
  EXPECT_EQ(nn::named_parameters(*untied).size(), untied->named_parameters().size());
}

TEST(Transformer, ForwardShapeDtypeAndErrors) {
  models::Transformer model{ModelArgs()};
  model->eval();
  const at::Tensor tokens = at::arange(12, at::kLong).remainder(8).view({2, 6});
  at::Tensor out = nn::call(model, tokens);
  EXPECT_EQ(out.sizes(), (c10::IntArrayRef{2, 6, 8}));
  EXPECT_EQ(out.scalar_type(), at::kFloat);
  EXPECT_PRED2(contains, error_of([&] { nn::call(model, at::zeros({2, 17}, at::kLong)); }),
               "Transformer: sequence length 17 exceeds max_seq_len 16");
  EXPECT_PRED2(contains, error_of([&] { nn::call(model, at::zeros({4}, at::kLong)); }),
               "Transformer: expected tokens of shape [batch, seq], got [4]");
}

TEST(Transformer, CheckpointActivationsGivesSameOutputAndGradients) {
  ModelArgs args;
  args.dropout_p = 0.0;
  models::Transformer plain(args);
  args.checkpoint_activations = true;
  models::Transformer ck(args);
  {
    at::NoGradGuard no_grad;
    auto src = plain->named_parameters();
    for (auto& kv : ck->named_parameters()) kv.value().copy_(src[kv.key()]);
  }
  const at::Tensor tokens = at::arange(10, at::kLong).remainder(8).view({2, 5});
  at::Tensor a = nn::call(plain, tokens), b = nn::call(ck, tokens);
  EXPECT_TRUE(at::allclose(a, b));
  a.pow(2).sum().backward();
  b.pow(2).sum().backward();
  auto ga = nn::named_parameters(*plain), gb = nn::named_parameters(*ck);
  ASSERT_EQ(ga.size(), gb.size());
  for (size_t i = 0; i < ga.size(); ++i)
    EXPECT_TRUE(at::allclose(ga[i].second.grad(), gb[i].second.grad(), 1e-5, 1e-6)) << ga[i].first;
}

}  // namespace
}  // namespace dtensor
