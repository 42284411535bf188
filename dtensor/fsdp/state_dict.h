// dtensor/fsdp/state_dict.h
//
// State dicts of fully_shard-ed models (PyTorch: model.state_dict() with DTensor parameters,
// torch.distributed.checkpoint.state_dict's get/set_model_state_dict with full_state_dict).
//
//   auto sharded = dtensor::fsdp::sharded_state_dict(*model);   // DTensors, no communication
//   auto full = dtensor::fsdp::full_state_dict(*model);         // collective: plain tensors
//   dtensor::fsdp::load_state_dict(*other, full);               // each rank keeps its shard
//
// Names are those of named_parameters() then named_buffers(), tied parameters once (under
// their first name). Optimizer state of a sharded parameter (Adam's exp_avg, exp_avg_sq) is
// created by the optimizer like the parameter, so it is a DTensor with the parameter's spec;
// shard_like() turns a full saved state tensor into that shard.
#pragma once

#include "dtensor/sharded/sharded_tensor.h"

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace dtensor {
namespace fsdp {

using StateDict = std::vector<std::pair<std::string, at::Tensor>>;

// Parameters (the sharded DTensors of fully_shard-ed modules, even while unsharded; plain
// tensors for others) and buffers, detached. No communication.
StateDict sharded_state_dict(const torch::nn::Module& module);

// Collective over the meshes of the sharded parameters (every rank): every value as a full
// plain tensor. rank0_only: only global rank 0 gets the entries (others get an empty dict).
StateDict full_state_dict(const torch::nn::Module& module, bool rank0_only = false);

// Collective over the meshes of the sharded parameters: the state dict of the unsharded module.
// Each parameter sharded by fully_shard is all-gathered over the FSDP dims only (PyTorch's
// all_gather_dtensor): a 2-D (FSDP x TP) parameter becomes the tensor-parallel DTensor it was
// before fully_shard, which a tensor-parallel-only model loads (FSDP x TP -> TP); a 1-D one the
// full plain tensor. Other entries as they are.
StateDict unsharded_state_dict(const torch::nn::Module& module);

// Copies `state` into the module's parameters and buffers, by name. Into a sharded parameter:
// a DTensor value is redistributed to the parameter's mesh and placements (collective; any
// placements), or, into a 2-D (FSDP x TP) parameter, may be a tensor-parallel DTensor on the tp
// mesh (TP -> FSDP x TP: the extensions' chunk_dtensor lifts it to the parent mesh, then it is
// redistributed); a plain value is the full tensor and each rank keeps its shard (no
// communication). Into a plain parameter: the value (full_tensor of a DTensor). strict: every
// name must match both ways. Checks names and shapes before writing anything; errors name the
// entry.
void load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true);

// FSDP1's SHARDED_STATE_DICT form (NOTE: [ShardedTensor state dicts] in state_dict.cpp): each
// parameter sharded by fully_shard as a ShardedTensor chunked along dim 0 over the FSDP shard
// group by the extension's chunk_tensor; for a 2-D (FSDP x TP) parameter with
// DTensorExtensions a ShardedTensor over the tp group whose local shard is a nested
// ShardedTensor (this rank's TP shard chunked over the shard group). Other entries as tensors.
using ShardedTensorStateDict = std::vector<std::pair<std::string, std::variant<at::Tensor, sharded::ShardedTensor>>>;

// Collective (FSDP1 all-gathers each parameter before chunking it: over the FSDP dims for a 2-D
// parameter, the whole mesh for a plain one).
ShardedTensorStateDict sharded_tensor_state_dict(const torch::nn::Module& module);

// Collective over each parameter's shard group. Loads sharded_tensor_state_dict's form into a
// model sharded alike (same meshes and FSDP shard group size; shard_placement_fn may differ):
// each ShardedTensor goes through the extension's pre_load_state_dict_transform, its chunks are
// all-gathered over the shard group and this rank keeps its shard. Tensor values load as in
// load_state_dict. Checks names, shapes, dtypes and that this rank holds exactly its torch.chunk
// rows before loading anything; errors name the entry.
void load_sharded_tensor_state_dict(torch::nn::Module& module, const ShardedTensorStateDict& state, bool strict = true);

// This rank's shard of the full plain tensor `full`, as a DTensor with the spec of the
// DTensor `like` (Shard and Replicate placements; no communication).
at::Tensor shard_like(const at::Tensor& full, const at::Tensor& like);

}  // namespace fsdp
}  // namespace dtensor
