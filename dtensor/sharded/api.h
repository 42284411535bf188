// dtensor/sharded/api.h
//
// Sharding tensors, module parameters and whole modules, and the process group ShardedTensors
// are loaded with (torch.distributed._shard.api).
//
//   using namespace dtensor::sharded;
//   ChunkShardingSpec spec(0, {"rank:0/cpu", "rank:1/cpu", "rank:2/cpu", "rank:3/cpu"});
//   ShardedTensor st = shard_tensor(weight, spec);          // collective: rank 0's values
//   shard_module(*mlp, plan);                               // collective: see sharding_plan.h
//   at::Tensor y = dtensor::nn::call(mlp, x);               // hooks run through call()
//
//   {
//     LoadWithProcessGroupGuard guard(subgroup);            // ShardedTensors loaded here
//     ShardedTensor loaded = ShardedTensor::from_state(saved);   // ... belong to `subgroup`
//   }
#pragma once

#include "dtensor/comm/group.h"
#include "dtensor/nn/hooks.h"
#include "dtensor/sharded/sharded_tensor.h"
#include "dtensor/sharded/sharding_plan.h"
#include "dtensor/sharded/sharding_spec.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Scalar.h>
#include <c10/core/TensorOptions.h>

#include <memory>
#include <string>

namespace dtensor {
namespace sharded {

// ---- Factories (torch.distributed._shard.sharded_tensor.empty / ones / zeros / full / rand /
// randn and their *_like forms) ----------------------------------------------------------------
//
// A ShardedTensor of global size `size` laid out by `sharding_spec`: each rank creates only the
// shards the spec places on it (its global rank in `process_group`, default: the default
// group), so nothing is communicated. `options` gives the dtype and requires_grad (the shards
// are then leaves that require grad). rand / randn draw each shard from this rank's generator
// (the values depend on the rank, as in PyTorch). Every rank must pass the same arguments.
//
//   ChunkShardingSpec spec(0, {"rank:0/cpu", "rank:1/cpu", "rank:2/cpu", "rank:3/cpu"});
//   ShardedTensor st = dtensor::sharded::ones(spec, {10, 4});   // rows 3,3,3,1
ShardedTensor empty(const ShardingSpec& sharding_spec, std::vector<int64_t> size, at::TensorOptions options = {},
                    comm::GroupPtr process_group = nullptr);
ShardedTensor zeros(const ShardingSpec& sharding_spec, std::vector<int64_t> size, at::TensorOptions options = {},
                    comm::GroupPtr process_group = nullptr);
ShardedTensor ones(const ShardingSpec& sharding_spec, std::vector<int64_t> size, at::TensorOptions options = {},
                   comm::GroupPtr process_group = nullptr);
ShardedTensor full(const ShardingSpec& sharding_spec, std::vector<int64_t> size, const at::Scalar& fill_value,
                   at::TensorOptions options = {}, comm::GroupPtr process_group = nullptr);
ShardedTensor rand(const ShardingSpec& sharding_spec, std::vector<int64_t> size, at::TensorOptions options = {},
                   comm::GroupPtr process_group = nullptr);
ShardedTensor randn(const ShardingSpec& sharding_spec, std::vector<int64_t> size, at::TensorOptions options = {},
                    comm::GroupPtr process_group = nullptr);
// The same size, spec and group as `like`, and its dtype and requires_grad unless `options`
// sets them (PyTorch: torch.zeros_like(st, dtype=..., requires_grad=...)).
ShardedTensor empty_like(const ShardedTensor& like, at::TensorOptions options = {});
ShardedTensor zeros_like(const ShardedTensor& like, at::TensorOptions options = {});
ShardedTensor ones_like(const ShardedTensor& like, at::TensorOptions options = {});
ShardedTensor full_like(const ShardedTensor& like, const at::Scalar& fill_value, at::TensorOptions options = {});
ShardedTensor rand_like(const ShardedTensor& like, at::TensorOptions options = {});
ShardedTensor randn_like(const ShardedTensor& like, at::TensorOptions options = {});

// Collective over `group` (nullptr: the default group). Shards `tensor` as `sharding_spec`
// says, with the values of group rank `src_rank`. Before any data moves, one object all_gather
// checks that every rank passed the same src_rank and spec, and a contiguous tensor of the same
// size and dtype; otherwise EVERY rank raises, e.g.
//   "src_rank=0 on rank: 2 does not match with src_rank=1 on rank: 3"
//   "input tensor is not a contiguous Tensor (on rank 1)"
// (PyTorch: _shard_tensor; it checks contiguity before the all_gather, on one rank only.)
ShardedTensor shard_tensor(const at::Tensor& tensor, const ShardingSpec& sharding_spec, int src_rank = 0,
                           comm::GroupPtr group = nullptr);

// Collective over `process_group` (nullptr: the default group). Shards parameter `param_name`
// of `module` (not of its children) with shard_tensor and puts the result in its place as a
// DTensor (NOTE: [ShardedTensor and DTensor] in sharded_tensor.h; read it back with
// ShardedTensor::from_dtensor). The parameter keeps its requires_grad. The parameter's checks
// travel with shard_tensor's all_gather, so a rank that fails one makes every rank raise:
//   "<Module> has no attribute `name`", "Expected <Module>.name to be a Tensor parameter, but
//   found a buffer", "param: name is not a contiguous Tensor (on rank r)", and the
//   ShardedTensor/DTensor layout needs (one placement per rank). The module's other
//   parameters stay plain tensors: DTensor ops refuse to mix the two, so call the module
//   through shard_module (which replicates them) or give it DTensor inputs and parameters.
// (PyTorch: shard_parameter.)
void shard_parameter(torch::nn::Module& module, const std::string& param_name, const ShardingSpec& sharding_spec,
                     int src_rank = 0, comm::GroupPtr process_group = nullptr);

// Forward hook (run by dtensor::nn::call): a DTensor output on a 1-D mesh (sharded, replicated
// or partial: PyTorch's ShardedTensor and _PartialTensor) is resharded to `resharding_spec`, a
// ChunkShardingSpec with one placement per rank of the mesh. In the mesh's rank order this is
// a differentiable redistribute; in another order the data moves as a ShardedTensor reshard,
// which autograd cannot follow (an output that requires grad is then an error). A DTensor
// output on a mesh of 2 or more dims is an error (a ChunkShardingSpec is 1-D). Outputs that are
// not DTensors pass unchanged. Collective at each call. (PyTorch: _reshard_output.)
nn::RemovableHandle reshard_output(torch::nn::Module& module, std::shared_ptr<const ShardingSpec> resharding_spec);

// Forward hook: a DTensor output with Shard(d) on a 1-D mesh becomes this rank's local shard
// (differentiably), with dim d squeezed away when it has size 1 there; other outputs pass
// unchanged. (PyTorch: _collect_local_shard.)
nn::RemovableHandle collect_local_shard(torch::nn::Module& module);

// Collective over `process_group`. Applies `plan` (sharding_plan.h) to `module`:
//   1. checks the whole plan first, on every rank, and raises on every rank if any rank finds
//      a problem (PyTorch raises as it goes, after some parameters moved):
//        "Only `ShardingSpec` and `Sharder` are supported to shard 'name'" (empty entry),
//        "ShardingPlan is in-valid, trying to shard a parameter: p, but there's already a
//         Sharder entry for module m, ..." (a parameter inside a Sharder's submodule tree),
//        "Module path must not be empty for custom sharder!",
//        "Only `ShardingSpec` is supported as output_plan for 'path'",
//        "<Module> has no attribute `x`" (unknown module or parameter), and plans that differ
//        between ranks;
//   2. shards each parameter (shard_parameter, values of group rank `src_rank`) and runs each
//      Sharder, in plan order;
//   3. makes every module with a sharded parameter runnable on DTensors: its other parameters
//      become Replicate DTensors of their own values, and a forward pre-hook turns plain tensor
//      inputs into Replicate DTensors (what PyTorch's sharded ops assumed);
//   4. registers the output_plan (reshard_output) and return_local_tensor
//      (collect_local_shard) hooks.
// Hooks run when the modules are called through dtensor::nn::call (models/ call their children
// that way). (PyTorch: shard_module.)
void shard_module(torch::nn::Module& module, const ShardingPlan& plan, int src_rank = 0,
                  comm::GroupPtr process_group = nullptr);

// The submodule at dotted `path` ("" is `module` itself); throws "<Module> has no attribute
// `name`" naming the first missing step. (PyTorch: nn.Module.get_submodule.)
torch::nn::Module& get_submodule(torch::nn::Module& module, const std::string& path);

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
