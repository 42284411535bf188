// dtensor/nn/clip_grad.h: PyTorch's torch.nn.utils.clip_grad_norm_, get_total_norm and
// clip_grads_with_norm_ (torch/nn/utils/clip_grad.py) for parameters whose gradients are
// DTensors (FSDP, tensor parallel) or plain tensors.
//
// NOTE: [Gradient norms of DTensors]
// libtorch's torch::nn::utils::clip_grad_norm_ computes each gradient's norm with aten ops:
// on a sharded DTensor gradient that is a redistribution per gradient. PyTorch's DTensor does
// it with a Partial norm per gradient, and torchtitan then reduces the stacked norms. Here each
// rank adds up sum(|g|^p) (max |g| for the infinity norm) of its local shards, grouped by the
// mesh dims the gradient is sharded over, and each mesh dim takes one all-reduce of the groups
// sharded over it: one collective per mesh dim (per mesh), whatever the number of gradients.
// Replicated dims need none. A Partial gradient is reduced first (its norm needs the sum).
// The total norm is a plain 0-dim tensor, equal on every rank (PyTorch returns a DTensor that
// torchtitan turns into one with full_tensor()).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace dtensor {
namespace nn {

// The norm of the order `norm_type` (> 0, or infinity) of all of `tensors` together (as if
// concatenated), a float tensor on the first tensor's device. Collective over the meshes of the
// DTensors among them: every rank of those meshes must call it with the same tensors' layouts.
// error_if_nonfinite: raise when the norm is NaN or infinite.
at::Tensor get_total_norm(const std::vector<at::Tensor>& tensors, double norm_type = 2.0,
                          bool error_if_nonfinite = false);

// Scales the gradients of `parameters` in place by max_norm / (total_norm + 1e-6) when that is
// below 1.
void clip_grads_with_norm_(const std::vector<at::Tensor>& parameters, double max_norm, const at::Tensor& total_norm);

// The total norm of the gradients of `parameters` (those that have one), after scaling them
// so that it is at most max_norm; returns the norm before clipping.
at::Tensor clip_grad_norm_(const std::vector<at::Tensor>& parameters, double max_norm, double norm_type = 2.0,
                           bool error_if_nonfinite = false);

}  // namespace nn
}  // namespace dtensor
