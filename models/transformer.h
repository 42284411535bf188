// models/transformer.h
//
// The toy Transformer of PyTorch's common_dtensor.py (after nanoGPT) and its parts, with
// Transformer::parallelize applying PyTorch's tensor-parallel plan (common_dtensor.py). Children
// are called through dtensor::nn::call, so parallel styles can hook them; parameter names
// equal PyTorch's ("layers.0.attention.wq.weight", ...).
//
//   dtensor::models::ModelArgs args;                        // n_layers 2, vocab 8, dim 16, ...
//   dtensor::models::Transformer model(args);
//   dtensor::models::Transformer::parallelize(model, tp_mesh, /*use_seq_parallel=*/true);
//   at::Tensor logits = dtensor::nn::call(model, tokens);   // [batch, seq, vocab], float
//
// Collective: parallelize (every rank, same model structure; parameters come from the mesh's
// first rank), and forward/backward of a parallelized model (every rank, same token shapes).
#pragma once

#include "dtensor/mesh/device_mesh.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>

namespace dtensor {
namespace models {

// common_dtensor.py's ModelArgs dataclass, same fields and defaults.
struct ModelArgs {
  int64_t n_layers = 2;
  int64_t vocab_size = 8;
  int64_t max_seq_len = 16;
  int64_t dim = 16;
  int64_t n_heads = 4;
  double dropout_p = 0.1;
  bool use_attn_mask = true;
  bool weight_tying = true;
  bool checkpoint_activations = false;
};

// Multi-head self-attention: wq/wk/wv/wo (no bias), scaled dot-product attention (causal when
// use_attn_mask, dropout_p while training), then resid_dropout. Input [batch, seq, dim].
class AttentionImpl : public torch::nn::Module {
 public:
  explicit AttentionImpl(const ModelArgs& args);
  at::Tensor forward(const at::Tensor& x);

  int64_t head_dim;
  // Heads this module computes; Transformer::parallelize with local_output_for_attn sets it to
  // the heads of one rank.
  int64_t n_heads;
  double dropout_p;
  bool use_attn_mask;
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  torch::nn::Dropout resid_dropout{nullptr};
};
TORCH_MODULE(Attention);

// w2(gelu(w1(x))) then resid_dropout; w1: dim -> hidden_dim, w2: hidden_dim -> dim (with bias).
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t dim, int64_t hidden_dim, double dropout_p);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Linear w1{nullptr};
  torch::nn::GELU gelu{nullptr};
  torch::nn::Linear w2{nullptr};
  torch::nn::Dropout resid_dropout{nullptr};
};
TORCH_MODULE(FeedForward);

// h = x + attention(attention_norm(x)); out = h + feed_forward(ffn_norm(h)).
class TransformerBlockImpl : public torch::nn::Module {
 public:
  explicit TransformerBlockImpl(const ModelArgs& args);
  at::Tensor forward(const at::Tensor& x);

  torch::nn::LayerNorm attention_norm{nullptr};
  Attention attention{nullptr};
  torch::nn::LayerNorm ffn_norm{nullptr};
  FeedForward feed_forward{nullptr};
};
TORCH_MODULE(TransformerBlock);

class TransformerImpl : public torch::nn::Module {
 public:
  explicit TransformerImpl(const ModelArgs& args);
  // tokens: [batch, seq] int64, seq <= max_seq_len. Returns float logits [batch, seq, vocab].
  at::Tensor forward(const at::Tensor& tokens);
  // The same with each token's position given ([seq], long; the plain overload uses
  // 0..seq-1): under context parallel the tokens of a rank are not contiguous, so the positions
  // are a buffer sharded with them (NOTE: [Context parallel]).
  at::Tensor forward(const at::Tensor& tokens, const at::Tensor& positions);

  ModelArgs model_args;
  int64_t max_seq_len;
  torch::nn::Embedding tok_embeddings{nullptr};
  torch::nn::Embedding pos_embeddings{nullptr};
  torch::nn::Dropout dropout{nullptr};
  torch::nn::ModuleList layers{nullptr};  // TransformerBlocks, named "0", "1", ...
  torch::nn::LayerNorm norm{nullptr};
  torch::nn::Linear output{nullptr};  // weight tied to tok_embeddings.weight with weight_tying
  bool checkpoint_activations;
};

class Transformer : public torch::nn::ModuleHolder<TransformerImpl> {
 public:
  using torch::nn::ModuleHolder<TransformerImpl>::ModuleHolder;
  using Impl = TransformerImpl;

  // Applies PyTorch's tensor-parallel plan (common_dtensor.py's Transformer.parallelize) on the 1-D mesh `mesh` and, with
  // weight tying, ties output.weight to tok_embeddings.weight again. Without sequence
  // parallelism the embeddings are row-sharded with replicated outputs, attention and
  // feed-forward projections are Colwise/Rowwise pairs, and the output layer is column-sharded
  // with a replicated output. With it, activations between the blocks stay sharded on the
  // sequence dim (norms as SequenceParallel, PrepareModuleInput before attention).
  // local_output_for_attn: wq/wk/wv return local shards and each rank's attention computes
  // n_heads / mesh size heads on plain tensors. async_tp (with use_seq_parallel): wo, w1, w2 and
  // output fuse their sequence all-gather or reduce-scatter with the matmul (the styles'
  // async_tp; the sequence length must be divisible by the mesh size). Collective. Returns
  // `module`.
  static Transformer parallelize(Transformer module, const DeviceMesh& mesh, bool use_seq_parallel,
                                 bool local_output_for_attn = false, bool async_tp = false);

  struct ParallelOptions {
    bool use_seq_parallel = false;
    bool local_output_for_attn = false;
    bool async_tp = false;
    // The output layer keeps its logits sharded on the vocabulary (a DTensor, Shard(-1),
    // torchtitan's loss-parallel plan): compute the loss inside dtensor::loss_parallel() on
    // logits.flatten(0, 1), which never gathers them (NOTE: [Loss parallel]).
    bool loss_parallel = false;
  };
  static Transformer parallelize(Transformer module, const DeviceMesh& mesh, const ParallelOptions& options);
};

}  // namespace models
}  // namespace dtensor
