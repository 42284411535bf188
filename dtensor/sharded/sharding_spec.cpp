// dtensor/sharded/sharding_spec.cpp: ChunkShardingSpec (metadata and the scatter).
#include "dtensor/sharded/sharding_spec.h"

#include "dtensor/sharded/sharded_tensor.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace dtensor {
namespace sharded {

std::ostream& operator<<(std::ostream& os, const ShardingSpec& spec) { return os << spec.to_string(); }

std::vector<int> placement_group_ranks(const std::vector<ShardMetadata>& shards, const comm::Group& group) {
  std::vector<int> out;
  for (const ShardMetadata& s : shards) {
    TORCH_CHECK(s.placement().has_value(), "Must specify placement for `Shard`: ", s);
    const RemoteDevice& p = *s.placement();
    TORCH_CHECK(!p.worker_name(), "RPC framework needs to be initialized for using worker names: ", *p.worker_name(),
                " (dtensor-cpp has no RPC: place shards with 'rank:<rank>/<device>')");
    TORCH_CHECK(p.rank().has_value(), "placement ", p, " of ", s, " names no rank: use 'rank:<rank>/<device>'");
    const int g = group.group_rank_of(*p.rank());
    if (g < 0) {
      std::ostringstream ranks;
      ranks << c10::ArrayRef<int>(group.global_ranks());
      TORCH_CHECK(false, "Global rank ", *p.rank(), " does not exist in input process group: ", ranks.str());
    }
    out.push_back(g);
  }
  return out;
}

ChunkShardingSpec::ChunkShardingSpec(int64_t dim, std::vector<RemoteDevice> placements)
    : dim_(dim), placements_(std::move(placements)) {
  TORCH_CHECK(!placements_.empty(), "ChunkShardingSpec needs at least one placement");
}

ShardedTensorMetadata ChunkShardingSpec::build_metadata(const std::vector<int64_t>& tensor_sizes,
                                                        const TensorProperties& tensor_properties) const {
  const int64_t ndim = static_cast<int64_t>(tensor_sizes.size());
  TORCH_CHECK(dim_ < ndim && dim_ >= -ndim, "Invalid sharding dim: ", dim_, " for a tensor of ", ndim, " dims (",
              to_string(), ")");
  const int64_t d = dim_ < 0 ? dim_ + ndim : dim_;
  const int64_t chunks = static_cast<int64_t>(placements_.size());
  const int64_t split = get_split_size(tensor_sizes[d], chunks);
  ShardedTensorMetadata meta;
  meta.size = tensor_sizes;
  meta.tensor_properties = tensor_properties;
  for (int64_t i = 0; i < chunks; ++i) {
    std::vector<int64_t> offsets(ndim, 0), sizes = tensor_sizes;
    offsets[d] = get_chunk_offset(tensor_sizes[d], split, i);
    sizes[d] = get_chunked_dim_size(tensor_sizes[d], split, i);
    meta.shards_metadata.emplace_back(std::move(offsets), std::move(sizes), placements_[i]);
  }
  return meta;
}

ShardedTensor ChunkShardingSpec::shard(const at::Tensor& tensor, int src_rank, comm::GroupPtr group) const {
  if (!group) group = comm::default_group();
  comm::Group& g = *group;
  comm::detail::check_rank_arg(g, "ChunkShardingSpec.shard", "src_rank", src_rank);
  TORCH_CHECK(tensor.defined(), "ChunkShardingSpec.shard: the tensor is undefined");
  TORCH_CHECK(tensor.layout() == c10::kStrided, "ChunkShardingSpec.shard: only strided tensors, got ", tensor.layout());
  // 1. Metadata and placements (the same on every rank: no collective yet).
  const ShardedTensorMetadata meta = build_metadata(tensor.sizes().vec(), TensorProperties::create_from_tensor(tensor));
  const std::vector<int> owners = placement_group_ranks(meta.shards_metadata, g);
  std::vector<int> chunk_of_rank(g.size(), -1);
  for (size_t i = 0; i < owners.size(); ++i) {
    TORCH_CHECK(chunk_of_rank[owners[i]] < 0, "ChunkShardingSpec.shard: rank ", g.global_ranks()[owners[i]],
                " holds several placements of ", to_string(), "; it needs one placement per rank of the ",
                g.describe());
    chunk_of_rank[owners[i]] = static_cast<int>(i);
  }

  // 2. One scatter of flat pieces padded to the largest piece.
  const int64_t d = dim_ < 0 ? dim_ + tensor.dim() : dim_;
  const int64_t split = get_split_size(tensor.size(d), static_cast<int64_t>(placements_.size()));
  const int64_t scatter_numel = tensor.numel() == 0 ? 0 : split * (tensor.numel() / tensor.size(d));
  // A rank with no placement takes part in the scatter (it needs every rank) and drops what it
  // receives: an empty piece.
  const bool placed = chunk_of_rank[g.rank()] >= 0;
  const ShardMetadata empty_md(std::vector<int64_t>(tensor.dim(), 0), std::vector<int64_t>(tensor.dim(), 0));
  const ShardMetadata& mine = placed ? meta.shards_metadata[chunk_of_rank[g.rank()]] : empty_md;
  const auto options =
      tensor.options().device(placed ? mine.placement()->device() : tensor.device()).requires_grad(false);
  // Unpadded, the scatter writes straight into the shard; padded, into a buffer the shard is
  // copied out of.
  const bool padded = mine.numel() < scatter_numel;
  at::Tensor local = at::empty(mine.shard_sizes(), options);
  at::Tensor received = padded ? at::empty({scatter_numel}, options) : local.view({-1});
  if (scatter_numel > 0) {
    at::NoGradGuard no_grad;
    std::vector<at::Tensor> pieces;
    if (g.rank() == src_rank) {
      at::Tensor src = tensor.detach();
      for (int r = 0; r < g.size(); ++r) {
        if (chunk_of_rank[r] < 0) {
          pieces.push_back(at::empty({scatter_numel}, tensor.options().requires_grad(false)));
          continue;
        }
        const ShardMetadata& m = meta.shards_metadata[chunk_of_rank[r]];
        at::Tensor piece = src.narrow(d, m.shard_offsets()[d], m.shard_sizes()[d]);
        if (piece.is_contiguous() && piece.numel() == scatter_numel) {
          pieces.push_back(piece.view({-1}));  // an even chunk of a contiguous tensor: no copy
        } else {
          at::Tensor buffer = at::empty({scatter_numel}, tensor.options().requires_grad(false));
          buffer.narrow(0, 0, piece.numel()).view(piece.sizes()).copy_(piece);
          pieces.push_back(buffer);
        }
      }
    }
    g.scatter(received, pieces, src_rank);
    if (padded) local.view({-1}).copy_(received.narrow(0, 0, mine.numel()));
  }
  local.set_requires_grad(tensor.requires_grad());
  std::vector<Shard> shards;
  if (placed) shards.emplace_back(local, mine);
  return ShardedTensor::init_from_local_shards_and_global_metadata(std::move(shards), meta, group, clone());
}

std::string ChunkShardingSpec::to_string() const {
  std::ostringstream os;
  os << "ChunkShardingSpec(dim=" << dim_ << ", placements=[";
  for (size_t i = 0; i < placements_.size(); ++i) os << (i ? ", " : "") << placements_[i];
  os << "])";
  return os.str();
}

nlohmann::json ChunkShardingSpec::to_json() const {
  return {{"type", "ChunkShardingSpec"}, {"dim", dim_}, {"placements", placements_}};
}

ChunkShardingSpec ChunkShardingSpec::from_json(const nlohmann::json& j) {
  TORCH_CHECK(j.at("type").get<std::string>() == "ChunkShardingSpec", "ChunkShardingSpec.from_json: got a ",
              j.at("type").get<std::string>());
  return ChunkShardingSpec(j.at("dim").get<int64_t>(), j.at("placements").get<std::vector<RemoteDevice>>());
}

// ---- EnumerableShardingSpec ------------------------------------------------------------------------

EnumerableShardingSpec::EnumerableShardingSpec(std::vector<ShardMetadata> shards) : shards_(std::move(shards)) {
  TORCH_CHECK(!shards_.empty(), "Empty shard list provided: []");
  for (const auto& s : shards_)
    TORCH_CHECK(s.shard_offsets().size() == shards_[0].shard_offsets().size(),
                "Found inconsistent ranks for shards: ", shards_[0].shard_offsets().size(), " and ",
                s.shard_offsets().size());
  validate_non_overlapping_shards_metadata(shards_);
}

ShardedTensorMetadata EnumerableShardingSpec::build_metadata(const std::vector<int64_t>& tensor_sizes,
                                                             const TensorProperties& tensor_properties) const {
  TORCH_CHECK(tensor_sizes.size() == shards_[0].shard_offsets().size(), to_string(), " has shards of ",
              shards_[0].shard_offsets().size(), " dims but the tensor has ", tensor_sizes.size(), " dims");
  check_tensor(shards_, tensor_sizes);
  ShardedTensorMetadata meta;
  meta.shards_metadata = shards_;
  meta.size = tensor_sizes;
  meta.tensor_properties = tensor_properties;
  return meta;
}

ShardedTensor EnumerableShardingSpec::shard(const at::Tensor& tensor, int src_rank, comm::GroupPtr group) const {
  if (!group) group = comm::default_group();
  comm::Group& g = *group;
  comm::detail::check_rank_arg(g, "EnumerableShardingSpec.shard", "src_rank", src_rank);
  TORCH_CHECK(tensor.defined(), "EnumerableShardingSpec.shard: the tensor is undefined");
  TORCH_CHECK(tensor.layout() == c10::kStrided, "EnumerableShardingSpec.shard: only strided tensors, got ",
              tensor.layout());
  // Metadata and placements first (the same on every rank: every rank throws alike).
  const ShardedTensorMetadata meta = build_metadata(tensor.sizes().vec(), TensorProperties::create_from_tensor(tensor));
  const std::vector<int> owners = placement_group_ranks(meta.shards_metadata, g);
  at::Tensor full;
  {
    at::NoGradGuard no_grad;
    full = tensor.detach().clone(at::MemoryFormat::Contiguous);
    if (full.numel() > 0) g.broadcast(full, src_rank);
  }
  std::vector<Shard> shards;
  for (size_t i = 0; i < owners.size(); ++i) {
    if (owners[i] != g.rank()) continue;
    const ShardMetadata& m = meta.shards_metadata[i];
    at::Tensor piece = full;
    for (size_t d = 0; d < m.shard_offsets().size(); ++d)
      piece = piece.narrow(static_cast<int64_t>(d), m.shard_offsets()[d], m.shard_sizes()[d]);
    at::Tensor local = piece.to(m.placement()->device()).clone(at::MemoryFormat::Contiguous);
    local.set_requires_grad(tensor.requires_grad());
    shards.emplace_back(local, m);
  }
  return ShardedTensor::init_from_local_shards_and_global_metadata(std::move(shards), meta, group, clone());
}

std::string EnumerableShardingSpec::to_string() const {
  std::ostringstream os;
  os << "EnumerableShardingSpec(shards=[";
  for (size_t i = 0; i < shards_.size(); ++i) os << (i ? ", " : "") << shards_[i];
  os << "])";
  return os.str();
}

nlohmann::json EnumerableShardingSpec::to_json() const {
  return {{"type", "EnumerableShardingSpec"}, {"shards", shards_}};
}

EnumerableShardingSpec EnumerableShardingSpec::from_json(const nlohmann::json& j) {
  TORCH_CHECK(j.at("type").get<std::string>() == "EnumerableShardingSpec",
              "EnumerableShardingSpec.from_json: got a ", j.at("type").get<std::string>());
  return EnumerableShardingSpec(j.at("shards").get<std::vector<ShardMetadata>>());
}

}  // namespace sharded
}  // namespace dtensor
