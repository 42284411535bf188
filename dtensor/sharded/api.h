// dtensor/sharded/api.h
//
// Sharding tensors and the process group ShardedTensors are loaded with
// (torch.distributed._shard.api).
//
//   using namespace dtensor::sharded;
//   ChunkShardingSpec spec(0, {"rank:0/cpu", "rank:1/cpu", "rank:2/cpu", "rank:3/cpu"});
//   ShardedTensor st = shard_tensor(weight, spec);          // collective: rank 0's values
//
//   {
//     LoadWithProcessGroupGuard guard(subgroup);            // ShardedTensors loaded here
//     ShardedTensor loaded = ShardedTensor::from_state(saved);   // ... belong to `subgroup`
//   }
#pragma once

#include "dtensor/comm/group.h"
#include "dtensor/sharded/sharded_tensor.h"
#include "dtensor/sharded/sharding_spec.h"

#include <ATen/core/Tensor.h>

namespace dtensor {
namespace sharded {

// Collective over `group` (nullptr: the default group). Shards `tensor` as `sharding_spec`
// says, with the values of group rank `src_rank`. Before any data moves, one object all_gather
// checks that every rank passed the same src_rank and spec, and a contiguous tensor of the same
// size and dtype; otherwise EVERY rank raises, e.g.
//   "src_rank=0 on rank: 2 does not match with src_rank=1 on rank: 3"
//   "input tensor is not a contiguous Tensor (on rank 1)"
// (PyTorch: _shard_tensor; it checks contiguity before the all_gather, on one rank only.)
ShardedTensor shard_tensor(const at::Tensor& tensor, const ShardingSpec& sharding_spec, int src_rank = 0,
                           comm::GroupPtr group = nullptr);

// While alive, get_current_process_group() returns `group` on this thread: ShardedTensors
// loaded then (ShardedTensor::from_state) belong to it. Nesting throws "ProcessGroup already set
// by previous \"load_with_process_group\" context manager". Per thread, like the default group
// of ranks as threads. (PyTorch: the load_with_process_group context manager.)
class LoadWithProcessGroupGuard {
 public:
  explicit LoadWithProcessGroupGuard(comm::GroupPtr group);
  ~LoadWithProcessGroupGuard();
  LoadWithProcessGroupGuard(const LoadWithProcessGroupGuard&) = delete;
  LoadWithProcessGroupGuard& operator=(const LoadWithProcessGroupGuard&) = delete;

  const comm::GroupPtr& group() const { return group_; }

 private:
  comm::GroupPtr group_;
};

// The group of the enclosing LoadWithProcessGroupGuard, else the default group.
// (PyTorch: _get_current_process_group.)
comm::GroupPtr get_current_process_group();

}  // namespace sharded
}  // namespace dtensor
