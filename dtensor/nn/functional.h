// dtensor/nn/functional.h
//
// Functions of torch.nn.functional whose DTensor behaviour is not that of their aten
// decomposition. Plain tensors go straight to libtorch.
//
//   // q, k, v: [batch, heads, seq, head_dim] DTensors sharded on heads (Shard(1)).
//   at::Tensor out = dtensor::nn::functional::scaled_dot_product_attention(q, k, v, {}, 0.0,
//                                                                         /*is_causal=*/true);
//   // out: Shard(1), computed without communication.
//
// NOTE: [Attention on DTensors]
// libtorch 1.13's aten::_scaled_dot_product_attention is CompositeImplicitAutograd: on
// DTensors it decomposes above the DTensor key into matmul (which flattens batch and heads
// into one dim, so a head-sharded input would be gathered), a plain causal mask made with
// at::ones (a plain tensor mixed with DTensors), _softmax and dropout. Attention is
// independent per batch entry and per head, so here the inputs are brought to one layout
// where every mesh dim shards the same batch or head dim of q, k and v (or replicates), and
// each rank runs libtorch's attention on its local shards (PyTorch's DTensor has a dedicated
// strategy for the same reason). The result has that layout; gradients flow back through
// to_local/from_local. Dropout inside attention then draws per shard: the mask is a valid
// dropout mask but not the single-device one (per-shard RNG offsets are future work).
#pragma once

#include <ATen/core/Tensor.h>

namespace dtensor {
namespace nn {
namespace functional {

// torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p,
// is_causal) on [..., L, E] / [..., S, E] / [..., S, Ev] tensors; returns [..., L, Ev].
// DTensor inputs (all three, one mesh): collective when their layouts differ from the chosen
// one (NOTE: [Attention on DTensors]): per mesh dim, q's Shard of a batch/head dim if it has
// one, else Replicate; Partial inputs are reduced. `attn_mask` must then be a plain tensor that
// broadcasts over every sharded dim (size 1 there, or fewer dims).
at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                        const at::Tensor& attn_mask = {}, double dropout_p = 0.0,
                                        bool is_causal = false);

}  // namespace functional
}  // namespace nn
}  // namespace dtensor
