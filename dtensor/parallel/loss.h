// dtensor/parallel/loss.h: PyTorch's loss_parallel() (torch/distributed/tensor/parallel/loss.py):
// cross-entropy on logits sharded on the class dim, without gathering them.
//
//   // logits: a DTensor (N, C) sharded Shard(1) on the tensor-parallel mesh, e.g. the output
//   // of a ColwiseParallel lm-head with use_local_output(false); target: (N,) class indices.
//   {
//     auto guard = dtensor::loss_parallel();
//     at::Tensor loss = torch::nn::functional::cross_entropy(logits, target);  // Replicate
//     loss.backward();                                  // inside the scope, as in PyTorch
//   }
//
// NOTE: [Loss parallel]
// While the guard lives on the calling thread, four ops on DTensors go to handlers of their own
// (NOTE: [DTensor fallback]) instead of their sharding rules, which would gather the logits:
//   _log_softmax(x, dim): the max and the sum of exponentials over `dim` each take one
//     all-reduce over the mesh dim sharding `dim`; the result keeps x's placements;
//   _log_softmax_backward_data: grad - exp(out) * sum(grad), the sum all-reduced the same way;
//   nll_loss_forward(logp, target, weight, reduction, ignore_index): each rank picks the
//     log-probabilities of the targets in its class range (0 elsewhere), one all-reduce sums
//     them; the loss is Replicate;
//   nll_loss_backward: the gradient is written at the targets in the rank's class range.
// As in PyTorch, the logits must be sharded on the class dim by exactly one mesh dim and be
// Replicate on the others (else an error names the placements); the target (and the weight)
// are Replicate: plain tensors are taken as such. label_smoothing is not supported by
// PyTorch's loss_parallel either. The per-sample loss reduction needs the whole target on every
// rank, which PyTorch's handlers also assume.
#pragma once

#include <memory>

namespace dtensor {

class LossParallelGuard {
 public:
  LossParallelGuard();
  ~LossParallelGuard();
  LossParallelGuard(LossParallelGuard&&) noexcept;
  LossParallelGuard& operator=(LossParallelGuard&&) = delete;
  LossParallelGuard(const LossParallelGuard&) = delete;
  LossParallelGuard& operator=(const LossParallelGuard&) = delete;

 private:
  struct Scope;
  std::unique_ptr<Scope> scope_;
};

// PyTorch's `with loss_parallel():`: the scope lasts as long as the returned guard.
[[nodiscard]] LossParallelGuard loss_parallel();

}  // namespace dtensor
