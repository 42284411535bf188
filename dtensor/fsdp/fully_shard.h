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
// post-backward runs: one reduce-scatter of the padded flat gradients (issued there and
// finished by the next group's post-backward or at the end of backward; summed, then divided by
// the data-parallel size or the gradient divide factor; HSDP adds an all-reduce over the
// replicate dim), the sharded .grad()s set (or accumulated), and the reshard after backward.
// Groups whose inputs need no gradient (the root, fed token ids) run their post-backward in a
// callback queued on the autograd engine at the end of the backward, in reverse forward
// order (PyTorch's _root_post_backward_final_callback).
// The collectives are issued asynchronously and overlap with compute (NOTE: [FSDP
// communication overlap]).
//
// NOTE: [FSDP communication overlap]
// As PyTorch's FSDP2 (_fsdp_param_group.py: unshard / wait_for_unshard, _prefetch_unshard,
// _backward_prefetch, reduce_scatter_state), with comm::Group's `_async` collectives (NOTE:
// [Async collectives] in dtensor/comm/work.h):
//   1. Unshard is two steps: issue (copy the shards into the flat all-gather input, issue
//      all_gather_into_async; the group's all-gather is then "in flight") and wait (wait, copy
//      out into the unsharded parameters, swap them into the modules). A module's pre-forward
//      issues its own all-gather unless it is unsharded or in flight, waits for it, and THEN
//      issues the all-gathers of its set_modules_to_forward_prefetch modules without waiting:
//      they run (on Gloo's worker threads, NCCL's stream) during this module's forward, and
//      each prefetched module waits in its own pre-forward. Pre-backward does the same with the
//      backward prefetch. A reshard of a group whose all-gather is in flight waits for it and
//      drops it (a buffer a collective writes is never freed), and so does the end of backward
//      for a prefetch no pre-hook waited for (FSDP2's finalize_backward): the group stays
//      sharded. Nothing unsharded is gathered again (reshard_after_forward=false: one
//      all-gather per group per step).
//   2. Default backward prefetch: a module without set_modules_to_backward_prefetch prefetches,
//      in its pre-backward, the module that ran its post-forward just before its own (reverse
//      post-forward order, one ahead), exactly as FSDP2's _backward_prefetch does by default:
//      backward runs the groups in reverse forward order, so that is the next group's
//      all-gather, issued while this group's backward computes. (A module used in forward but
//      not in backward makes it mistargeted, as in FSDP2: gathered, then dropped at the end of
//      backward.) Forward has no default prefetch: FSDP2's implicit forward prefetch is
//      the CPU running ahead of the GPU stream, which a CPU (or host-synchronous) step never
//      does; set_modules_to_forward_prefetch moves it earlier explicitly.
//   3. Memory bound: at most kMaxPrefetchedGroups groups are prefetched and not yet reached by
//      their own pre-hook (per root); a prefetch beyond that is skipped, and that group
//      gathers in its own pre-hook. With resharding after forward, at most the current group
//      plus two are unsharded (FSDP1's limit_all_gathers rate limiter also keeps two in flight;
//      FSDP2 bounds its implicit prefetch to one by stream order and leaves explicit lists
//      unbounded).
//   4. Post-backward issues the reduce-scatter (reduce_scatter_into_async) and leaves it pending
//      at the root; it runs during the next group's backward compute and is finished (waited,
//      HSDP's all-reduce over the replicate group issued then, the divide, the sharded
//      .grad()s written) when the next group's post-backward begins, before that group's
//      reduce-scatter input exists, so at most one is in flight and at most one input is alive
//      (FSDP2's post_backward drops reduce_scatter_state before foreach_reduce allocates the
//      next input), and by the root's final callback before backward() returns: gradients
//      are complete when backward() returns. The last group to finish its backward (all
//      others done) finishes its reduce-scatter at once, since nothing is left to overlap it
//      with. Every rank runs the same collectives in the same order as the blocking path, so
//      the results are bit-identical to it.
//   5. Memory, per group in flight (NOTE: [Async collectives] for who holds what): an
//      all-gather holds its output only (the input is this rank's block of it, FSDP2's
//      all_gather_copy_in); a reduce-scatter holds its output, and its input only while the
//      group needs it (ThreadGroup frees it when the round ran; c10d's Gloo work keeps it,
//      and the composed reduce_scatter's receive buffer, until the finish drops the Work).
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

#include <chrono>
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
  // functions chunk, gather and load them (NOTE: [FSDP extensions]). Unset: the one
  // set with set_fsdp_extensions on this rank, else DTensorExtensions when `mesh` was sliced
  // from a larger mesh, else none.
  std::shared_ptr<const FSDPExtensions> extensions;
};

// Prefetched groups (issued, not yet reached by their own pre-hook) per root: NOTE: [FSDP
// communication overlap], step 3.
constexpr int64_t kMaxPrefetchedGroups = 2;

// One event of an FSDP trace (FSDPModule::set_trace). Our addition: PyTorch marks the same
// points with profiler ranges (record_function "FSDP::all_gather", "FSDP::pre_forward",
// "FSDP::post_backward_reduce", ...); tests and benchmarks here read them as data instead.
struct FSDPTraceEvent {
  enum class Kind {
    kAllGatherIssued,        // the group's all-gather issued (its own pre-hook, a prefetch, unshard())
    kAllGatherWaited,        // awaited and copied out: the parameters are unsharded (a dropped
                             // all-gather, see FSDPModule::reshard, has no such event)
    kForwardBegin,           // the module's forward compute begins (its pre-forward is done)
    kForwardEnd,             // ... and ends (its post-forward begins)
    kBackwardBegin,          // the group's backward compute begins (its pre-backward is done)
    kBackwardEnd,            // ... and ends (its post-backward begins)
    kReduceScatterIssued,    // the gradients' reduce-scatter issued
    kReduceScatterFinished,  // awaited, reduced over replicate (HSDP), the sharded .grad()s written
  };
  Kind kind;
  std::string module_fqn;  // relative to the root module, "" for the root (PyTorch's _module_fqn)
  int64_t index = -1;      // position among the root's fully_shard-ed modules in module order (root 0)
  std::chrono::steady_clock::time_point time;
};
// "all_gather_issued", "forward_begin", ...
std::string to_string(FSDPTraceEvent::Kind kind);

class FSDPState;
struct FSDPModuleAccess;

// The FSDP state of one fully_shard-ed module (PyTorch's FSDPModule methods). Cheap to copy.
// fully_shard and get_fsdp_module make them.
class FSDPModule {
 public:
  // Collective (over the shard group). All-gathers this group's parameters and swaps the
  // unsharded tensors into the modules; the next forward then does not all-gather. Blocking
  // (waits for a prefetch of this group in flight, if any).
  void unshard();
  // Frees the unsharded parameters and swaps the sharded DTensors back in. A prefetch of this
  // group in flight is waited for and dropped.
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
  // Modules whose all-gather this module's pre-forward (pre-backward) issues, without waiting,
  // right after its own all-gather was awaited, so they run during this module's forward
  // (backward) compute (NOTE: [FSDP communication overlap]). The results are the same. An
  // empty backward list restores the default backward prefetch (the previous module in
  // forward order).
  void set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules);
  void set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules);
  // Gradients are summed then divided by `factor` instead of the data-parallel size.
  void set_gradient_divide_factor(double factor);
  // true: the gradient collectives only sum, and the division by the data-parallel size (or the
  // factor above) is applied to the reduced gradient, where by default each rank's gradient is
  // scaled before the sum as NCCL's AVG / PREMUL_SUM do (NOTE: [FSDP gradient divide]). This
  // group only, as PyTorch.
  void set_force_sum_reduction_for_comms(bool enable);
  // false: this group's pre-backward does not all-gather its parameters, for a group whose
  // backward does not read them (an embedding's gradient needs only the indices). Its
  // gradients are still reduced. Set it only when that holds: a backward that reads the
  // parameters then reads freed storage, which libtorch reports as an error.
  void set_unshard_in_backward(bool unshard_in_backward);
  // HSDP: false keeps the reduce-scattered gradients of this backward unreduced across the
  // replicate dim (added up backward after backward) and writes no gradient; the next backward
  // with true adds them in and all-reduces the sum once (gradient accumulation that
  // reduce-scatters every micro-batch but all-reduces only the last). No effect without a
  // replicate dim. Applies to this module and those below it (recurse = true).
  void set_requires_all_reduce(bool requires_all_reduce, bool recurse = true);
  // Called on the reduced flat gradient of this group (the reduce-scatter's output, after the
  // all-reduce over the replicate dim with HSDP) before it is divided and written to the
  // sharded .grad()s; it may change it in place (PyTorch: a custom all-reduce, e.g. over
  // another group). Empty: none.
  void set_all_reduce_hook(std::function<void(at::Tensor& reduce_output)> hook);

  torch::nn::Module& module() const;
  const DeviceMesh& mesh() const;
  // The group's sharded parameters (DTensors), in registration order.
  std::vector<at::Tensor> sharded_parameters() const;
  bool is_root() const;
  bool is_unsharded() const;
  // The extension this module's parameters go through (nullptr: plain FSDP). PyTorch:
  // _get_module_fsdp_state(m)._fsdp_extension.
  const FSDPExtensions* extensions() const;

  // Our addition (no PyTorch counterpart, see FSDPTraceEvent). On the root module (the one
  // whose forward the step calls): true starts recording the events of every group of its
  // forwards and backwards into a fresh trace (in the order they happen on this rank), false
  // stops. trace() returns the events recorded so far; read it between steps.
  void set_trace(bool enabled);
  std::vector<FSDPTraceEvent> trace() const;

 private:
  friend struct FSDPModuleAccess;  // the library's way in (dtensor/fsdp/fsdp_state_internal.h)
  explicit FSDPModule(std::shared_ptr<FSDPState> state) : state_(std::move(state)) {}
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

// PyTorch's fully_shard([m1, m2, ...]): one group over the parameters of several modules
// (NOTE: [FSDP over several modules]): one all-gather before the first of them runs forward,
// one reshard after the last, one reduce-scatter in backward. Each forward must run every
// module of the list once. The returned FSDPModule (and get_fsdp_module of each of them) is the
// group; its module() is the first. Throws, before anything changes, for an empty list, a null
// or repeated module, a module inside another of the list, and everything the one-module form
// throws for.
FSDPModule fully_shard(const std::vector<std::shared_ptr<torch::nn::Module>>& modules, FullyShardOptions options = {});

// The FSDP state of `module`, if fully_shard was applied to it.
std::optional<FSDPModule> get_fsdp_module(const torch::nn::Module& module);

}  // namespace fsdp
}  // namespace dtensor
