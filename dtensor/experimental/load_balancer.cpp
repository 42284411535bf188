// dtensor/experimental/load_balancer.cpp
#include "dtensor/experimental/load_balancer.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace dtensor {
namespace experimental {

HeadTailLoadBalancer::HeadTailLoadBalancer(int64_t seq_length, int64_t world_size)
    : seq_length_(seq_length), world_size_(world_size) {
  TORCH_CHECK(world_size >= 1, "HeadTailLoadBalancer: world_size must be >= 1, got ", world_size);
  TORCH_CHECK(seq_length > 0 && seq_length % (2 * world_size) == 0, "HeadTailLoadBalancer: sequence length ",
              seq_length, " is not divisible by 2 * world_size = ", 2 * world_size,
              " (the head-tail balancer cuts the sequence into two chunks per rank)");
}

at::Tensor HeadTailLoadBalancer::positions(int64_t rank) const {
  TORCH_CHECK(rank >= 0 && rank < world_size_, "HeadTailLoadBalancer: rank ", rank, " is outside [0, ",
              world_size_, ")");
  const int64_t c = chunk_size();
  return at::cat({at::arange(rank * c, (rank + 1) * c, at::kLong),
                  at::arange((2 * world_size_ - 1 - rank) * c, (2 * world_size_ - rank) * c, at::kLong)});
}

at::Tensor HeadTailLoadBalancer::generate_indices(bool restore) const {
  std::vector<at::Tensor> parts;
  for (int64_t r = 0; r < world_size_; ++r) parts.push_back(positions(r));
  at::Tensor order = at::cat(parts);
  if (!restore) return order;
  // The inverse permutation: inverse[order[i]] = i.
  at::Tensor inverse = at::empty_like(order);
  inverse.index_put_({order}, at::arange(seq_length_, at::kLong));
  return inverse;
}

at::Tensor HeadTailLoadBalancer::shard(const at::Tensor& t, int64_t seq_dim, int64_t rank) const {
  const int64_t d = c10::maybe_wrap_dim(seq_dim, t.dim());
  TORCH_CHECK(t.size(d) == seq_length_, "HeadTailLoadBalancer::shard: the tensor has ", t.size(d),
              " entries along dim ", d, ", the balancer was made for a sequence of ", seq_length_);
  const int64_t c = chunk_size();
  return at::cat({t.narrow(d, rank * c, c), t.narrow(d, (2 * world_size_ - 1 - rank) * c, c)}, d);
}

at::Tensor HeadTailLoadBalancer::unshard(const at::Tensor& gathered, int64_t seq_dim) const {
  const int64_t d = c10::maybe_wrap_dim(seq_dim, gathered.dim());
  TORCH_CHECK(gathered.size(d) == seq_length_, "HeadTailLoadBalancer::unshard: the tensor has ",
              gathered.size(d), " entries along dim ", d, ", the balancer was made for a sequence of ", seq_length_);
  return gathered.index_select(d, generate_indices(/*restore=*/true).to(gathered.device()));
}

}  // namespace experimental
}  // namespace dtensor
