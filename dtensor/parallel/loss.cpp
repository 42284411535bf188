// dtensor/parallel/loss.cpp: loss_parallel() (NOTE: [Loss parallel] in loss.h).
#include "dtensor/parallel/loss.h"

#include "dtensor/comm/group.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"
#include "dtensor/tensor/op_handlers_internal.h"

#include <ATen/ATen.h>
#include <ATen/WrapDimUtils.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>

#include <limits>

namespace dtensor {

namespace {

// The group of the one mesh dim that shards `dim` of the tensor of `spec` (the others must be
// Replicate), or an error naming the op and the placements (PyTorch's
// _find_all_reduce_mesh_dim).
comm::GroupPtr class_group(const DTensorSpec& spec, int64_t dim, const char* op) {
  int64_t found = -1;
  bool others_replicate = true;
  for (size_t m = 0; m < spec.placements.size(); ++m) {
    if (is_shard(spec.placements[m], dim)) {
      TORCH_CHECK(found < 0, "loss_parallel: ", op, ": the input is sharded on dim ", dim, " by several mesh dims (",
                  to_string(spec.placements), "); shard the class dim on one mesh dim");
      found = static_cast<int64_t>(m);
    } else if (!is_replicate(spec.placements[m])) {
      others_replicate = false;
    }
  }
  TORCH_CHECK(found >= 0, "loss_parallel: ", op, " expects its input sharded on dim ", dim,
              " (the class dim), but its placements are ", to_string(spec.placements),
              "; shard the logits on the class dim (e.g. ColwiseParallel's output, Shard(-1)), or leave the "
              "loss_parallel scope");
  TORCH_CHECK(others_replicate, "loss_parallel: ", op, ": the input's mesh dims other than the class dim's must be "
              "Replicate, but its placements are ", to_string(spec.placements));
  return spec.mesh.get_group(found);
}

// A DTensor on `mesh` laid out as `placements` over the local tensor `local` (global shape `shape`).
at::Tensor wrap(const at::Tensor& local, const DeviceMesh& mesh, std::vector<Placement> placements,
                std::vector<int64_t> shape) {
  TensorMeta meta;
  const auto st = c10::contiguous_strides(shape);
  meta.stride.assign(st.begin(), st.end());
  meta.shape = std::move(shape);
  meta.dtype = local.scalar_type();
  return make_dtensor(local.contiguous(), DTensorSpec(mesh, std::move(placements), meta));
}

std::vector<Placement> replicate(const DeviceMesh& mesh) {
  return std::vector<Placement>(static_cast<size_t>(mesh.ndim()), Replicate{});
}

// A Replicate DTensor's, or a plain tensor's, whole value.
at::Tensor replicated_value(const at::Tensor& t, const DeviceMesh& mesh) {
  if (!t.defined() || !is_dtensor(t)) return t;
  const DTensorSpec& spec = get_spec(t);
  return spec.is_replicated() ? local_tensor(t) : local_tensor(redistribute(t, mesh, replicate(mesh)));
}

// Computation on plain local tensors: below the DTensor key and autograd.
struct Local {
  c10::impl::ExcludeDispatchKeyGuard no_dtensor{kDTensorKey};
  at::AutoDispatchBelowADInplaceOrView below;
};

void replace_args(torch::jit::Stack* stack, size_t n, std::vector<at::Tensor> returns) {
  torch::jit::drop(*stack, n);
  for (auto& r : returns) torch::jit::push(*stack, std::move(r));
}

// _log_softmax(Tensor self, int dim, bool half_to_float)
bool log_softmax(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 3);
  const at::Tensor x = args[0].toTensor();
  if (!is_dtensor(x)) return false;
  const DTensorSpec& spec = get_spec(x);
  const int64_t dim = at::maybe_wrap_dim(args[1].toInt(), spec.ndim());
  const bool half_to_float = args[2].toBool();
  const comm::GroupPtr group = class_group(spec, dim, "_log_softmax");
  at::Tensor out;
  {
    Local local;
    at::Tensor l = local_tensor(x);
    if (half_to_float) l = l.to(at::kFloat);
    at::Tensor max = l.size(dim) == 0 ? at::full_like(l.narrow(dim, 0, 0).sum(dim, true),
                                                      -std::numeric_limits<double>::infinity())
                                      : l.amax(dim, true);
    max = max.contiguous();
    group->all_reduce(max, comm::ReduceOp::MAX);
    out = l - max;  // shifted in place below: one buffer of the local logits' size is kept
    at::Tensor sum = out.exp().sum(dim, true).contiguous();
    group->all_reduce(sum, comm::ReduceOp::SUM);
    out.sub_(sum.log());
  }
  replace_args(stack, 3, {wrap(out, spec.mesh, spec.placements, spec.tensor_meta.shape)});
  return true;
}

// _log_softmax_backward_data(Tensor grad_output, Tensor output, int dim, ScalarType input_dtype)
bool log_softmax_backward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 4);
  at::Tensor grad = args[0].toTensor();
  const at::Tensor output = args[1].toTensor();
  if (!is_dtensor(output) || !is_dtensor(grad)) return false;
  const DTensorSpec& spec = get_spec(output);
  const int64_t dim = at::maybe_wrap_dim(args[2].toInt(), spec.ndim());
  const at::ScalarType input_dtype = args[3].toScalarType();
  const comm::GroupPtr group = class_group(spec, dim, "_log_softmax_backward_data");
  if (get_spec(grad).placements != spec.placements) grad = redistribute(grad, spec.mesh, spec.placements);
  at::Tensor gi;
  {
    Local local;
    const at::Tensor g = local_tensor(grad);
    at::Tensor sum = g.sum(dim, true).contiguous();
    group->all_reduce(sum, comm::ReduceOp::SUM);
    gi = local_tensor(output).exp();  // grad - exp(out) * sum, in one new buffer
    gi.mul_(sum).neg_().add_(g);
    gi = gi.to(input_dtype);
  }
  replace_args(stack, 4, {wrap(gi, spec.mesh, spec.placements, spec.tensor_meta.shape)});
  return true;
}

// What nll_loss's forward and backward share: the rows' targets in this rank's class range.
struct NllTargets {
  at::Tensor valid;    // target != ignore_index
  at::Tensor mine;     // valid and in [offset, offset + local classes)
  at::Tensor index;    // target - offset where mine, else 0
  at::Tensor weights;  // weight[target] where valid, else 0 (1 without a weight)
};

NllTargets nll_targets(const DTensorSpec& spec, int64_t local_classes, const at::Tensor& target,
                       const at::Tensor& weight, int64_t ignore_index, at::ScalarType dtype) {
  const int64_t classes = spec.tensor_meta.shape[1];
  const int64_t offset = compute_local_shape_and_global_offset(spec.tensor_meta.shape, spec.mesh, spec.placements)
                             .second[1];
  NllTargets n;
  n.valid = target != ignore_index;
  TORCH_CHECK(!((target < 0) | (target >= classes)).logical_and(n.valid).any().item<bool>(),
              "loss_parallel: nll_loss: a target is out of bounds for ", classes, " classes");
  n.mine = n.valid & (target >= offset) & (target < offset + local_classes);
  n.index = at::where(n.mine, target - offset, at::zeros_like(target));
  const at::Tensor safe = at::where(n.valid, target, at::zeros_like(target));
  n.weights = (weight.defined() ? weight.to(dtype).index_select(0, safe) : at::ones(target.sizes(), at::TensorOptions().dtype(dtype))) *
              n.valid.to(dtype);
  return n;
}

void check_nll_shapes(const DTensorSpec& spec, const at::Tensor& target) {
  TORCH_CHECK(spec.ndim() == 2, "loss_parallel: nll_loss takes (N, C) log-probabilities here, got ",
              spec.ndim(), " dims; flatten the other dims into N (logits.flatten(0, -2), target.flatten())");
  TORCH_CHECK(target.dim() == 1 && target.size(0) == spec.tensor_meta.shape[0], "loss_parallel: nll_loss: the target ",
              "must have shape (N,) = (", spec.tensor_meta.shape[0], "), got ", target.sizes());
}

// nll_loss_forward(Tensor self, Tensor target, Tensor? weight, int reduction, int ignore_index)
//   -> (Tensor output, Tensor total_weight)
bool nll_loss_forward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 5);
  const at::Tensor self = args[0].toTensor();
  if (!is_dtensor(self)) return false;
  const DTensorSpec& spec = get_spec(self);
  const comm::GroupPtr group = class_group(spec, 1, "nll_loss_forward");
  const at::Tensor target = replicated_value(args[1].toTensor(), spec.mesh);
  const at::Tensor weight = args[2].isNone() ? at::Tensor() : replicated_value(args[2].toTensor(), spec.mesh);
  const int64_t reduction = args[3].toInt(), ignore_index = args[4].toInt();
  check_nll_shapes(spec, target);
  at::Tensor output, total_weight;
  {
    Local local;
    const at::Tensor l = local_tensor(self);
    const NllTargets n = nll_targets(spec, l.size(1), target, weight, ignore_index, l.scalar_type());
    at::Tensor picked = l.size(1) == 0 ? at::zeros({l.size(0)}, l.options())
                                       : l.gather(1, n.index.unsqueeze(1)).squeeze(1) * n.mine.to(l.scalar_type());
    at::Tensor per = (-picked * n.weights).contiguous();
    group->all_reduce(per, comm::ReduceOp::SUM);
    total_weight = reduction == at::Reduction::None ? at::zeros({}, l.options()) : n.weights.sum();
    output = reduction == at::Reduction::None ? per
             : reduction == at::Reduction::Sum ? per.sum()
                                                : per.sum() / total_weight;
  }
  replace_args(stack, 5,
               {wrap(output, spec.mesh, replicate(spec.mesh), output.sizes().vec()),
                wrap(total_weight, spec.mesh, replicate(spec.mesh), {})});
  return true;
}

// nll_loss_backward(Tensor grad_output, Tensor self, Tensor target, Tensor? weight,
//                   int reduction, int ignore_index, Tensor total_weight) -> Tensor
bool nll_loss_backward(const c10::OperatorHandle&, torch::jit::Stack* stack) {
  auto args = torch::jit::last(*stack, 7);
  const at::Tensor self = args[1].toTensor();
  if (!is_dtensor(self)) return false;
  const DTensorSpec& spec = get_spec(self);
  (void)class_group(spec, 1, "nll_loss_backward");
  const at::Tensor grad = replicated_value(args[0].toTensor(), spec.mesh);
  const at::Tensor target = replicated_value(args[2].toTensor(), spec.mesh);
  const at::Tensor weight = args[3].isNone() ? at::Tensor() : replicated_value(args[3].toTensor(), spec.mesh);
  const int64_t reduction = args[4].toInt(), ignore_index = args[5].toInt();
  const at::Tensor total_weight = replicated_value(args[6].toTensor(), spec.mesh);
  check_nll_shapes(spec, target);
  at::Tensor gi;
  {
    Local local;
    const at::Tensor l = local_tensor(self);
    gi = at::zeros_like(l, at::MemoryFormat::Contiguous);
    if (l.size(1) > 0) {
      const NllTargets n = nll_targets(spec, l.size(1), target, weight, ignore_index, l.scalar_type());
      at::Tensor scale = grad.to(l.scalar_type());
      if (reduction == at::Reduction::Mean) scale = scale / total_weight.to(l.scalar_type());
      const at::Tensor values = -(n.weights * scale) * n.mine.to(l.scalar_type());
      gi.scatter_(1, n.index.unsqueeze(1), values.unsqueeze(1));
    }
  }
  replace_args(stack, 7, {wrap(gi, spec.mesh, spec.placements, spec.tensor_meta.shape)});
  return true;
}

const bool registered = [] {
  detail::register_op_handler("aten::_log_softmax", log_softmax);
  detail::register_op_handler("aten::_log_softmax_backward_data", log_softmax_backward);
  detail::register_op_handler("aten::nll_loss_forward", nll_loss_forward);
  detail::register_op_handler("aten::nll_loss_backward", nll_loss_backward);
  return true;
}();

}  // namespace

struct LossParallelGuard::Scope {
  detail::OpHandlerScope handlers;
};

LossParallelGuard::LossParallelGuard() : scope_(std::make_unique<Scope>()) { (void)registered; }
LossParallelGuard::~LossParallelGuard() = default;
LossParallelGuard::LossParallelGuard(LossParallelGuard&&) noexcept = default;

LossParallelGuard loss_parallel() { return LossParallelGuard(); }

}  // namespace dtensor
