// dtensor/compat.cpp: the out-of-line parts of dtensor/compat.h (the attention op headers).
#include "dtensor/compat.h"

#include <ATen/ATen.h>

namespace dtensor {
namespace compat {

at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                        const c10::optional<at::Tensor>& attn_mask, double dropout_p,
                                        bool is_causal) {
#if DTENSOR_TORCH_2
  if (query.is_meta() && key.is_meta() && value.is_meta()) {
    // On meta tensors libtorch always picks the math kernel, which holds the [L, S] attention
    // weights the CPU's flash kernel never makes: a fake world on the meta device would plan more
    // memory than a CPU rank uses. The CPU's own choice reads only shapes, strides and dtypes, so
    // it is asked directly (1 is sdp::SDPBackend::flash_attention).
    const int64_t choice = at::_ops::_fused_sdp_choice::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), query,
                                                                   key, value, attn_mask, dropout_p, is_causal,
                                                                   c10::nullopt, /*enable_gqa=*/false);
    if (choice == 1)
      return std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, attn_mask));
  }
  return at::scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal);
#else
  return std::get<0>(
      at::_scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, /*need_attn_weights=*/false, is_causal));
#endif
}

at::Tensor sdpa_fused(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                      const c10::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal) {
#if DTENSOR_TORCH_2
  return std::get<0>(at::_scaled_dot_product_flash_attention_for_cpu(query, key, value, dropout_p, is_causal, attn_mask));
#else
  return std::get<0>(at::_scaled_dot_product_attention_forward(query, key, value, attn_mask, dropout_p,
                                                               /*need_attn_weights=*/false, is_causal));
#endif
}

SdpaArgs sdpa_args(SdpaOp op, std::vector<c10::IValue> qkv, c10::IValue attn_mask, double dropout_p,
                   bool need_attn_weights, bool is_causal) {
  SdpaArgs a{std::move(qkv), {}};
#if DTENSOR_TORCH_2
  (void)need_attn_weights;
  if (op == SdpaOp::kFused) {
    a.args.insert(a.args.end(), {dropout_p, is_causal});
    a.kwargs.emplace_back("attn_mask", std::move(attn_mask));
  } else {
    a.args.insert(a.args.end(), {std::move(attn_mask), dropout_p, is_causal});
  }
#else
  (void)op;
  a.args.insert(a.args.end(), {std::move(attn_mask), dropout_p, need_attn_weights, is_causal});
#endif
  return a;
}

}  // namespace compat
}  // namespace dtensor
