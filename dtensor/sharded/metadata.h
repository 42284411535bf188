// dtensor/sharded/metadata.h
//
// The metadata of a ShardedTensor (torch.distributed._shard.metadata and
// torch.distributed._shard.sharded_tensor.metadata): where each shard sits in the global tensor
// and on which rank, and the properties every shard shares.
//
//   ShardMetadata m({4, 0}, {4, 10}, RemoteDevice("rank:1/cpu"));   // rows 4..7 on rank 1
//   validate_non_overlapping_shards_metadata({m0, m1});              // throws on overlap
//   check_tensor({m0, m1}, {8, 10});                                 // throws on gaps
//
// Nothing here is collective.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Layout.h>
#include <c10/core/MemoryFormat.h>
#include <c10/core/ScalarType.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace dtensor {
namespace sharded {

// Where a shard lives: "rank:<rank>/<device>" ("rank:1/cpu", "rank:0/cuda:0"), or
// "<workername>/<device>", or "<device>" (torch.distributed._remote_device). Sharding needs
// the rank form: worker names belong to RPC, which dtensor-cpp does not have.
class RemoteDevice {
 public:
  // Parses the forms above; throws "Could not parse remote_device: ..." naming them.
  RemoteDevice(const std::string& remote_device);  // NOLINT(google-explicit-constructor): PyTorch takes strings
  RemoteDevice(const char* remote_device) : RemoteDevice(std::string(remote_device)) {}  // NOLINT
  RemoteDevice(int rank, c10::Device device) : rank_(rank), device_(device) {}

  // The global rank, or nullopt for the worker-name and device-only forms.
  std::optional<int> rank() const { return rank_; }
  const std::optional<std::string>& worker_name() const { return worker_name_; }
  c10::Device device() const { return device_; }
  std::string to_string() const;  // as parsed: "rank:1/cpu"

  bool operator==(const RemoteDevice& o) const {
    return rank_ == o.rank_ && worker_name_ == o.worker_name_ && device_ == o.device_;
  }
  bool operator!=(const RemoteDevice& o) const { return !(*this == o); }

 private:
  std::optional<int> rank_;
  std::optional<std::string> worker_name_;
  c10::Device device_ = c10::Device(c10::kCPU);
};
std::ostream& operator<<(std::ostream& os, const RemoteDevice& d);

// One shard: its offsets and sizes in the global tensor, and its placement.
class ShardMetadata {
 public:
  // Throws unless offsets and sizes have the same length and are >= 0.
  ShardMetadata(std::vector<int64_t> shard_offsets, std::vector<int64_t> shard_sizes,
                std::optional<RemoteDevice> placement = std::nullopt);

  const std::vector<int64_t>& shard_offsets() const { return shard_offsets_; }
  const std::vector<int64_t>& shard_sizes() const { return shard_sizes_; }
  const std::optional<RemoteDevice>& placement() const { return placement_; }
  int64_t numel() const;
  // "ShardMetadata(shard_offsets=[4, 0], shard_sizes=[4, 10], placement=rank:1/cpu)"
  std::string to_string() const;

  bool operator==(const ShardMetadata& o) const {
    return shard_offsets_ == o.shard_offsets_ && shard_sizes_ == o.shard_sizes_ && placement_ == o.placement_;
  }
  bool operator!=(const ShardMetadata& o) const { return !(*this == o); }

 private:
  std::vector<int64_t> shard_offsets_;
  std::vector<int64_t> shard_sizes_;
  std::optional<RemoteDevice> placement_;
};
std::ostream& operator<<(std::ostream& os, const ShardMetadata& m);

// What every shard of a ShardedTensor shares. Only strided, contiguous shards exist.
struct TensorProperties {
  at::ScalarType dtype = at::kFloat;
  c10::Layout layout = c10::kStrided;
  bool requires_grad = false;
  c10::MemoryFormat memory_format = c10::MemoryFormat::Contiguous;
  bool pin_memory = false;

  // The properties of `tensor` (PyTorch: TensorProperties.create_from_tensor).
  static TensorProperties create_from_tensor(const at::Tensor& tensor);
  bool operator==(const TensorProperties& o) const;
  bool operator!=(const TensorProperties& o) const { return !(*this == o); }
};

// Every shard (of all ranks), the global size and the shared properties.
struct ShardedTensorMetadata {
  std::vector<ShardMetadata> shards_metadata;
  std::vector<int64_t> size;
  TensorProperties tensor_properties;

  bool operator==(const ShardedTensorMetadata& o) const {
    return shards_metadata == o.shards_metadata && size == o.size && tensor_properties == o.tensor_properties;
  }
};

// Throws "Shards <a> and <b> overlap" for the first overlapping pair. Shards that all start at
// the origin and are empty do not overlap. (PyTorch: validate_non_overlapping_shards_metadata.)
void validate_non_overlapping_shards_metadata(const std::vector<ShardMetadata>& shards);

// Throws unless the shards fit in a tensor of size `tensor_dims` and (as they do not overlap)
// cover all of it: "Total volume of shards: V does not match tensor volume: W, in other words
// all the individual shards do not cover the entire tensor". (PyTorch: check_tensor.)
void check_tensor(const std::vector<ShardMetadata>& shards, const std::vector<int64_t>& tensor_dims);

// torch.chunk's piece size: ceil(dim_size / chunks). (PyTorch: get_split_size.)
int64_t get_split_size(int64_t dim_size, int64_t chunks);
// Size of chunk `idx` (trailing chunks may be smaller or empty). (PyTorch: get_chunked_dim_size.)
int64_t get_chunked_dim_size(int64_t dim_size, int64_t split_size, int64_t idx);
// Offset of chunk `idx`: split_size * idx, but at most dim_size. PyTorch does not clamp, so an
// empty trailing chunk (5 rows in 4 chunks: 2, 2, 1, 0) starts past the end and check_tensor
// rejects the layout; clamped, it is the same layout DTensor's Shard uses.
int64_t get_chunk_offset(int64_t dim_size, int64_t split_size, int64_t idx);

// json (object collectives carry metadata between ranks).
// (RemoteDevice and ShardMetadata have no default constructor: see adl_serializer below.)
void to_json(nlohmann::json& j, const RemoteDevice& d);
void to_json(nlohmann::json& j, const ShardMetadata& m);
void to_json(nlohmann::json& j, const TensorProperties& p);
void from_json(const nlohmann::json& j, TensorProperties& p);
void to_json(nlohmann::json& j, const ShardedTensorMetadata& m);
void from_json(const nlohmann::json& j, ShardedTensorMetadata& m);

}  // namespace sharded
}  // namespace dtensor

// nlohmann needs to build these before filling them.
namespace nlohmann {
template <>
struct adl_serializer<dtensor::sharded::RemoteDevice> {
  static dtensor::sharded::RemoteDevice from_json(const json& j);
  static void to_json(json& j, const dtensor::sharded::RemoteDevice& d) { dtensor::sharded::to_json(j, d); }
};
template <>
struct adl_serializer<dtensor::sharded::ShardMetadata> {
  static dtensor::sharded::ShardMetadata from_json(const json& j);
  static void to_json(json& j, const dtensor::sharded::ShardMetadata& m) { dtensor::sharded::to_json(j, m); }
};
}  // namespace nlohmann
