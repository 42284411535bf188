// models/transformer.cpp
#include "models/transformer.h"

#include "dtensor/nn/checkpoint.h"
#include "dtensor/nn/functional.h"
#include "dtensor/nn/hooks.h"
#include "dtensor/nn/module_surgery.h"
#include "dtensor/parallel/parallel.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace dtensor {
namespace models {

namespace {
torch::nn::Linear linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}
torch::nn::LayerNorm layer_norm(int64_t dim) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim}));
}
}  // namespace

AttentionImpl::AttentionImpl(const ModelArgs& args)
    : head_dim(args.dim / args.n_heads),
      n_heads(args.n_heads),
      dropout_p(args.dropout_p),
      use_attn_mask(args.use_attn_mask) {
  TORCH_CHECK(args.n_heads > 0 && args.dim % args.n_heads == 0, "Attention: dim (", args.dim,
              ") must be a multiple of n_heads (", args.n_heads, ")");
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(args.dropout_p));
  wq = register_module("wq", linear(args.dim, args.dim, false));
  wk = register_module("wk", linear(args.dim, args.dim, false));
  wv = register_module("wv", linear(args.dim, args.dim, false));
  wo = register_module("wo", linear(args.dim, args.dim, false));
}

at::Tensor AttentionImpl::forward(const at::Tensor& x) {
  const int64_t bsz = x.size(0), seq_len = x.size(1);
  // [bsz, seq, heads, head_dim] -> [bsz, heads, seq, head_dim]
  auto heads = [&](const at::Tensor& t) { return t.view({bsz, seq_len, n_heads, head_dim}).transpose(1, 2); };
  at::Tensor queries = heads(nn::call(wq, x)), keys = heads(nn::call(wk, x)), values = heads(nn::call(wv, x));
  at::Tensor output = nn::functional::scaled_dot_product_attention(queries, keys, values, {},
                                                                   is_training() ? dropout_p : 0.0, use_attn_mask);
  output = output.transpose(1, 2).contiguous().view({bsz, seq_len, -1});
  return nn::call(resid_dropout, nn::call(wo, output));
}

FeedForwardImpl::FeedForwardImpl(int64_t dim, int64_t hidden_dim, double dropout_p) {
  w1 = register_module("w1", linear(dim, hidden_dim, true));
  gelu = register_module("gelu", torch::nn::GELU());
  w2 = register_module("w2", linear(hidden_dim, dim, true));
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(dropout_p));
}

at::Tensor FeedForwardImpl::forward(const at::Tensor& x) {
  return nn::call(resid_dropout, nn::call(w2, nn::call(gelu, nn::call(w1, x))));
}

TransformerBlockImpl::TransformerBlockImpl(const ModelArgs& args) {
  attention_norm = register_module("attention_norm", layer_norm(args.dim));
  attention = register_module("attention", Attention(args));
  ffn_norm = register_module("ffn_norm", layer_norm(args.dim));
  feed_forward = register_module("feed_forward", FeedForward(args.dim, 4 * args.dim, args.dropout_p));
}

at::Tensor TransformerBlockImpl::forward(const at::Tensor& x) {
  at::Tensor h = x + nn::call(attention, nn::call(attention_norm, x));
  return h + nn::call(feed_forward, nn::call(ffn_norm, h));
}

TransformerImpl::TransformerImpl(const ModelArgs& args)
    : model_args(args), max_seq_len(args.max_seq_len), checkpoint_activations(args.checkpoint_activations) {
  TORCH_CHECK(args.vocab_size > 0 && args.max_seq_len > 0, "Transformer: vocab_size (", args.vocab_size,
              ") and max_seq_len (", args.max_seq_len, ") must be positive");
  tok_embeddings = register_module("tok_embeddings", torch::nn::Embedding(args.vocab_size, args.dim));
  pos_embeddings = register_module("pos_embeddings", torch::nn::Embedding(args.max_seq_len, args.dim));
  dropout = register_module("dropout", torch::nn::Dropout(args.dropout_p));
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < args.n_layers; ++i) layers->push_back(TransformerBlock(args));
  norm = register_module("norm", layer_norm(args.dim));
  output = register_module("output", linear(args.dim, args.vocab_size, false));
  if (args.weight_tying) nn::swap_parameter(*output, "weight", tok_embeddings->weight);
}

at::Tensor TransformerImpl::forward(const at::Tensor& tokens) {
  TORCH_CHECK(tokens.dim() == 2, "Transformer: expected tokens of shape [batch, seq], got ", tokens.sizes());
  return forward(tokens, at::arange(0, tokens.size(1), at::TensorOptions().dtype(at::kLong).device(tokens.device())));
}

at::Tensor TransformerImpl::forward(const at::Tensor& tokens, const at::Tensor& positions) {
  TORCH_CHECK(tokens.dim() == 2, "Transformer: expected tokens of shape [batch, seq], got ", tokens.sizes());
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == tokens.size(1), "Transformer: expected one position per "
              "token, got positions of shape ", positions.sizes(), " for tokens of shape ", tokens.sizes());
  const int64_t seq_len = tokens.size(1);
  TORCH_CHECK(seq_len <= max_seq_len, "Transformer: sequence length ", seq_len, " exceeds max_seq_len ",
              max_seq_len);
  at::Tensor h = nn::call(tok_embeddings, tokens);
  at::Tensor p = nn::call(pos_embeddings, positions);  // [seq, dim]
  h = nn::call(dropout, h + p);
  for (size_t i = 0; i < layers->size(); ++i) {
    auto layer = layers->ptr<TransformerBlockImpl>(i);
    if (checkpoint_activations)
      h = nn::checkpoint([layer](const at::Tensor& x) { return nn::call(layer, x); }, h);
    else
      h = nn::call(layer, h);
  }
  h = nn::call(norm, h);
  return nn::call(output, h).to(at::kFloat);
}


// The plan of PyTorch's Transformer.parallelize (common_dtensor.py).
Transformer Transformer::parallelize(Transformer module, const DeviceMesh& mesh, bool use_seq_parallel,
                                     bool local_output_for_attn, bool async_tp) {
  ParallelOptions o;
  o.use_seq_parallel = use_seq_parallel;
  o.local_output_for_attn = local_output_for_attn;
  o.async_tp = async_tp;
  return parallelize(std::move(module), mesh, o);
}

Transformer Transformer::parallelize(Transformer module, const DeviceMesh& mesh, const ParallelOptions& options) {
  const bool use_seq_parallel = options.use_seq_parallel, local_output_for_attn = options.local_output_for_attn,
             async_tp = options.async_tp;
  const ModelArgs& args = module->model_args;
  TORCH_CHECK(!async_tp || use_seq_parallel, "Transformer::parallelize: async_tp fuses the sequence-parallel ",
              "all-gathers and reduce-scatters with the matmuls; it needs use_seq_parallel");
  TORCH_CHECK(!local_output_for_attn || args.n_heads % mesh.size() == 0, "Transformer::parallelize: ",
              "local_output_for_attn needs n_heads (", args.n_heads, ") divisible by the mesh size (", mesh.size(),
              ")");
  ParallelizePlan plan;
  if (use_seq_parallel) {
    plan = {
        {"tok_embeddings", RowwiseParallel().input_layouts(Replicate{}).output_layouts(Shard{1})},
        {"pos_embeddings", RowwiseParallel().input_layouts(Replicate{}).output_layouts(Shard{0})},
        {"norm", SequenceParallel()},
        {"layers.*.attention", PrepareModuleInput().input_layouts({Shard{1}}).desired_input_layouts({Replicate{}})},
        {"layers.*.attention_norm", SequenceParallel()},
        {"layers.*.ffn_norm", SequenceParallel()},
    };
  } else {
    plan = {
        {"tok_embeddings", RowwiseParallel().input_layouts(Replicate{}).output_layouts(Replicate{})},
        {"pos_embeddings", RowwiseParallel().input_layouts(Replicate{}).output_layouts(Replicate{})},
    };
  }
  for (const char* w : {"layers.*.attention.wq", "layers.*.attention.wk", "layers.*.attention.wv"})
    plan.emplace_back(w, ColwiseParallel().use_local_output(local_output_for_attn));
  if (use_seq_parallel) {
    // wq/wk/wv share one gathered input (PrepareModuleInput above), so they stay unfused.
    plan.emplace_back("layers.*.attention.wo", RowwiseParallel().output_layouts(Shard{1}).async_tp(async_tp));
    plan.emplace_back("layers.*.feed_forward.w1", ColwiseParallel().input_layouts(Shard{1}).async_tp(async_tp));
    plan.emplace_back("layers.*.feed_forward.w2", RowwiseParallel().output_layouts(Shard{1}).async_tp(async_tp));
    plan.emplace_back("output", options.loss_parallel ? ColwiseParallel()
                                                            .input_layouts(Shard{1})
                                                            .output_layouts(Shard{-1})
                                                            .use_local_output(false)
                                                            .async_tp(async_tp)
                                                      : ColwiseParallel()
                                                            .input_layouts(Shard{1})
                                                            .output_layouts(Replicate{})
                                                            .async_tp(async_tp));
  } else {
    plan.emplace_back("layers.*.attention.wo", RowwiseParallel());
    plan.emplace_back("layers.*.feed_forward.w1", ColwiseParallel());
    plan.emplace_back("layers.*.feed_forward.w2", RowwiseParallel());
    plan.emplace_back("output", options.loss_parallel
                                    ? ColwiseParallel().output_layouts(Shard{-1}).use_local_output(false)
                                    : ColwiseParallel().output_layouts(Replicate{}));
  }
  if (args.n_layers == 0) {  // no "layers.*" entries can match
    plan.erase(std::remove_if(plan.begin(), plan.end(), [](const PlanEntry& e) { return e.path.rfind("layers.", 0) == 0; }),
               plan.end());
  }
  parallelize_module(*module, mesh, plan);
  if (local_output_for_attn)
    for (size_t i = 0; i < module->layers->size(); ++i)
      module->layers->ptr<TransformerBlockImpl>(i)->attention->n_heads = args.n_heads / mesh.size();
  // Both layers were sharded the same way (Shard(0) of [vocab, dim]); share one tensor again.
  if (args.weight_tying) nn::swap_parameter(*module->output, "weight", module->tok_embeddings->weight);
  return module;
}

}  // namespace models
}  // namespace dtensor
