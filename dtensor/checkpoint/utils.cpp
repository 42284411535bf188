// dtensor/checkpoint/utils.cpp: state-dict lookups.
#include "dtensor/checkpoint/utils.h"

#include "dtensor/tensor/dtensor.h"

#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>

#include <sstream>

namespace dtensor {
namespace checkpoint {

namespace {

std::string offset_str(const std::vector<int64_t>& offset) {
  std::ostringstream os;
  os << c10::IntArrayRef(offset);
  return os.str();
}

[[noreturn]] void not_sharded(const MetadataIndex& index) {
  TORCH_CHECK(false, "FQN: '", index.fqn, "' is not a ShardedTensor, can't find by offset: '",
              offset_str(*index.offset), "'");
}

}  // namespace

sharded::Shard find_shard(const sharded::ShardedTensor& tensor, const MetadataIndex& index) {
  TORCH_CHECK(index.offset.has_value(), "Cannot lookup ", index.fqn,
              " since its a ShardedTensor and no offset was provided");
  const auto& shards = tensor.local_shards();
  // The index is a hint: use it when it points at the right shard.
  if (index.index && *index.index >= 0 && static_cast<size_t>(*index.index) < shards.size() &&
      shards[*index.index].metadata.shard_offsets() == *index.offset)
    return shards[*index.index];
  for (const auto& shard : shards)
    if (shard.metadata.shard_offsets() == *index.offset) return shard;
  TORCH_CHECK(false, "Could not find shard at '", offset_str(*index.offset), "' for FQN: '", index.fqn, "'");
}

at::Tensor find_tensor_shard(const at::Tensor& tensor, const MetadataIndex& index) {
  if (is_dtensor(tensor)) return dtensor::local_tensor(tensor);
  if (index.offset) {
    if (*index.offset == std::vector<int64_t>(tensor.dim(), 0)) return tensor;
    not_sharded(index);
  }
  return tensor;
}

at::Tensor find_tensor_shard(const sharded::ShardedTensor& tensor, const MetadataIndex& index) {
  return find_shard(tensor, index).tensor;
}

StateDictValue find_state_dict_object(const StateDict& state_dict, const MetadataIndex& index) {
  auto it = state_dict.find(index.fqn);
  TORCH_CHECK(it != state_dict.end(), "Could not find FQN: '", index.fqn, "'");
  const StateDictValue& obj = it->second;
  if (const auto* t = std::get_if<at::Tensor>(&obj)) return find_tensor_shard(*t, index);
  if (const auto* st = std::get_if<sharded::ShardedTensor>(&obj)) return find_tensor_shard(*st, index);
  const auto& value = std::get<c10::IValue>(obj);
  if (value.isTensor()) return find_tensor_shard(value.toTensor(), index);
  if (index.offset) not_sharded(index);
  return obj;
}

std::string normalize_device_info(const std::string& device_type, int64_t device_id) {
  if (device_type == "cpu") return "cpu";
  return device_type + ":" + std::to_string(device_id);
}

}  // namespace checkpoint
}  // namespace dtensor
