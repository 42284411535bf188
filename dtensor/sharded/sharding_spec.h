// dtensor/sharded/sharding_spec.h
//
// How a tensor is cut into shards (torch.distributed._shard.sharding_spec). ChunkShardingSpec
// cuts one dim like torch.chunk into as many pieces as it has placements; piece i goes to
// placements[i].
//
//   ChunkShardingSpec spec(0, {"rank:0/cpu", "rank:1/cpu", "rank:2/cpu", "rank:3/cpu"});
//   auto meta = spec.build_metadata({10, 4}, {});   // rows 0-2, 3-5, 6-8, 9 on ranks 0..3
//   ShardedTensor st = spec.shard(full, /*src_rank=*/0, group);   // collective
#pragma once

#include "dtensor/comm/group.h"
#include "dtensor/sharded/metadata.h"

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

namespace dtensor {
namespace sharded {

class ShardedTensor;

class ShardingSpec {
 public:
  virtual ~ShardingSpec() = default;

  // The shards of a tensor of size `tensor_sizes` (not collective).
  virtual ShardedTensorMetadata build_metadata(const std::vector<int64_t>& tensor_sizes,
                                               const TensorProperties& tensor_properties) const = 0;
  // Collective over `group` (nullptr: the default group): every rank passes a tensor of the
  // same size and dtype; the values of group rank `src_rank` are scattered.
  virtual ShardedTensor shard(const at::Tensor& tensor, int src_rank = 0, comm::GroupPtr group = nullptr) const = 0;

  virtual std::string to_string() const = 0;
  // Identifies the spec (type and fields): specs are equal when their json is.
  virtual nlohmann::json to_json() const = 0;
  virtual std::shared_ptr<ShardingSpec> clone() const = 0;

  bool operator==(const ShardingSpec& o) const { return to_json() == o.to_json(); }
  bool operator!=(const ShardingSpec& o) const { return !(*this == o); }
};

std::ostream& operator<<(std::ostream& os, const ShardingSpec& spec);

class ChunkShardingSpec : public ShardingSpec {
 public:
  // `dim` may be negative (counted from the end when the spec meets a tensor).
  ChunkShardingSpec(int64_t dim, std::vector<RemoteDevice> placements);

  int64_t dim() const { return dim_; }
  const std::vector<RemoteDevice>& placements() const { return placements_; }

  // Shard i: offset min(split * i, size) along dim, size get_chunked_dim_size(size, split, i)
  // with split = ceil(size / placements), every other dim whole. Throws "Invalid sharding dim".
  ShardedTensorMetadata build_metadata(const std::vector<int64_t>& tensor_sizes,
                                       const TensorProperties& tensor_properties) const override;

  // Collective (see ShardingSpec::shard). The placements must name every rank of the group
  // once (by global rank); rank p receives the piece of its placement. Source: a contiguous
  // copy of each piece, padded to the largest piece (one scatter needs equal sizes); an even
  // chunking of dim 0 is scattered without copies. Each rank's shard is a new leaf tensor
  // with the input's requires_grad.
  ShardedTensor shard(const at::Tensor& tensor, int src_rank = 0, comm::GroupPtr group = nullptr) const override;

  // "ChunkShardingSpec(dim=0, placements=[rank:0/cpu, rank:1/cpu])"
  std::string to_string() const override;
  nlohmann::json to_json() const override;
  std::shared_ptr<ShardingSpec> clone() const override { return std::make_shared<ChunkShardingSpec>(*this); }

  // The spec `to_json` wrote.
  static ChunkShardingSpec from_json(const nlohmann::json& j);

 private:
  int64_t dim_;
  std::vector<RemoteDevice> placements_;
};

// Checks that every shard of `metadata` is placed on a rank of `group` ("Global rank 5 does
// not exist in input process group: [0, 1, 2, 3]") and returns, per shard, its group rank.
std::vector<int> placement_group_ranks(const std::vector<ShardMetadata>& shards, const comm::Group& group);

}  // namespace sharded
}  // namespace dtensor
