// dtensor/fsdp/fsdp_hooks.cpp: the forward and backward hooks of a fully_shard-ed group and its
// gradient reduction (NOTE: [FSDP hooks], NOTE: [FSDP gradient divide]).
#include "dtensor/fsdp/fsdp_state_internal.h"

#include "dtensor/comm/group.h"
#include "dtensor/debug/comm_mode_internal.h"
#include "dtensor/debug/tracking_allocator_internal.h"
#include "dtensor/nn/hooks.h"
#include "dtensor/nn/module_surgery.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"
#include "dtensor/utils/storage.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>
#include <cmath>
#include <mutex>

namespace dtensor {
namespace fsdp {

namespace {

// The gradient of a TP parameter's unsharded DTensor as the plain local tensor FSDP reduces:
// laid out like the parameter first (a Partial gradient is reduced over tp here, PyTorch's
// _get_grad_inner_tensor).
at::Tensor tp_grad_local(const at::Tensor& grad, const DTensorSpec& spec) {
  if (!is_dtensor(grad)) return grad;
  at::NoGradGuard no_grad;
  const DTensorSpec& gs = get_spec(grad);
  if (gs.placements == spec.placements) return local_tensor(grad);
  return local_tensor(redistribute(grad, gs.mesh, spec.placements));
}

// Calls fn on every tensor in an IValue (tensors, lists, tuples), replacing it by fn's result.
void map_tensors(c10::IValue& v, const std::function<at::Tensor(const at::Tensor&)>& fn) {
  if (v.isTensor()) {
    v = fn(v.toTensor());
  } else if (v.isTensorList()) {
    auto list = v.toTensorList();
    for (size_t i = 0; i < list.size(); ++i) list.set(i, fn(list.get(i)));
    v = list;
  } else if (v.isTuple()) {
    std::vector<c10::IValue> elems = v.toTupleRef().elements().vec();
    for (auto& e : elems) map_tensors(e, fn);
    v = c10::ivalue::Tuple::create(std::move(elems));
  } else if (v.isList()) {
    auto list = v.toList();
    for (size_t i = 0; i < list.size(); ++i) {
      c10::IValue e = list.get(i);
      map_tensors(e, fn);
      list.set(i, e);
    }
    v = list;
  }
}


// Identity on one forward input of a group; its backward (when the gradient of that input is
// complete, after the group's backward) runs the group's post-backward (PyTorch:
// RegisterPostBackwardFunction).
struct RegisterPostBackward : public torch::autograd::Function<RegisterPostBackward> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, int64_t id) {
    ctx->saved_data["id"] = id;
    return x.view_as(x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto state = StateRegistry::instance().by_id(ctx->saved_data["id"].toInt());
    if (state) state->post_backward_from_hook();
    return {grads[0], at::Tensor()};
  }
};

// The reduce-scatter input: `world` blocks, block r the padded rows of rank r of every gradient
// (in parameter order, parameters without a gradient left out). Each gradient is freed once copied.
at::Tensor reduce_scatter_input(const std::vector<FSDPParam>& params, std::vector<at::Tensor>& grads, int64_t world,
                                int64_t numel, const at::TensorOptions& options) {
  at::Tensor input = at::zeros({world * numel}, options);
  int64_t off = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const FSDPParam& p = params[i];
    if (!grads[i].defined()) continue;
    at::Tensor g = grads[i].to(options.dtype().toScalarType());
    // On meta tensors the copies write nothing and their views allocate nothing (as copy_out).
    for (int64_t r = 0; r < (input.is_meta() ? 0 : world); ++r) {
      const int64_t rows = p.rows_of(r);
      if (rows == 0) continue;
      input.narrow(0, r * numel + off, p.padded_numel).view(p.padded_shard_shape).narrow(p.shard_dim, 0, rows)
          .copy_(g.narrow(p.shard_dim, r * p.chunk, rows));
    }
    off += p.padded_numel;
    g.reset();
    grads[i].reset();
  }
  return input;
}

// NOTE: [FSDP gradient divide]
// PyTorch's _get_gradient_divide_factors (_fsdp_collectives.py), with NCCL's meaning of its
// reduce ops, on every backend. For float32 and bfloat16 reductions PyTorch reduces with
// ReduceOp.AVG (no divide factor) or ReduceOp.PREMUL_SUM(1 / factor), which NCCL computes for
// floating types by multiplying each rank's input by the scale (in the reduction dtype) before
// summing; Gloo has neither op, so the scale is applied here to the input and the collectives
// sum, which is the same arithmetic. Without a factor: the reduce-scatter input times
// 1/shard size and (HSDP) the all-reduce input times 1/replicate size; with one: the
// reduce-scatter input times 1/factor and the all-reduce sums (a shard group of one rank
// divides its input by the factor, as PyTorch's single-rank copy does). Other dtypes (float16,
// float64) risk overflow: the factor (default: the data-parallel size) is split into a
// power-of-two pre-divisor near its square root, applied to the input, and the rest, applied to
// the reduced output. Pre-scaling rounds differently from dividing the sum (by ~1e-7 relative in
// float32 for a factor that is not a power of two), which exact-parity tests see. With
// set_force_sum_reduction_for_comms(true) (PyTorch's force_sum_reduction_for_comms: sum-only
// collectives), float32 and bfloat16 sums are divided after the reduction instead.
struct GradientDivide {
  double premul = 1, pre_divide = 1, all_reduce_premul = 1, post_divide = 1;
};

GradientDivide gradient_divide(at::ScalarType reduce_dtype, int64_t shard, int64_t replicate,
                               std::optional<double> factor, bool force_sum) {
  GradientDivide d;
  const bool overflow_risk = reduce_dtype != at::kFloat && reduce_dtype != at::kBFloat16;
  if (!overflow_risk && force_sum) {
    d.post_divide = factor.value_or(static_cast<double>(shard * replicate));
    return d;
  }
  if (!overflow_risk) {
    if (!factor) {
      d.premul = 1.0 / static_cast<double>(shard);
      d.all_reduce_premul = 1.0 / static_cast<double>(replicate);
    } else if (shard == 1) {
      d.pre_divide = *factor;
    } else {
      d.premul = 1.0 / *factor;
    }
    return d;
  }
  const double f = factor.value_or(static_cast<double>(shard * replicate));
  double pre = 1;
  while (std::fmod(f, pre) == 0 && f / pre > pre) pre *= 2;
  d.pre_divide = pre;
  d.post_divide = f / pre;
  return d;
}

}  // namespace

void FSDPState::post_backward_from_hook() {
  if (post_backward_done_ || !pre_backward_done_) return;
  post_backward_done_ = true;
  const nn::detail::ModuleStackScope where(forward_modules_);
  post_backward();
}

// ---- Hooks (NOTE: [FSDP hooks]) -----------------------------------------------------------

void FSDPState::pre_forward(nn::ForwardInputs& inputs) {
  if (root_.expired()) lazy_init();
  forward_modules_ = debug::detail::module_stack_to_save();
  // The root's final callback is queued by every backward and cleared when it runs; still set
  // outside a backward, the last backward raised before its end (NOTE: [FSDP after a failed
  // backward]).
  if (is_root_ && callback_queued_ && torch::autograd::get_current_graph_task_exec_info() == nullptr)
    recover_from_failed_backward();
  if (auto root = root_.lock()) {
    if (at::GradMode::is_enabled()) root->record_forward(shared_from_this());
  }
  if (options_.mp_policy.param_dtype && options_.mp_policy.cast_forward_inputs) {
    const at::ScalarType dt = *options_.mp_policy.param_dtype;
    for (auto& in : inputs) {
      map_tensors(in, [dt](const at::Tensor& t) { return t.is_floating_point() ? t.to(dt) : t; });
    }
  }
  unshard();  // no-op when prefetched (in flight) or unsharded
  wait_for_unshard();
  // Issued only: they run during this module's forward (NOTE: [FSDP communication overlap]).
  for (auto& w : forward_prefetch_) {
    if (auto s = w.lock()) s->prefetch_unshard();
  }
  if (at::GradMode::is_enabled() && !params_.empty()) {
    for (auto& in : inputs) {
      map_tensors(in, [this](const at::Tensor& t) {
        return t.requires_grad() && !is_dtensor(t) ? RegisterPostBackward::apply(t, id_) : t;
      });
    }
  }
  record(FSDPTraceEvent::Kind::kForwardBegin);
}

void FSDPState::post_forward(c10::IValue& output) {
  record(FSDPTraceEvent::Kind::kForwardEnd);
  reshard(/*after_forward=*/true);
  if (at::GradMode::is_enabled() && !params_.empty()) {
    // With multiplicity: one pre-backward per forward (PyTorch's _record_post_forward).
    FSDPState& root = root_or_self();
    post_forward_indices_.push_back(root.post_forward_order_.size());
    root.post_forward_order_.push_back(shared_from_this());
  }
  if (options_.mp_policy.output_dtype) {
    const at::ScalarType dt = *options_.mp_policy.output_dtype;
    map_tensors(output, [dt](const at::Tensor& t) { return t.is_floating_point() ? t.to(dt) : t; });
  }
  if (!at::GradMode::is_enabled()) return;
  std::weak_ptr<FSDPState> weak = shared_from_this();
  map_tensors(output, [weak](const at::Tensor& t) {
    if (t.requires_grad()) {
      t.register_hook([weak](const at::Tensor&) {
        if (auto s = weak.lock()) s->pre_backward();
      });
    }
    return t;
  });
}

void FSDPState::pre_backward() {
  if (pre_backward_done_) return;
  pre_backward_done_ = true;
  const nn::detail::ModuleStackScope where(forward_modules_);
  if (auto root = root_.lock()) root->queue_final_callback();
  if (unshard_in_backward_) {
    unshard();  // no-op when prefetched (in flight) or unsharded
    wait_for_unshard();
  }
  // Prefetched: groups whose backward is still to come (a group recomputed in backward by
  // activation checkpointing comes after the one it precedes in post-forward order) and that
  // unshard for it.
  auto wanted = [](const std::shared_ptr<FSDPState>& s) {
    return s && s->unshard_in_backward_ && !s->pre_backward_done_;
  };
  if (!backward_prefetch_.empty()) {
    for (auto& w : backward_prefetch_) {
      if (auto s = w.lock(); wanted(s)) s->prefetch_unshard();
    }
  } else if (!post_forward_indices_.empty()) {
    // Default: the group before this one in post-forward order (NOTE: [FSDP communication
    // overlap], 2.; PyTorch's _backward_prefetch).
    const size_t index = post_forward_indices_.back();
    post_forward_indices_.pop_back();
    const auto& order = root_or_self().post_forward_order_;
    if (index > 0 && index - 1 < order.size()) {
      if (auto s = order[index - 1].lock(); wanted(s)) s->prefetch_unshard();
    }
  }
  record(FSDPTraceEvent::Kind::kBackwardBegin);
}

void FSDPState::record_forward(const std::shared_ptr<FSDPState>& state) {
  for (auto& w : forwarded_) {
    if (w.lock() == state) return;
  }
  forwarded_.push_back(state);
}

void FSDPState::queue_final_callback() {
  if (callback_queued_) return;
  callback_queued_ = true;
  std::weak_ptr<FSDPState> weak = shared_from_this();
  torch::autograd::Engine::get_default_engine().queue_callback([weak] {
    if (auto s = weak.lock()) s->final_callback();
  });
}

// Post-backward of the groups whose backward hook did not run it, then nothing FSDP issued is
// left in flight: a mistargeted prefetch is waited for, the last reduce-scatter finished.
void FSDPState::final_callback() {
  callback_queued_ = false;
  auto forwarded = std::move(forwarded_);
  forwarded_.clear();
  for (auto it = forwarded.rbegin(); it != forwarded.rend(); ++it) {
    if (auto s = it->lock()) {
      if (!s->post_backward_done_) {
        // In the group's modules, as PyTorch's ModTracker counts it: a module whose input
        // needs no gradient (the root taking tokens) has not ended its backward for it.
        const nn::detail::ModuleStackScope where(s->forward_modules_);
        s->post_backward();
      }
      s->drop_unshard();  // a mistargeted prefetch (PyTorch's finalize_backward)
      s->pre_backward_done_ = false;
      s->post_backward_done_ = false;
      s->post_forward_indices_.clear();
    }
  }
  post_forward_order_.clear();
  finish_pending_reduce_scatter();
}

// NOTE: [FSDP after a failed backward]
// When backward raises (a hook, an op, a collective), the autograd engine drops the callbacks
// queued on it, so final_callback never runs: the groups backward did not reach keep their
// parameters unsharded (or an all-gather in flight), their per-backward flags stay set, and one
// reduce-scatter may still be parked here. Left so, the next backward would skip those groups'
// pre-backward and write the parked reduce-scatter's gradients into .grad, silently adding a
// failed step's gradients to the next one. The next root forward therefore puts every group back
// as final_callback would and drops the parked gradients (its collective is still waited for:
// every rank issued it). Gradients that groups finished before the failure stay in .grad, as in
// PyTorch; the usual zero_grad() clears them.
void FSDPState::recover_from_failed_backward() {
  TORCH_WARN("fully_shard: the previous backward did not finish (it raised); the gradients it had not ",
             "yet reduced are dropped and its gathered parameters resharded before this forward");
  callback_queued_ = false;
  if (pending_reduce_scatter_) {
    PendingReduceScatter rs = std::move(*pending_reduce_scatter_);
    pending_reduce_scatter_.reset();
    rs.work->wait();
  }
  auto forwarded = std::move(forwarded_);
  forwarded_.clear();
  for (auto it = forwarded.rbegin(); it != forwarded.rend(); ++it) {
    auto s = it->lock();
    if (!s) continue;
    if (!s->post_backward_done_) {
      for (auto& p : s->params_)
        if (p.unsharded_param.defined()) p.unsharded_param.mutable_grad() = at::Tensor();
      if (s->reshard_after_backward_ && s->is_last_backward_) s->reshard(/*after_forward=*/false);
    }
    s->drop_unshard();
    s->pre_backward_done_ = false;
    s->post_backward_done_ = false;
    s->post_forward_indices_.clear();
  }
  post_forward_order_.clear();
  prefetched_groups_ = 0;
}

bool FSDPState::all_post_backwards_done() const {
  for (const auto& w : forwarded_) {
    auto s = w.lock();
    if (s && !s->post_backward_done_) return false;
  }
  return true;
}

void FSDPState::post_backward() {
  record(FSDPTraceEvent::Kind::kBackwardEnd);
  // Unsharded gradients, moved out of the unsharded parameters (plus earlier accumulation).
  std::vector<at::Tensor> grads(params_.size());
  bool any = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    FSDPParam& p = params_[i];
    at::Tensor g = p.unsharded_param.defined() ? p.unsharded_param.grad() : at::Tensor();
    if (g.defined()) {
      p.unsharded_param.mutable_grad() = at::Tensor();
      if (p.tp_spec) g = tp_grad_local(g, *p.tp_spec);
    }
    if (p.accumulated_grad.defined()) {
      g = g.defined() ? p.accumulated_grad.add_(g) : p.accumulated_grad;
      p.accumulated_grad = at::Tensor();
    }
    grads[i] = g;
    any = any || g.defined();
  }
  // Reshard first: the unsharded parameters are freed before the reduce-scatter buffers exist.
  if (reshard_after_backward_ && is_last_backward_) reshard(/*after_forward=*/false);
  if (!requires_gradient_sync_) {
    // Kept in the reduce dtype, as PyTorch's FSDPParam.to_accumulated_grad_if_needed: under a
    // bf16 compute / fp32 reduce policy the sum over micro-batches is fp32 (a gradient
    // accumulated before is already in it, and add_ keeps its dtype).
    const at::ScalarType dt = reduce_dtype();
    for (size_t i = 0; i < params_.size(); ++i) {
      params_[i].accumulated_grad =
          grads[i].defined() && grads[i].scalar_type() != dt ? grads[i].to(dt) : grads[i];
    }
  } else if (any) {
    reduce_scatter_grads(std::move(grads));
  }
}

void FSDPState::reduce_scatter_grads(std::vector<at::Tensor> grads) {
  at::NoGradGuard no_grad;
  const GradientDivide divide = gradient_divide(reduce_dtype(), shard_size_, replicate_size_, divide_factor_, force_sum_);
  PendingReduceScatter rs;
  rs.all_reduce_premul = divide.all_reduce_premul;
  rs.post_divide = divide.post_divide;
  rs.state = shared_from_this();
  rs.has_grad.resize(params_.size());
  int64_t S = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    rs.has_grad[i] = grads[i].defined();
    if (rs.has_grad[i]) S += params_[i].padded_numel;
  }
  // At most one in flight (NOTE: [FSDP communication overlap], 4.): the previous group's is
  // finished, and its buffers freed, before this group's input exists.
  FSDPState& root = root_or_self();
  root.finish_pending_reduce_scatter();
  const auto options = at::TensorOptions().dtype(reduce_dtype()).device(device_);
  {
    const debug::detail::MemoryUseScope use(debug::detail::MemoryUse::kReduceScatter);
    rs.output = at::empty({S}, options);
    // Not kept: the group holds the input while the collective needs it (NOTE: [Async
    // collectives]) and frees it when it completes.
    const at::Tensor input = reduce_scatter_input(params_, grads, shard_size_, S, options);
    if (divide.premul != 1) input.mul_(divide.premul);
    if (divide.pre_divide != 1) input.div_(divide.pre_divide);
    rs.work = shard_group_->reduce_scatter_into_async(rs.output, input, comm::ReduceOp::SUM);
  }
  record(FSDPTraceEvent::Kind::kReduceScatterIssued, rs.work->issued_at());
  root.pending_reduce_scatter_ = std::move(rs);
  if (root.all_post_backwards_done()) root.finish_pending_reduce_scatter();
}

void FSDPState::finish_pending_reduce_scatter() {
  if (!pending_reduce_scatter_) return;
  PendingReduceScatter rs = std::move(*pending_reduce_scatter_);
  pending_reduce_scatter_.reset();
  if (auto s = rs.state.lock()) {
    s->finish_reduce_scatter(rs);
  } else {
    rs.work->wait();  // the module died: nothing to write
  }
}

void FSDPState::finish_reduce_scatter(PendingReduceScatter& rs) {
  at::NoGradGuard no_grad;
  rs.work->wait();
  // Per parameter: its padded piece of the reduce-scatter output (undefined: no gradient).
  std::vector<at::Tensor> pieces(params_.size());
  int64_t off = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!rs.has_grad[i]) continue;
    pieces[i] = rs.output.narrow(0, off, params_[i].padded_numel);
    off += params_[i].padded_numel;
  }
  if (replicate_group_ && !requires_all_reduce_) {
    // HSDP gradient accumulation: held, unreduced across replicas, until an all-reduce.
    for (size_t i = 0; i < params_.size(); ++i) {
      if (!pieces[i].defined()) continue;
      at::Tensor& held = params_[i].partial_reduce_output;
      held = held.defined() ? held.add_(pieces[i]) : pieces[i].clone();
    }
    record(FSDPTraceEvent::Kind::kReduceScatterFinished);
    return;
  }
  // Held partial sums are added in; without any, the output is reduced in place.
  std::vector<at::Tensor> parts;
  std::vector<size_t> which;
  bool any_held = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& held = params_[i].partial_reduce_output;
    if (held.defined()) {
      pieces[i] = pieces[i].defined() ? pieces[i].add(held) : held;
      held = at::Tensor();
      any_held = true;
    }
    if (!pieces[i].defined()) continue;
    parts.push_back(pieces[i]);
    which.push_back(i);
  }
  if (parts.empty()) return;
  at::Tensor output = any_held ? at::cat(parts) : rs.output;
  if (replicate_group_) {
    if (rs.all_reduce_premul != 1) output.mul_(rs.all_reduce_premul);
    replicate_group_->all_reduce(output, comm::ReduceOp::SUM);
  }
  if (all_reduce_hook_) all_reduce_hook_(output);
  if (rs.post_divide != 1) output.div_(rs.post_divide);
  write_sharded_grads(output, which);
  record(FSDPTraceEvent::Kind::kReduceScatterFinished);
}

void FSDPState::write_sharded_grads(const at::Tensor& output, const std::vector<size_t>& which) {
  int64_t off = 0;
  for (size_t i : which) {
    FSDPParam& p = params_[i];
    at::Tensor local = output.narrow(0, off, p.padded_numel)
                           .view(p.padded_shard_shape)
                           .narrow(p.shard_dim, 0, p.rows_of(shard_rank_))
                           .to(p.orig_dtype)
                           .clone(at::MemoryFormat::Contiguous);
    if (options_.offload_policy.offload) local = local.to(c10::Device(c10::kCPU));
    off += p.padded_numel;
    at::Tensor existing = p.sharded.grad();
    if (existing.defined() && is_dtensor(existing)) {
      local_tensor(existing).add_(local);
    } else {
      p.sharded.mutable_grad() = make_dtensor(local, get_spec(p.sharded));
    }
  }
}

}  // namespace fsdp
}  // namespace dtensor
