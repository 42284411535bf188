// dtensor/ops/softmax_loss_rules.cpp: _softmax, _log_softmax, their backwards, and
// nll_loss_forward / nll_loss_backward and their 2d forms (DESIGN.md D5).
//
// Softmax normalizes along `dim`: every other dim may be sharded; the softmax dim is gathered.
// The backward is linear in the incoming gradient (Partial grad, replicated output -> Partial).
//
// nll_loss on [N, C] scores and [N] targets (nll_loss2d: [N, C, H, W] and [N, H, W]), split
// over a dim of the target (N; H and W too for nll_loss2d) and the matching dim of the scores:
//   - reduction none: the per-element losses are sharded like the target;
//   - reduction sum: the loss and total_weight are Partial sums;
//   - reduction mean: sum(w_t * loss) / sum(w_t) is not a sum of per-shard means (PyTorch's
//     Partial(avg) is right only when every shard holds the same total weight: no class
//     weights, no ignored targets, even shards). NOTE: [Mean nll_loss stays Partial]
// The class dim C is never sharded (the loss picks one entry per row). The backward is linear
// in grad_output; with mean reduction its rows need the global total_weight.
//
// NOTE: [Mean nll_loss stays Partial]
// With the target sharded, each rank computes its weighted sum of losses and its total weight,
// all_reduces the total weight (one scalar per sharded mesh dim, no all_gather of the scores)
// and divides: the loss is Partial(sum) of local_sum / global_total_weight, exact for any class
// weights, ignore_index and uneven shards; total_weight is the replicated global value (what
// the backward needs).
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/ops/registry.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace dtensor {
namespace ops {
namespace {

const Placement R = Replicate{};
enum Reduction : int64_t { kNone = 0, kMean = 1, kSum = 2 };

std::vector<DimOption> softmax_options(const OpCall& c) {
  const int64_t nd = c.inputs[0]->ndim();
  const int64_t dim = nd == 0 ? 0 : normalize_shard_dim(arg_int(c, 1, 0), nd);
  std::vector<DimOption> o{{{R}, {R}}};
  for (int64_t d = 0; d < nd; ++d)
    if (d != dim) o.push_back({{Shard{d}}, {Shard{d}}});
  return o;
}

// _softmax_backward_data(grad_output, output, dim, input_dtype) and the log_softmax one.
std::vector<DimOption> softmax_backward_options(const OpCall& c) {
  const int64_t nd = c.inputs[0]->ndim();
  const int64_t dim = nd == 0 ? 0 : normalize_shard_dim(arg_int(c, 2, 0), nd);
  std::vector<DimOption> o{{{R}, {R, R}}};
  for (int64_t d = 0; d < nd; ++d)
    if (d != dim) o.push_back({{Shard{d}}, {Shard{d}, Shard{d}}});
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) o.push_back({{Partial(op)}, {Partial(op), R}});
  return o;
}

// (dim of the target, dim of the scores) pairs that may be sharded together: the batch dim of
// nll_loss on [N, C], every dim but C of nll_loss2d.
std::vector<std::pair<int64_t, int64_t>> loss_dims(int64_t self_nd, int64_t target_nd) {
  if (self_nd == 2 && target_nd == 1) return {{0, 0}};
  if (self_nd == 4 && target_nd == 3) return {{0, 0}, {1, 2}, {2, 3}};
  return {};
}

// nll_loss_forward / nll_loss2d_forward(self, target, weight?, reduction, ignore_index)
//   -> (output, total_weight); their .output overloads take the two as out= tensors (arguments
//   5 and 6), which receive the outputs' placements.
std::vector<DimOption> nll_loss_options(const OpCall& c) {
  std::vector<DimOption> o{{{R, R}, std::vector<Placement>(c.inputs.size(), R)}};
  const int64_t reduction = arg_int(c, 3, kMean);
  for (const auto& [t, s] : loss_dims(c.inputs[0]->ndim(), c.inputs[1]->ndim())) {
    auto option = [&, t = t, s = s](Placement output, Placement total_weight) {
      return DimOption{{output, total_weight}, inputs_by_arg(c, [&](size_t i) {
                         if (i == 0) return Placement(Shard{s});
                         if (i == 1) return Placement(Shard{t});
                         if (i == 5) return output;
                         return i == 6 ? total_weight : R;
                       })};
    };
    if (reduction == kNone) o.push_back(option(Shard{t}, R));
    if (reduction == kSum) o.push_back(option(Partial{}, Partial{}));
    if (reduction == kMean) o.push_back(option(Partial{}, R));  // NOTE: [Mean nll_loss stays Partial]
  }
  return o;
}

std::vector<c10::IValue> nll_loss_kernel(const c10::OperatorHandle& op, std::vector<c10::IValue>& args,
                                         const OpCall& call, const OutputSharding& s) {
  std::vector<int64_t> sharded_mesh_dims;
  for (size_t m = 0; m < s.outputs[0].size(); ++m)
    if (is_partial(s.outputs[0][m]) && args[3].toInt() == kMean) sharded_mesh_dims.push_back(static_cast<int64_t>(m));
  if (sharded_mesh_dims.empty()) {
    op.callBoxed(&args);
    return std::move(args);
  }
  const bool out = args.size() > 5;  // the .output overload: the returns are its out= tensors
  args[3] = static_cast<int64_t>(kSum);
  op.callBoxed(&args);
  const at::Tensor local_sum = args[0].toTensor();
  at::Tensor total_weight = out ? args[1].toTensor() : args[1].toTensor().clone();
  for (int64_t m : sharded_mesh_dims) call.mesh->get_group(m)->all_reduce(total_weight, comm::ReduceOp::SUM);
  if (out) {
    local_sum.div_(total_weight);
    return std::move(args);
  }
  return {local_sum / total_weight, total_weight};
}

// nll_loss_backward / nll_loss2d_backward(grad_output, self, target, weight?, reduction,
// ignore_index, total_weight)
std::vector<DimOption> nll_loss_backward_options(const OpCall& c) {
  std::vector<DimOption> o{{{R}, std::vector<Placement>(c.inputs.size(), R)}};
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) {
    const Placement p = Partial(op);
    o.push_back({{p}, inputs_by_arg(c, [p](size_t i) { return i == 0 ? p : R; })});
  }
  const int64_t reduction = arg_int(c, 4, kMean);
  // total_weight (arg 6) is only read by the mean reduction, which needs its global value.
  std::vector<Placement> total_weight_choices{R};
  if (reduction != kMean) total_weight_choices.push_back(Partial{});
  for (const auto& [t, s] : loss_dims(c.inputs[1]->ndim(), c.inputs[2]->ndim()))
    for (const auto& tw : total_weight_choices) {
      o.push_back({{Shard{s}}, inputs_by_arg(c, [&, t = t, s = s](size_t i) {
                     if (i == 0) return reduction == kNone ? Placement(Shard{t}) : R;
                     if (i == 1) return Placement(Shard{s});
                     if (i == 2) return Placement(Shard{t});
                     return i == 6 ? tw : R;
                   })});
    }
  return o;
}

const bool registered = [] {
  register_rule("aten::_softmax", softmax_options);
  register_rule("aten::_log_softmax", softmax_options);
  register_rule("aten::_safe_softmax", softmax_options);  // 2.x (attention's math path): 0 for all -inf rows
  register_rule("aten::_softmax_backward_data", softmax_backward_options);
  register_rule("aten::_log_softmax_backward_data", softmax_backward_options);
  RuleOptions mean_stays_partial;  // NOTE: [Mean nll_loss stays Partial]
  mean_stays_partial.kernel = nll_loss_kernel;
  // The .output overloads have rules of their own: a rule with a local kernel does not serve
  // out= overloads (NOTE: [Rules of functional ops serve their out= overloads]).
  for (const char* n : {"aten::nll_loss_forward", "aten::nll_loss2d_forward", "aten::nll_loss_forward.output",
                        "aten::nll_loss2d_forward.output"})
    register_rule(n, nll_loss_options, nullptr, mean_stays_partial);
  for (const char* n : {"aten::nll_loss_backward", "aten::nll_loss2d_backward"})
    register_rule(n, nll_loss_backward_options);
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
