// dtensor/checkpoint/metadata.h
//
// MetadataIndex: names one object of a state dict, or one shard of a sharded tensor in it
// (torch.distributed.checkpoint.metadata.MetadataIndex).
//
//   MetadataIndex whole("fc.bias");                       // an object or a whole tensor
//   MetadataIndex shard("fc.weight", {{4, 0}});           // the shard starting at [4, 0]
//   MetadataIndex hinted("fc.weight", {{4, 0}}, 1);       // ... probably local shard 1
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

namespace dtensor {
namespace checkpoint {

struct MetadataIndex {
  MetadataIndex(std::string fqn, std::optional<std::vector<int64_t>> offset = std::nullopt,
                std::optional<int64_t> index = std::nullopt)
      : fqn(std::move(fqn)), offset(std::move(offset)), index(index) {}

  // Fully qualified name of the object ("layers.0.fc.weight").
  std::string fqn;
  // Global offset of a shard (its first element), for sharded tensors.
  std::optional<std::vector<int64_t>> offset;
  // Where the shard probably is among the local shards: a hint for a fast lookup, not part of
  // the identity (ignored by == and hash, as in PyTorch).
  std::optional<int64_t> index;

  bool operator==(const MetadataIndex& o) const { return fqn == o.fqn && offset == o.offset; }
  bool operator!=(const MetadataIndex& o) const { return !(*this == o); }
  std::size_t hash() const;
  // "MetadataIndex(fqn='fc.weight', offset=[4, 0], index=1)"
  std::string to_string() const;
};

std::ostream& operator<<(std::ostream& os, const MetadataIndex& index);

}  // namespace checkpoint
}  // namespace dtensor

namespace std {
template <>
struct hash<dtensor::checkpoint::MetadataIndex> {
  size_t operator()(const dtensor::checkpoint::MetadataIndex& i) const noexcept { return i.hash(); }
};
}  // namespace std
