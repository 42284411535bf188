// suites/testing/tp_collectives.h: the collectives one training step of the toy Transformer
// needs under PyTorch's tensor-parallel plan (common_dtensor.py's Transformer.parallelize), derived from the plan, for the
// suite and the benchmark to compare against what CommDebugMode counts.
//
// NOTE: [Collectives of the Transformer plan]
// Per rank, for L layers, one forward + backward (loss on the replicated logits) + SGD step:
// Without sequence parallelism:
//   forward:  tok_embeddings and pos_embeddings: Partial -> Replicate (2 all_reduce); per layer
//             wo and w2: Partial -> Replicate (2L all_reduce); output: Shard(-1) -> Replicate
//             (1 all_gather). wq/wk/wv/w1 wrap a replicated plain input (no communication).
//   backward: each from_local(Replicate) of a Colwise input gets a Partial gradient, reduced by
//             an all_reduce: wq, wk, wv and w1 per layer and output (4L + 1). The backward of a
//             Partial -> Replicate reduction is free, that of Shard -> Replicate is a local chunk.
//   SGD:      nothing (norm parameters are plain, sharded ones have sharded gradients).
// With sequence parallelism:
//   forward:  embeddings: Partial -> Shard (2 reduce_scatter); per layer attention input
//             Shard(1) -> Replicate and w1 input Shard(1) -> Replicate (2L all_gather), wo and w2
//             Partial -> Shard(1) (2L reduce_scatter); output: input Shard(1) -> Replicate and
//             output Shard(-1) -> Replicate (2 all_gather).
//   backward: the reverse of each: every reduce_scatter gives an all_gather (2 + 2L), every
//             all_gather of an activation whose gradient comes back Partial a reduce_scatter
//             (2L + 1; the output's gathered logits come back Replicate: a local chunk).
//   SGD:      the replicated norm parameters (2 per LayerNorm, 2L + 1 LayerNorms) have Partial
//             gradients, reduced when the step reads them: 4L + 2 all_reduce. (Adam reads each
//             gradient three times, so it reduces 3 (4L + 2) times.)
// Setup (parallelize: one broadcast per distributed parameter) is not part of a step.
#pragma once

#include "dtensor/debug/comm_mode.h"

#include <cstdint>
#include <map>
#include <string>

namespace dtensor {
namespace testing {

struct StepCollectives {
  std::map<std::string, int64_t> forward, backward, optimizer;  // CommDebugMode's count keys
  static int64_t sum(const std::map<std::string, int64_t>& m) {
    int64_t n = 0;
    for (const auto& kv : m) n += kv.second;
    return n;
  }
  int64_t total() const { return sum(forward) + sum(backward) + sum(optimizer); }
};

// NOTE: [Collectives of the Transformer plan]; SGD as the optimizer.
inline StepCollectives transformer_plan_collectives(int64_t n_layers, bool seq_parallel) {
  const int64_t L = n_layers;
  StepCollectives c;
  if (!seq_parallel) {
    c.forward = {{debug::c10d_functional::all_reduce, 2 + 2 * L}, {debug::c10d_functional::all_gather_into_tensor, 1}};
    c.backward = {{debug::c10d_functional::all_reduce, 4 * L + 1}};
  } else {
    c.forward = {{debug::c10d_functional::reduce_scatter_tensor, 2 + 2 * L}, {debug::c10d_functional::all_gather_into_tensor, 2 * L + 2}};
    c.backward = {{debug::c10d_functional::all_gather_into_tensor, 2 * L + 2}, {debug::c10d_functional::reduce_scatter_tensor, 2 * L + 1}};
    c.optimizer = {{debug::c10d_functional::all_reduce, 4 * L + 2}};
  }
  return c;
}

}  // namespace testing
}  // namespace dtensor
