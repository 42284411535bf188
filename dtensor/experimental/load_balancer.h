// dtensor/experimental/load_balancer.h: PyTorch's head-tail load balancer for context parallel
// (torch/distributed/tensor/experimental/_context_parallel/_load_balancer.py).
//
// Under a causal mask, the later tokens of a sequence attend to more keys than the earlier
// ones, so cutting the sequence into W contiguous shards gives the last rank W times the work
// of the first. The head-tail balancer cuts it into 2W chunks and gives rank r chunks r and
// 2W-1-r: every rank then holds one early and one late chunk, and the same amount of work.
//
//   dtensor::experimental::HeadTailLoadBalancer lb(/*seq_length=*/16, /*world_size=*/4);
//   lb.generate_indices();       // 0 1 14 15 | 2 3 12 13 | 4 5 10 11 | 6 7 8 9
//   at::Tensor mine = lb.shard(x, /*seq_dim=*/2, /*rank=*/1);   // tokens 2 3 12 13 of x
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace dtensor {
namespace experimental {

class HeadTailLoadBalancer {
 public:
  // Raises unless world_size >= 1 and 2 * world_size divides seq_length.
  HeadTailLoadBalancer(int64_t seq_length, int64_t world_size);

  int64_t seq_length() const { return seq_length_; }
  int64_t world_size() const { return world_size_; }
  // The length of each of the 2W chunks.
  int64_t chunk_size() const { return seq_length_ / (2 * world_size_); }

  // PyTorch's _generate_indices: with restore false, the permutation that reorders a sequence
  // into rank order (x.index_select(seq_dim, indices): rank 0's two chunks, then rank 1's, ...);
  // with restore true, its inverse (from rank order back to the sequence's order).
  at::Tensor generate_indices(bool restore = false) const;

  // The global positions of the tokens `rank` holds, in its local order ([2 * chunk_size()]).
  at::Tensor positions(int64_t rank) const;

  // Rank `rank`'s part of `t` (chunks rank and 2W-1-rank along seq_dim, concatenated). `t` must
  // have seq_length() entries along seq_dim.
  at::Tensor shard(const at::Tensor& t, int64_t seq_dim, int64_t rank) const;

  // The inverse of shard for every rank at once: `gathered` holds the W ranks' parts one after
  // another along seq_dim (what an all-gather gives); returns the sequence in its own order.
  at::Tensor unshard(const at::Tensor& gathered, int64_t seq_dim) const;

 private:
  int64_t seq_length_;
  int64_t world_size_;
};

}  // namespace experimental
}  // namespace dtensor
