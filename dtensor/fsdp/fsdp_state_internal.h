// dtensor/fsdp/fsdp_state_internal.h: the state behind one fully_shard-ed module (PyTorch's FSDPState
// with its FSDPParamGroup and FSDPParams). Internal to dtensor/fsdp; users hold FSDPModule.
#pragma once

#include "dtensor/comm/group.h"
#include "dtensor/fsdp/extensions.h"
#include "dtensor/fsdp/fully_shard.h"
#include "dtensor/nn/hooks.h"
#include "dtensor/placement/placement.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace dtensor {
namespace fsdp {

// One registration of a managed parameter: module `module` holds it under `name` (a tied
// parameter has several).
struct Registration {
  torch::nn::Module* module;
  std::string name;
};

// One sharded parameter (NOTE: [FSDP parameter layout]).
struct FSDPParam {
  std::string fqn;  // relative to the fully_shard-ed module
  std::vector<Registration> regs;
  // The DTensor leaf the modules hold between forwards and optimizers step.
  at::Tensor sharded;
  int64_t shard_dim = 0;
  // The shape FSDP shards and all-gathers: the parameter's, or for a tensor-parallel DTensor
  // its local (TP) shape (NOTE: [FSDP over tensor-parallel parameters]).
  std::vector<int64_t> global_shape;
  // For a tensor-parallel DTensor parameter: the param extension pre_flatten_transform gave (its
  // spec before fully_shard); post_unflatten_transform builds the unsharded parameter from it.
  ParamExtension tp_spec;
  std::vector<int64_t> padded_shard_shape;  // global_shape with ceil(d/ws) on shard_dim
  int64_t padded_numel = 0;
  int64_t chunk = 0;  // ceil(d/ws)
  at::ScalarType orig_dtype = at::kFloat;
  bool requires_grad = true;
  // The all-gathered data (storage freed while sharded), in the shape global_shape.
  at::Tensor unsharded;
  // The leaf the modules hold while unsharded, whose .grad() the reduce-scatter reduces:
  // `unsharded` itself, or for a tensor-parallel parameter the TP DTensor over it, made by the
  // extension's post_unflatten_transform at the first all-gather and reused (same storage)
  // after (undefined until then).
  at::Tensor unsharded_param;
  // Unsharded gradient accumulated while gradient sync is off.
  at::Tensor accumulated_grad;
  // HSDP: this rank's reduce-scattered gradient (padded, flat) held while the all-reduce over
  // the replicate dim is off (FSDPModule::set_requires_all_reduce).
  at::Tensor partial_reduce_output;

  // Rows (on shard_dim) of the shard of shard-group rank `rank`.
  int64_t rows_of(int64_t rank) const;
  void swap_into_modules(const at::Tensor& value) const;
};

// How fully_shard lays out a tensor-parallel parameter (NOTE: [FSDP over tensor-parallel
// parameters]): the spec it had, and the sharded DTensor's mesh (the parent of the FSDP and TP
// meshes) and placements (the FSDP placements, then the TP placement).
struct TPSharding {
  DTensorSpec tp_spec;
  DeviceMesh spmd_mesh;
  std::vector<Placement> spmd_placements;
  bool requires_grad = true;  // the parameter's (its local tensor never requires grad)
};

class FSDPState;

// A group's all-gather issued by unshard() and not yet copied out by wait_for_unshard()
// (NOTE: [FSDP communication overlap] in fully_shard.h). The buffers are declared before the
// Work so that the Work, whose destructor waits for the collective, is destroyed first: a
// buffer a collective writes or reads is never freed under it.
struct AllGatherInFlight {
  at::Tensor input;   // the flat all-gather input (this rank's block of `output`, or the post-forward piece)
  at::Tensor output;  // shard group size x the flat input, written by the collective
  comm::WorkPtr work;
};

// A reduce-scatter issued by post_backward, finished (awaited, the HSDP all-reduce, the divide,
// the sharded .grad()s written) when the next group's post_backward begins or by the root's
// final callback. Held by the root: at most one in flight (PyTorch's reduce_scatter_state).
// The input is not held here: the group holds it while the collective needs it (NOTE: [Async
// collectives] in dtensor/comm/work.h), so it is freed as soon as the collective completes.
struct PendingReduceScatter {
  std::weak_ptr<FSDPState> state;  // the group whose gradients these are
  std::vector<bool> has_grad;      // per parameter of the group: in the flat input
  // Applied when finished (NOTE: [FSDP gradient divide]): the all-reduce input's scale (HSDP)
  // and the output's divisor.
  double all_reduce_premul = 1, post_divide = 1;
  at::Tensor output;               // before `work`, see AllGatherInFlight
  comm::WorkPtr work;
};

// NOTE: [FSDP state registry]
// The fully_shard-ed modules of the process (every rank thread's): fully_shard looks up whether a
// module or a child is already sharded and which parameters another group holds; the
// post-backward autograd function finds its group by id (its context holds IValues only). One
// object owns both maps. It holds the states weakly: a state lives as long as its module's
// hooks, and an entry whose state died is dropped at the next registration.
class StateRegistry {
 public:
  static StateRegistry& instance();
  // The live state fully_shard made for `module` (nullptr when none, or when it died).
  std::shared_ptr<FSDPState> lookup(const torch::nn::Module& module) const;
  // Every live state (any module, any rank thread).
  std::vector<std::shared_ptr<FSDPState>> live() const;
  // Registers `state` for `module`; returns its id.
  int64_t add(const torch::nn::Module& module, const std::shared_ptr<FSDPState>& state);
  std::shared_ptr<FSDPState> by_id(int64_t id) const;

 private:
  StateRegistry() = default;
  mutable std::mutex mu_;
  std::unordered_map<const torch::nn::Module*, std::weak_ptr<FSDPState>> by_module_;
  std::unordered_map<int64_t, std::weak_ptr<FSDPState>> by_id_;
  int64_t next_id_ = 0;
};

// The module's type name, for messages.
std::string module_type(const torch::nn::Module& m);

class FSDPState : public std::enable_shared_from_this<FSDPState> {
 public:
  enum class Status { kSharded, kPostForward, kUnsharded };

  FSDPState(torch::nn::Module& module, FullyShardOptions options, DeviceMesh mesh);

  // The module while alive (nullptr after its death).
  const torch::nn::Module* module_alive() const;
  std::vector<Placement> placements_for(int64_t shard_dim) const;
  at::ScalarType compute_dtype() const;
  // The dtype of the gradient reduction, and of gradients accumulated without sync.
  at::ScalarType reduce_dtype() const;
  // While sharded: adopts the dtype of the sharded parameters when the user cast them after
  // fully_shard (module->to(at::kDouble)), as PyTorch's FSDPParam.reset_sharded_param (NOTE:
  // [FSDP after a dtype cast]).
  void follow_dtype_cast();
  // While sharded: adopts sharded parameters the modules now hold instead of the ones
  // fully_shard made (nn::to_empty after fully_shard on the meta device; a user's
  // swap_parameter), which must be DTensors of the same spec (NOTE: [FSDP on the meta device]).
  void follow_replaced_params();
  // params() after follow_replaced_params().
  const std::vector<FSDPParam>& current_params() {
    follow_replaced_params();
    return params_;
  }
  // The FSDP extension (options_.extensions, resolved by fully_shard); nullptr: plain FSDP.
  const FSDPExtensions* ext() const { return options_.extensions.get(); }
  // Makes p.unsharded_param (post_unflatten_transform) unless it exists.
  void ensure_unsharded_param(FSDPParam& p) const;
  void set_orig_dtype(at::ScalarType dt) { orig_dtype_ = dt; }
  // The tensors the modules held before sharding (weakly: a dead one is no longer shared).
  void remember_original(const at::Tensor& t) { originals_.emplace_back(t.getIntrusivePtr()); }
  bool holds_original(const c10::TensorImpl* impl) const;
  // `tensor`: the data to shard (the parameter, or a TP parameter's local tensor with `tp`).
  void add_param(const std::string& fqn, std::vector<Registration> regs, const at::Tensor& tensor, int64_t shard_dim,
                 std::optional<TPSharding> tp = std::nullopt);
  int64_t flat_numel() const;
  // States of the fully_shard-ed modules below this one's module (and this one).
  std::vector<std::shared_ptr<FSDPState>> states_below(bool include_self);

  // Collective over the shard group (or the post-forward group): issues the all-gather of this
  // group's shards (copy-in, all_gather_into_async) unless the group is unsharded or its
  // all-gather is already in flight. wait_for_unshard() waits for it (no-op when none is in
  // flight), copies it out into the unsharded parameters and swaps them into the modules.
  void unshard();
  void wait_for_unshard();
  // Waits for an all-gather in flight and drops its result: the group stays as it was
  // (sharded, or resharded after forward). For a reshard, or a prefetch nobody waited for.
  void drop_unshard();
  // The all-gather in flight no longer counts as prefetched.
  void forget_prefetch();
  // unshard() ahead of this group's use, issued by another group's pre-forward / pre-backward;
  // skipped past kMaxPrefetchedGroups (NOTE: [FSDP communication overlap]).
  void prefetch_unshard();
  // after_forward: per reshard_after_forward (possibly into the smaller group); otherwise fully.
  // An all-gather in flight is dropped first (drop_unshard).
  void reshard(bool after_forward);
  int64_t post_forward_size() const;
  void ensure_post_forward_group(int64_t n);

  void pre_forward(nn::ForwardInputs& inputs);
  void post_forward(c10::IValue& output);
  void pre_backward();
  void post_backward();
  // From the autograd function on the group's inputs: post_backward once per backward.
  void post_backward_from_hook();
  // Issues the reduce-scatter of `grads`, finishing the root's pending one first.
  void reduce_scatter_grads(std::vector<at::Tensor> grads);
  // Waits for `pending` (this group's), all-reduces over replicate_group_ (HSDP), divides and
  // writes the sharded .grad()s.
  void finish_reduce_scatter(PendingReduceScatter& pending);
  // Adds the reduced flat `output` (the padded pieces of params_[which[k]], in that order) to
  // the sharded .grad()s.
  void write_sharded_grads(const at::Tensor& output, const std::vector<size_t>& which);
  void lazy_init();
  // The root (this state before lazy init): holds the pending reduce-scatter, the post-forward
  // order, the prefetch count and the trace.
  FSDPState& root_or_self();
  // Appends to the root's trace when it is on.
  void record(FSDPTraceEvent::Kind kind, std::optional<std::chrono::steady_clock::time_point> at = std::nullopt);
  // Root only.
  void record_forward(const std::shared_ptr<FSDPState>& state);
  void queue_final_callback();
  void final_callback();
  // Finishes pending_reduce_scatter_ if any.
  void finish_pending_reduce_scatter();
  // Root only: NOTE: [FSDP after a failed backward].
  void recover_from_failed_backward();
  // Every group forwarded since the last backward has run its post-backward.
  bool all_post_backwards_done() const;

  // Read by FSDPModule and the state-dict functions.
  torch::nn::Module& module() const { return *module_; }
  // Every module of the group: the one it was made for, then those added by fully_shard over a
  // list of modules (one group for several, NOTE: [FSDP over several modules]).
  std::vector<torch::nn::Module*> modules() const;
  void add_module(torch::nn::Module& module) { more_modules_.emplace_back(&module, module.shared_from_this()); }
  // `module` is one of the group's modules and alive (not a new module at a dead one's address).
  bool is_group_module(const torch::nn::Module* module) const;
  const DeviceMesh& mesh() const { return mesh_; }
  int64_t shard_size() const { return shard_size_; }
  int64_t shard_rank() const { return shard_rank_; }
  const comm::GroupPtr& shard_group() const { return shard_group_; }
  c10::Device device() const { return device_; }
  const std::vector<FSDPParam>& params() const { return params_; }
  bool is_root() const { return is_root_; }
  Status status() const { return status_; }
  std::vector<FSDPTraceEvent> trace() const;

  // FSDPModule's settings.
  void set_id(int64_t id) { id_ = id; }
  void set_requires_gradient_sync(bool value) { requires_gradient_sync_ = value; }
  void set_reshard_after_forward(ReshardAfterForward value) { reshard_after_forward_ = value; }
  void set_reshard_after_backward(bool value) { reshard_after_backward_ = value; }
  void set_is_last_backward(bool value) { is_last_backward_ = value; }
  void set_forward_prefetch(std::vector<std::weak_ptr<FSDPState>> states) { forward_prefetch_ = std::move(states); }
  void set_backward_prefetch(std::vector<std::weak_ptr<FSDPState>> states) { backward_prefetch_ = std::move(states); }
  void set_divide_factor(double factor) { divide_factor_ = factor; }
  void set_force_sum(bool value) { force_sum_ = value; }
  void set_unshard_in_backward(bool value) { unshard_in_backward_ = value; }
  void set_requires_all_reduce(bool value) { requires_all_reduce_ = value; }
  void set_all_reduce_hook(std::function<void(at::Tensor&)> hook) { all_reduce_hook_ = std::move(hook); }
  void set_trace(bool enabled);

 private:
  torch::nn::Module* module_;
  std::weak_ptr<torch::nn::Module> module_weak_;
  std::vector<std::pair<torch::nn::Module*, std::weak_ptr<torch::nn::Module>>> more_modules_;
  FullyShardOptions options_;
  DeviceMesh mesh_;
  c10::Device device_{c10::kCPU};
  comm::GroupPtr shard_group_, replicate_group_;
  int64_t shard_size_ = 1, shard_rank_ = 0, replicate_size_ = 1;
  at::ScalarType orig_dtype_ = at::kFloat;
  std::vector<FSDPParam> params_;
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> originals_;

  // Settings (FSDPModule).
  std::optional<ReshardAfterForward> reshard_after_forward_;
  bool reshard_after_backward_ = true;
  bool requires_gradient_sync_ = true;
  bool is_last_backward_ = true;
  std::optional<double> divide_factor_;
  bool force_sum_ = false;
  bool unshard_in_backward_ = true;
  bool requires_all_reduce_ = true;
  std::function<void(at::Tensor&)> all_reduce_hook_;
  std::vector<std::weak_ptr<FSDPState>> forward_prefetch_, backward_prefetch_;

  // Runtime.
  Status status_ = Status::kSharded;
  std::optional<AllGatherInFlight> all_gather_;  // issued by unshard(), not yet waited for
  bool prefetched_ = false;                       // all_gather_ was issued by prefetch_unshard()
  at::Tensor full_;                 // all-gather output kept for a reshard into a smaller group
  at::Tensor post_forward_piece_;   // this rank's piece of it while kPostForward
  comm::GroupPtr post_forward_group_;
  bool is_root_ = false;
  std::weak_ptr<FSDPState> root_;
  bool pre_backward_done_ = false;
  bool post_backward_done_ = false;
  // The modules being called when this group's forward began, while a CommDebugMode records:
  // its backward hooks run there, so that their all-gathers and reduce-scatters count on the
  // module, as PyTorch's ModTracker sees them.
  std::vector<nn::detail::ModuleFrame> forward_modules_;
  int64_t id_ = -1;
  // Root only: states forwarded with grad enabled since the last backward, in forward order.
  std::vector<std::weak_ptr<FSDPState>> forwarded_;
  bool callback_queued_ = false;
  // Root only (NOTE: [FSDP communication overlap]): the reduce-scatter in flight; groups in
  // post-forward order (with multiplicity) since the last backward, for the default backward
  // prefetch; groups prefetched and not yet waited for; the trace.
  std::optional<PendingReduceScatter> pending_reduce_scatter_;
  std::vector<std::weak_ptr<FSDPState>> post_forward_order_;
  int64_t prefetched_groups_ = 0;
  bool trace_enabled_ = false;
  mutable std::mutex trace_mu_;
  std::vector<FSDPTraceEvent> trace_;
  // This group's positions in the root's post_forward_order_ (PyTorch's _post_forward_indices).
  std::vector<size_t> post_forward_indices_;
  // Relative to the root ("" for the root) and position in the root's module order, set at lazy
  // init (PyTorch's FSDPParamGroup._module_fqn).
  std::string fqn_;
  int64_t index_ = -1;
};

// The library's way into an FSDPModule: its state is not part of the API.
struct FSDPModuleAccess {
  static FSDPModule make(std::shared_ptr<FSDPState> state) { return FSDPModule(std::move(state)); }
  static const std::shared_ptr<FSDPState>& state(const FSDPModule& module) { return module.state_; }
};

}  // namespace fsdp
}  // namespace dtensor
