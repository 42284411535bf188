// dtensor/nn/functional.cpp: see NOTE: [Attention on DTensors].
#include "dtensor/nn/functional.h"

#include "dtensor/nn/functional_internal.h"

#include "dtensor/compat.h"
#include "dtensor/tensor/dtensor.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace dtensor {
namespace nn {
namespace functional {

namespace {

// The calling thread's attention override (context_parallel's ring attention), if any.
detail::AttentionOverride& attention_override() {
  thread_local detail::AttentionOverride f;
  return f;
}

at::Tensor local_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                           double dropout_p, bool is_causal) {
  if (const auto& f = attention_override()) return f(q, k, v, mask, dropout_p, is_causal);
  c10::optional<at::Tensor> m;
  if (mask.defined()) m = mask;
  return compat::scaled_dot_product_attention(q, k, v, m, dropout_p, is_causal);
}

// Per mesh dim: q's Shard of a batch/head dim, else Replicate (NOTE: [Attention on DTensors]).
std::vector<Placement> attention_layout(const DTensorSpec& q) {
  const int64_t batch_dims = q.ndim() - 2;
  std::vector<Placement> out;
  for (const auto& p : q.placements) {
    if (is_shard(p) && std::get<Shard>(p).dim < batch_dims) out.push_back(p);
    else out.push_back(Replicate{});
  }
  return out;
}

}  // namespace

detail::AttentionOverride detail::exchange_attention_override(AttentionOverride f) {
  std::swap(f, attention_override());
  return f;
}

at::Tensor scaled_dot_product_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                        const at::Tensor& attn_mask, double dropout_p, bool is_causal) {
  const int n_dtensors = is_dtensor(query) + is_dtensor(key) + is_dtensor(value);
  if (n_dtensors == 0) return local_attention(query, key, value, attn_mask, dropout_p, is_causal);
  TORCH_CHECK(n_dtensors == 3, "scaled_dot_product_attention: query, key and value must all be DTensors or all "
              "plain tensors; got ", n_dtensors, " DTensors. Distribute the others (distribute_tensor / from_local)");
  const DTensorSpec& qs = get_spec(query);
  TORCH_CHECK(qs.ndim() >= 3 && key.dim() == qs.ndim() && value.dim() == qs.ndim(),
              "scaled_dot_product_attention: expected query, key and value with the same number (>= 3) of dims, "
              "got ", query.sizes(), ", ", key.sizes(), ", ", value.sizes());
  TORCH_CHECK(get_spec(key).mesh == qs.mesh && get_spec(value).mesh == qs.mesh,
              "scaled_dot_product_attention: query, key and value are on different meshes: ", qs.mesh.to_string(),
              ", ", get_spec(key).mesh.to_string(), ", ", get_spec(value).mesh.to_string());
  TORCH_CHECK(!is_dtensor(attn_mask), "scaled_dot_product_attention: attn_mask is a DTensor (",
              to_string(get_spec(attn_mask).placements),
              "); pass the mask as a plain tensor that broadcasts over the sharded batch/head dims");
  const std::vector<Placement> layout = attention_layout(qs);
  if (attn_mask.defined()) {
    const int64_t offset = qs.ndim() - attn_mask.dim();
    for (const auto& p : layout) {
      if (!is_shard(p)) continue;
      const int64_t d = std::get<Shard>(p).dim - offset;
      TORCH_CHECK(d < 0 || attn_mask.size(d) == 1, "scaled_dot_product_attention: attn_mask of shape ",
                  attn_mask.sizes(), " has ", d < 0 ? 0 : attn_mask.size(d), " entries along dim ",
                  std::get<Shard>(p).dim, " of the query, which is sharded (", to_string(layout),
                  "); use a mask of size 1 there, or replicate query, key and value");
    }
  }
  auto to_layout = [&](const at::Tensor& t) {
    return get_spec(t).placements == layout ? t : redistribute(t, qs.mesh, layout);
  };
  at::Tensor q = to_layout(query), k = to_layout(key), v = to_layout(value);
  at::Tensor out = local_attention(to_local(q), to_local(k), to_local(v), attn_mask, dropout_p, is_causal);
  std::vector<int64_t> global = query.sizes().vec();
  global.back() = value.size(-1);
  return from_local(out, qs.mesh, layout, FromLocalOptions::contiguous(global));
}

}  // namespace functional
}  // namespace nn
}  // namespace dtensor
