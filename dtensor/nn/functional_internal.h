// dtensor/nn/functional_internal.h: the per-thread attention override through which
// context_parallel (dtensor/experimental/context_parallel.h, NOTE: [Context parallel]) makes
// scaled_dot_product_attention run ring attention.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace dtensor {
namespace nn {
namespace functional {
namespace detail {

// Attention on local tensors: (query, key, value, attn_mask, dropout_p, is_causal) -> output.
using AttentionOverride = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                                   const at::Tensor&, double, bool)>;

// Installs `f` (empty: libtorch's attention) for the calling thread; returns the one it replaces.
AttentionOverride exchange_attention_override(AttentionOverride f);

}  // namespace detail
}  // namespace functional
}  // namespace nn
}  // namespace dtensor
