// dtensor/experimental/context_parallel.h: PyTorch's context_parallel and
// context_parallel_unshard (torch/distributed/tensor/experimental/_context_parallel/).
//
//   // tokens, labels: [batch, seq]; freqs: [seq, dim]. Sequence parallel over `cp_mesh` (1-D).
//   {
//     auto cp = dtensor::experimental::context_parallel(cp_mesh, {tokens, labels, freqs}, {1, 1, 0});
//     // The buffers now hold this rank's part of the sequence (head-tail layout), and
//     // nn::functional::scaled_dot_product_attention runs ring attention over cp_mesh.
//     at::Tensor loss = model(tokens, labels);
//     loss.backward();
//   }   // the buffers hold the whole sequence again
//
// NOTE: [Context parallel]
// Context parallel shards the sequence of every input along its sequence dim over a 1-D mesh
// and lets attention, the only op that mixes tokens, see the whole sequence by ring attention
// (NOTE: [Ring attention]). The buffers are changed in place (set_ to the local part, under no
// grad), as PyTorch does, so a model that reads them needs no change; the scope restores them on
// exit, also when the body throws, except those passed as no_restore_buffers. With load
// balancing (the default, as PyTorch's _cp_options.enable_load_balance) a buffer's sequence is
// cut into 2W chunks by HeadTailLoadBalancer, otherwise into W contiguous ones. Inside the scope,
// on this thread, scaled_dot_product_attention on plain tensors (or on the local shards of
// DTensors sharded on batch/heads, as under tensor parallel) runs ring attention; attention
// masks and dropout are refused, as PyTorch's ring attention refuses them.
#pragma once

#include "dtensor/mesh/device_mesh.h"

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace dtensor {
namespace experimental {

struct ContextParallelOptions {
  // The head-tail layout (HeadTailLoadBalancer); false: contiguous shards.
  bool load_balance = true;
};

// The scope context_parallel returns: while it lives, the buffers hold their local parts and
// attention on this thread is ring attention over the mesh. Not copyable or movable.
class ContextParallel {
 public:
  ContextParallel(const DeviceMesh& mesh, std::vector<at::Tensor> buffers, std::vector<int64_t> buffer_seq_dims,
                  std::vector<at::Tensor> no_restore_buffers, ContextParallelOptions options);
  ~ContextParallel();
  ContextParallel(const ContextParallel&) = delete;
  ContextParallel& operator=(const ContextParallel&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Shards `buffers` in place along `buffer_seq_dims` (one per buffer) over the 1-D `mesh` and
// routes attention to ring attention until the returned scope ends; buffers in
// `no_restore_buffers` (the same tensors) are left sharded. Raises, on every rank alike, on a
// mesh that is not 1-D, a missing seq dim, a sequence the layout cannot cut (2W chunks with
// load balancing, W without), a buffer that requires grad, or a scope already open on this thread.
[[nodiscard]] ContextParallel context_parallel(const DeviceMesh& mesh, std::vector<at::Tensor> buffers,
                                               std::vector<int64_t> buffer_seq_dims,
                                               std::vector<at::Tensor> no_restore_buffers = {},
                                               ContextParallelOptions options = {});

// The whole sequence of each of `buffers` (local parts made by context_parallel with the same
// options), gathered over `mesh` and put back in the sequence's order. Not differentiable: for
// outputs and gradients to check or save.
std::vector<at::Tensor> context_parallel_unshard(const DeviceMesh& mesh, const std::vector<at::Tensor>& buffers,
                                                 const std::vector<int64_t>& seq_dims,
                                                 ContextParallelOptions options = {});

}  // namespace experimental
}  // namespace dtensor
