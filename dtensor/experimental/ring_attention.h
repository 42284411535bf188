// dtensor/experimental/ring_attention.h: attention over a sequence sharded across the ranks of
// a group, as PyTorch's context parallel computes it (_context_parallel/_attention.py, the
// "alltoall" rotate method). Each rank holds a shard of the queries, keys and values along the
// sequence dim; keys and values travel around the ring, and the output stays sharded like the
// queries. Usually reached through context_parallel (context_parallel.h), which shards the
// buffers and routes nn::functional::scaled_dot_product_attention here.
//
//   dtensor::experimental::RingAttentionOptions o;
//   o.is_causal = true;   // the shards were made by HeadTailLoadBalancer (o.load_balanced)
//   at::Tensor out = dtensor::experimental::ring_attention(q, k, v, mesh.get_group(), o);
//
// NOTE: [Ring attention]
// Forward: at step i (0 <= i < W) rank r holds the keys/values of rank s = (r - i) mod W, sent on
// by one all-to-all per step (W - 1 in all), the next one started before the block is computed.
// Each block's attention gives an output O_b and log-sum-exp L_b per query, merged in float32 as
//   O <- O - sigmoid(L_b - L) (O - O_b),   L <- L - logsigmoid(L - L_b).
// Under a causal mask, step 0 (rank r's own keys) is masked by the tokens' global positions.
// With the head-tail layout every later step needs no mask: if s < r, all queries attend to the
// first half of s's keys (its early chunk; its late chunk is in their future); if s > r, only the
// second half of the queries (r's late chunk) attends, to all of s's keys. Without load
// balancing (contiguous shards), s < r is a full block and s > r is skipped.
// Backward (a custom autograd function, so nothing but q, k, v, O and L is kept): the same ring
// again; each block's gradient is computed from the merged O and L (dS = P (dP - rowsum(dO O))),
// and the keys'/values' gradients travel with them, one all-to-all per step and one more to
// bring them home (2W - 1 all-to-alls; 3W - 2 for a step, as PyTorch's test counts).
#pragma once

#include "dtensor/comm/group.h"

#include <ATen/core/Tensor.h>

namespace dtensor {
namespace experimental {

struct RingAttentionOptions {
  bool is_causal = false;
  // The shards follow HeadTailLoadBalancer's layout (rank r holds chunks r and 2W-1-r) rather
  // than contiguous blocks. Only matters under a causal mask.
  bool load_balanced = true;
};

// Attention of the local queries [..., L, E] over the keys [..., S, E] / values [..., S, Ev] of
// every rank of `group` (the sequence is the second to last dim); returns the local output
// [..., L, Ev], with q's dtype, differentiable with respect to q, k and v. Every rank's q/k/v
// must have the same shape. Raises (on every rank alike) on mismatched shapes, a causal mask
// with L != S, or an odd L under load balancing.
at::Tensor ring_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                          const comm::GroupPtr& group, const RingAttentionOptions& options = {});

}  // namespace experimental
}  // namespace dtensor
