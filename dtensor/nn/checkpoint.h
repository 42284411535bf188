// dtensor/nn/checkpoint.h
//
// Activation checkpointing, the counterpart of torch.utils.checkpoint.checkpoint: the forward
// runs `fn` without keeping its intermediate activations, and the backward runs `fn` again
// (with grad) to compute the gradients of its input and of every parameter it uses.
//
//   at::Tensor h = dtensor::nn::checkpoint([block](const at::Tensor& x) {
//     return dtensor::nn::call(block, x);
//   }, h_in);
//
// Works for plain tensors and DTensors alike. The recomputation happens inside the backward
// pass (a reentrant backward, like PyTorch's use_reentrant=True), so the gradients reach the
// parameters' .grad as usual; the result equals the uncheckpointed run when `fn` is
// deterministic. With preserve_rng_state the default CPU generator's state is saved before
// the forward and restored for the recomputation, so dropout masks repeat. That generator is
// process-wide: with ranks as threads, checkpointed random ops of different ranks interleave.
//
// Collective exactly when `fn` is (its collectives run again in the backward).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>

namespace dtensor {
namespace nn {

struct CheckpointOptions {
  bool preserve_rng_state = true;
};

// `fn` is kept until the backward has run: capture modules by value (shared pointers), not by
// reference to locals. The backward may run once (no retain_graph).
at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& input,
                      const CheckpointOptions& options = {});

}  // namespace nn
}  // namespace dtensor
