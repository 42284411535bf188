// dtensor/fsdp/fully_shard.h
//
// FSDP2 in C++: the counterpart of torch.distributed.fsdp.fully_shard (DESIGN.md D9). Every
// parameter of a fully_shard-ed module becomes a DTensor sharded on dim 0 over the
// data-parallel mesh (a leaf that optimizers step directly), and each fully_shard-ed module is
// one communication group: before its forward one all-gather of the group's shards in ONE flat
// buffer, copied out into the unsharded parameters; after forward a reshard (per
// reshard_after_forward); before its backward an unshard again; after backward one
// reduce-scatter of the padded flat gradients, which become the sharded DTensor .grad()s.
//
//   dtensor::models::Transformer model(args);
//   auto mesh = dtensor::init_device_mesh("cpu", {4});
//   dtensor::fsdp::FullyShardOptions opts;
//   opts.mesh = mesh;
//   for (auto& block : *model->layers) dtensor::fsdp::fully_shard(*block, opts);  // bottom-up
//   dtensor::fsdp::FSDPModule root = dtensor::fsdp::fully_shard(*model, opts);
//   torch::optim::Adam opt(dtensor::nn::parameters(*model), 1e-3);        // sharded DTensors
//   at::Tensor loss = dtensor::nn::call(model, tokens).sum();   // call(): the hooks run
//   loss.backward();                                            // .grad(): sharded DTensors
//   opt.step();
//
// The module must be called through dtensor::nn::call (its forward hooks run there; the
// reference models call their children that way), and owned by a std::shared_ptr.
//
// NOTE: [FSDP parameter layout]
// A parameter of global size d on the shard dim is chunked like torch.chunk over the ws ranks
// of the shard group: every rank holds ceil(d/ws) rows internally (padding), rank r's DTensor
// shard is the first min(ceil(d/ws), max(0, d - r*ceil(d/ws))) of them (uneven shards, and
// empty ones, are normal DTensor Shard shards). A group's all-gather input is the
// concatenation of its parameters' padded shards, flattened; the output holds ws such blocks,
// rank-major, and each unsharded parameter is the concatenation of its rows from every block.
// Gradients take the same layout into the reduce-scatter.
//
// NOTE: [FSDP hooks]
// Forward: a pre-hook (lazy init at the root's first forward, casting inputs under mixed
// precision, unshard, the unsharded parameters swapped into the modules with
// dtensor::nn::swap_parameter, an identity autograd function on each input that requires
// grad) and a post-hook (reshard per reshard_after_forward, the sharded DTensors swapped back;
// a gradient hook registered on each output that requires grad).
// Backward: the first output-gradient hook of a group unshards it again (all-gather, into the
// same storage, so tensors saved for backward see the values); when the gradient of the
// group's input is complete (the identity's backward: the group's backward is done), its
// post-backward runs: one reduce-scatter of the padded flat gradients (summed, then divided by
// the data-parallel size or the gradient divide factor; HSDP adds an all-reduce over the
// replicate dim), the sharded .grad()s set (or accumulated), and the reshard after backward.
// Groups whose inputs need no gradient (the root, fed token ids) run their post-backward in a
// callback queued on the autograd engine at the end of the backward, in reverse forward
// order (PyTorch's _root_post_backward_final_callback).
//
// 2-D, FSDP x tensor parallel: parameters that are already DTensors on the "tp" sub-mesh of a
// (dp, tp) mesh (parallelize_module / Transformer::parallelize) are sharded over mesh["dp"] into
// DTensors on the parent mesh with placements (Shard(0), <TP placement>), whose full_tensor()
// is the original parameter; forward and backward all-gather and reduce-scatter over dp only,
// the TP collectives are unchanged (NOTE: [FSDP over tensor-parallel parameters]).
//
//   auto mesh = dtensor::init_device_mesh("cpu", {2, 2}, {"dp", "tp"});
//   dtensor::parallelize_module(*mlp, mesh["tp"], plan);
//   dtensor::fsdp::FullyShardOptions opts;
//   opts.mesh = mesh["dp"];
//   dtensor::fsdp::fully_shard(*mlp, opts);   // mlp->net2->weight: (Shard(dim=0), Shard(dim=1))
//
// Collective: fully_shard is NOT collective (each rank chunks its own copy, as PyTorch does),
// but every rank must apply it to the same module structure with the same options, and call
// forward/backward the same number of times with the same shapes.
#pragma once

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/placement/placement.h"

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace dtensor {
namespace fsdp {

class FSDPExtensions;  // dtensor/fsdp/extensions.h

// torch.distributed.fsdp.MixedPrecisionPolicy. param_dtype: dtype of the all-gather and of
// the unsharded parameters (forward and backward compute); reduce_dtype: dtype of the
// gradient reduce-scatter (default: param_dtype); output_dtype: forward outputs cast to it;
// cast_forward_inputs: floating inputs cast to param_dtype before forward.
struct MixedPrecisionPolicy {
  std::optional<at::ScalarType> param_dtype;
  std::optional<at::ScalarType> reduce_dtype;
  std::optional<at::ScalarType> output_dtype;
  bool cast_forward_inputs = true;
};

// torch.distributed.fsdp.CPUOffloadPolicy when `offload` is true: sharded parameters and their
// gradients live on the CPU; they are copied to the mesh's device for the all-gather and the
// reduced gradients back to the CPU (on a CPU mesh the copies are no-ops, the path runs).
struct OffloadPolicy {
  bool offload = false;
  bool pin_memory = false;
};

// true: reshard after forward (free the unsharded parameters); false: keep them for backward;
// an int n: reshard to groups of n consecutive ranks of the shard group (n must divide it;
// n == shard size is true, n == 1 is false).
class ReshardAfterForward {
 public:
  ReshardAfterForward(bool reshard) : value_(reshard ? -1 : 1) {}  // NOLINT: implicit like Python
  ReshardAfterForward(int size) : value_(size), is_int_(true) {}   // NOLINT
  ReshardAfterForward(int64_t size) : value_(size), is_int_(true) {}  // NOLINT
  bool is_int() const { return is_int_; }
  // -1: true; 1: false; otherwise the group size.
  int64_t value() const { return value_; }
  std::string to_string() const;

 private:
  int64_t value_;
  bool is_int_ = false;
};

struct FullyShardOptions {
  // 1-D (FSDP) or 2-D (replicate, shard) (HSDP). Default: 1-D over the default group.
  std::optional<DeviceMesh> mesh;
  // Unset: true, except for the root (the module whose forward runs first), which keeps its
  // parameters unsharded after forward since backward needs them at once (PyTorch's default).
  std::optional<ReshardAfterForward> reshard_after_forward;
  MixedPrecisionPolicy mp_policy;
  OffloadPolicy offload_policy;
  // Parameters left alone (neither sharded nor managed).
  std::vector<at::Tensor> ignored_params;
  // Per parameter: the Shard dim to use instead of Shard(0) (std::nullopt: Shard(0)).
  std::function<std::optional<Shard>(const at::Tensor& param)> shard_placement_fn;
  // How parameters that are already DTensors are flattened and rebuilt, and how the state-dict
  // functions chunk, gather and load them (seed 004, NOTE: [FSDP extensions]). Unset: the one
  // set with set_fsdp_extensions on this rank, else DTensorExtensions when `mesh` was sliced
  // from a larger mesh, else none.
  std::shared_ptr<const FSDPExtensions> extensions;
};

class FSDPState;

// The FSDP state of one fully_shard-ed module (PyTorch's FSDPModule methods). Cheap to copy.
class FSDPModule {
 public:
  explicit FSDPModule(std::shared_ptr<FSDPState> state) : state_(std::move(state)) {}

  // Collective (over the shard group). All-gathers this group's parameters and swaps the
  // unsharded tensors into the modules; the next forward then does not all-gather.
  void unshard();
  // Frees the unsharded parameters and swaps the sharded DTensors back in.
  void reshard();
  // false: backward accumulates unsharded gradients without reduce-scatter (gradient
  // accumulation); the next backward with true reduces the accumulated sum. Applies to this
  // module and every fully_shard-ed module below it (recurse = true).
  void set_requires_gradient_sync(bool requires_gradient_sync, bool recurse = true);
  void set_reshard_after_forward(ReshardAfterForward reshard, bool recurse = true);
  void set_reshard_after_backward(bool reshard, bool recurse = true);
  // With false, the end of backward leaves reshard-after-backward to the user (PyTorch: the
  // root's final callback still runs post-backward but skips resharding).
  void set_is_last_backward(bool is_last_backward);
  // Modules whose all-gather is issued right after this module's (forward) / before this
  // module's backward all-gather is awaited. On a CPU mesh prefetching only moves the
  // all-gather earlier; the results are the same.
  void set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules);
  void set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules);
  // Gradients are summed then divided by `factor` instead of the data-parallel size.
  void set_gradient_divide_factor(double factor);

  torch::nn::Module& module() const;
  const DeviceMesh& mesh() const;
  // The group's sharded parameters (DTensors), in registration order.
  std::vector<at::Tensor> sharded_parameters() const;
  bool is_root() const;
  bool is_unsharded() const;
  // The extension this module's parameters go through (nullptr: plain FSDP). PyTorch:
  // _get_module_fsdp_state(m)._fsdp_extension.
  const FSDPExtensions* extensions() const;
  const std::shared_ptr<FSDPState>& state() const { return state_; }

 private:
  std::shared_ptr<FSDPState> state_;
};

// Shards `module`'s parameters not already managed by a fully_shard-ed descendant (apply it
// to the blocks first, then to the root). Throws, before anything changes, naming the module
// and parameter: a parameter that is a scalar or not contiguous, a module already
// fully_shard-ed, a mesh without this rank or with more than 2 dims, a reshard_after_forward
// int that does not divide the shard group, parameters of several dtypes in one group, a
// parameter shared with another group; a DTensor parameter whose mesh and the FSDP mesh are
// not sub-meshes of one parent mesh (FSDP dims first, then one tensor-parallel dim), or whose
// placement is Partial.
FSDPModule fully_shard(torch::nn::Module& module, FullyShardOptions options = {});
template <class Impl>
FSDPModule fully_shard(const torch::nn::ModuleHolder<Impl>& module, FullyShardOptions options = {}) {
  return fully_shard(*module.ptr(), std::move(options));
}

// The FSDP state of `module`, if fully_shard was applied to it.
std::optional<FSDPModule> get_fsdp_module(const torch::nn::Module& module);

}  // namespace fsdp
}  // namespace dtensor
