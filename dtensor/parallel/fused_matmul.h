// dtensor/parallel/fused_matmul.h
//
// Matmuls fused with the collective that feeds or follows them, pipelined so that one block's
// communication runs while another block is multiplied: the C++ counterparts of PyTorch's
// "async tensor parallel" ops torch.ops.symm_mem.fused_all_gather_matmul and
// fused_matmul_reduce_scatter (torch/distributed/_symmetric_memory/__init__.py), which
// torch.compile substitutes for all_gather + mm and mm + reduce_scatter when
// _micro_pipeline_tp is on. ColwiseParallel / RowwiseParallel use them with .async_tp(true)
// (style.h).
//
//   // this rank's a: [batch, seq / n, in], w_t: [in, out / n]
//   at::Tensor y = dtensor::fused_all_gather_matmul(a, w_t, /*gather_dim=*/1, mesh.get_group(0));
//   // y == cat(every rank's a, dim 1) @ w_t: [batch, seq, out / n]
//
//   // this rank's h: [batch, seq, hidden / n], w_t: [hidden / n, out]
//   at::Tensor z = dtensor::fused_matmul_reduce_scatter(h, w_t, /*scatter_dim=*/1, group);
//   // z == rank r's block along dim 1 of the sum over ranks of h @ w_t: [batch, seq / n, out]
//
// NOTE: [Pipelined collective matmul]
// fused_all_gather_matmul copies this rank's block into a buffer of n blocks and issues one
// broadcast per block (block k from rank k, every rank in rank order), multiplies its own block
// at once, then each other block as soon as its broadcast has completed, while the later ones
// are still moving. fused_matmul_reduce_scatter multiplies the rows bound for rank 0 and issues
// their gather to rank 0, multiplies rank 1's rows while that gather moves, and so on; rank r
// then sums the n partial blocks it received in rank order. Each moves what the collective it
// replaces moves, (n-1)/n of the gathered (or scattered) tensor sent per rank, and computes the
// same products split by rows, so results equal the unfused ones up to the floating-point
// order of the reduction. Unlike PyTorch's symmetric-memory kernels, this needs nothing from the
// backend: it runs on every comm::Group (Gloo, NCCL, ThreadGroup). The overlap is real where the
// backend progresses collectives while the host computes (Gloo's threads; NCCL's stream).
//
// Both are differentiable in `a` and `b`; the gradient of each is computed by the other
// (the gradient of an all-gather is a reduce-scatter), pipelined the same way.
//
// Collective over `group`: every rank calls with the same shapes (a's blocks equal), dims and
// dtype; the backward is collective too.
#pragma once

#include "dtensor/comm/group.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dtensor {

// cat(every rank's a_shard along gather_dim) @ b. `a_shard` has at least 2 dims, `b` is 2-D
// with b.size(0) == a_shard.size(-1), and gather_dim is not a_shard's last (contracted) dim.
// PyTorch's op also returns the gathered `a`; this one keeps it only for the backward.
at::Tensor fused_all_gather_matmul(const at::Tensor& a_shard, const at::Tensor& b, int64_t gather_dim,
                                   const comm::GroupPtr& group);

// This rank's block along scatter_dim of the sum over ranks of a @ b. `a` has at least 2 dims,
// a.size(scatter_dim) is divisible by the group size, `b` is 2-D with b.size(0) == a.size(-1),
// and scatter_dim is not a's last dim. The reduction is a sum (PyTorch's reduce_op "sum").
at::Tensor fused_matmul_reduce_scatter(const at::Tensor& a, const at::Tensor& b, int64_t scatter_dim,
                                       const comm::GroupPtr& group);

}  // namespace dtensor
