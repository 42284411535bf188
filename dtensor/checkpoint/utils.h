// dtensor/checkpoint/utils.h
//
// Looking up state-dict objects and tensor shards by MetadataIndex, the way a checkpoint
// planner finds what to write or where to read into (torch.distributed.checkpoint.utils'
// find_state_dict_object, find_tensor_shard, _find_shard), and small helpers of that module.
//
//   StateDict sd{{"fc.weight", sharded_weight}, {"step", c10::IValue(100)}};
//   at::Tensor shard = std::get<at::Tensor>(
//       find_state_dict_object(sd, MetadataIndex("fc.weight", {{4, 0}})));   // this rank's rows 4..
//
// Nothing here is collective.
#pragma once

#include "dtensor/checkpoint/metadata.h"
#include "dtensor/sharded/sharded_tensor.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <string>
#include <variant>

namespace dtensor {
namespace checkpoint {

// One state-dict value: a tensor (plain or DTensor), a ShardedTensor, or any other object.
using StateDictValue = std::variant<at::Tensor, sharded::ShardedTensor, c10::IValue>;
// (PyTorch: STATE_DICT_TYPE.)
using StateDict = std::map<std::string, StateDictValue>;

// The local shard of `tensor` starting at index.offset (index.index, when given, is tried
// first). Throws "Cannot lookup <fqn> since its a ShardedTensor and no offset was provided" and
// "Could not find shard at '<offset>' for FQN: '<fqn>'". (PyTorch: _find_shard.)
sharded::Shard find_shard(const sharded::ShardedTensor& tensor, const MetadataIndex& index);

// The shard of `tensor` that `index` names: for a DTensor its local tensor (PyTorch's
// DTensor.__get_tensor_shard__); for a plain tensor the tensor itself, which only an offset of
// all zeros (or none) can name, else "FQN: '<fqn>' is not a ShardedTensor, can't find by offset:
// '<offset>'". (PyTorch: find_tensor_shard.)
at::Tensor find_tensor_shard(const at::Tensor& tensor, const MetadataIndex& index);
at::Tensor find_tensor_shard(const sharded::ShardedTensor& tensor, const MetadataIndex& index);

// state_dict[index.fqn], narrowed to the shard `index` names when it is a tensor (returned as
// an at::Tensor). Throws "Could not find FQN: '<fqn>'", and for an object that is not a tensor
// but is looked up by offset, "FQN: '<fqn>' is not a ShardedTensor, can't find by offset".
// (PyTorch: find_state_dict_object.)
StateDictValue find_state_dict_object(const StateDict& state_dict, const MetadataIndex& index);

// "cpu" for the CPU, else "<device_type>:<device_id>". (PyTorch: _normalize_device_info.)
std::string normalize_device_info(const std::string& device_type, int64_t device_id);

}  // namespace checkpoint
}  // namespace dtensor
