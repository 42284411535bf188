// dtensor/sharded/sharding_spec.h
//
// How a tensor is cut into shards (torch.distributed._shard.sharding_spec). ChunkShardingSpec
// cuts one dim like torch.chunk into as many pieces as it has placements; piece i goes to
// placements[i]. EnumerableShardingSpec lists the shards.
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

  // Collective (see ShardingSpec::shard). The placements name ranks of the group (by global
  // rank), each at most once; a rank named by no placement gets no shard (as in PyTorch, a
  // spec may place the tensor on a subset of the group); rank p receives the piece of its
  // placement. Source: a contiguous
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

// The shards listed one by one (torch.distributed._shard.sharding_spec.EnumerableShardingSpec):
// any layout of non-overlapping boxes, several or none per rank.
//
//   EnumerableShardingSpec spec({ShardMetadata({0, 0}, {5, 5}, RemoteDevice("rank:0/cpu")),
//                                ShardMetadata({0, 5}, {5, 5}, RemoteDevice("rank:1/cpu")),
//                                ShardMetadata({5, 0}, {5, 5}, RemoteDevice("rank:2/cpu")),
//                                ShardMetadata({5, 5}, {5, 5}, RemoteDevice("rank:3/cpu"))});
//   ShardedTensor st = dtensor::sharded::zeros(spec, {10, 10});   // one 5x5 block per rank
class EnumerableShardingSpec : public ShardingSpec {
 public:
  // Throws "Empty shard list provided", "Found inconsistent ranks for shards: 2 and 3" (shards
  // of different dims) or "Shards ... overlap".
  explicit EnumerableShardingSpec(std::vector<ShardMetadata> shards);

  const std::vector<ShardMetadata>& shards() const { return shards_; }

  // The shards as they are, after checking that they tile a tensor of `tensor_sizes` (PyTorch's
  // check_tensor: "Shard offset ... and length ... exceeds tensor dim" / "Total volume of shards").
  ShardedTensorMetadata build_metadata(const std::vector<int64_t>& tensor_sizes,
                                       const TensorProperties& tensor_properties) const override;

  // Collective over `group` (PyTorch has no EnumerableShardingSpec.shard: NotImplementedError).
  // Rank `src_rank`'s tensor is broadcast to the group (one broadcast of the whole tensor), and
  // every rank keeps contiguous copies of the shards placed on it (possibly none). Each shard is
  // a new leaf tensor with the input's requires_grad.
  ShardedTensor shard(const at::Tensor& tensor, int src_rank = 0, comm::GroupPtr group = nullptr) const override;

  // "EnumerableShardingSpec(shards=[ShardMetadata(shard_offsets=[0, 0], ...), ...])"
  std::string to_string() const override;
  nlohmann::json to_json() const override;
  std::shared_ptr<ShardingSpec> clone() const override { return std::make_shared<EnumerableShardingSpec>(*this); }
  static EnumerableShardingSpec from_json(const nlohmann::json& j);

 private:
  std::vector<ShardMetadata> shards_;
};

// Checks that every shard of `metadata` is placed on a rank of `group` ("Global rank 5 does
// not exist in input process group: [0, 1, 2, 3]") and returns, per shard, its group rank.
std::vector<int> placement_group_ranks(const std::vector<ShardMetadata>& shards, const comm::Group& group);

}  // namespace sharded
}  // namespace dtensor
