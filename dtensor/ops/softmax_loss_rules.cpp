// dtensor/ops/softmax_loss_rules.cpp: _softmax, _log_softmax, their backwards, and
// nll_loss_forward / nll_loss_backward (DESIGN.md D5).
//
// Softmax normalizes along `dim`: every other dim may be sharded; the softmax dim is gathered.
// The backward is linear in the incoming gradient (Partial grad, replicated output -> Partial).
//
// nll_loss on [N, C] scores and [N] targets, split over the batch dim N:
//   - reduction none: the per-row losses are sharded like the rows;
//   - reduction sum: the loss and total_weight are Partial sums;
//   - reduction mean: sum(w_t * loss) / sum(w_t) is not a sum of per-shard means, so the
//     forward replicates; its backward, -w_t / total_weight per row, is sharded by rows given the
//     global total_weight.
// The class dim C is never sharded (the loss picks one entry per row). The backward is linear
// in grad_output.
#include "dtensor/ops/registry.h"

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

// nll_loss_forward(self, target, weight?, reduction, ignore_index) -> (output, total_weight)
std::vector<DimOption> nll_loss_options(const OpCall& c) {
  std::vector<DimOption> o{{{R, R}, std::vector<Placement>(c.inputs.size(), R)}};
  if (c.inputs[0]->ndim() != 2) return o;
  const int64_t reduction = arg_int(c, 3, kMean);
  auto rows = inputs_by_arg(c, [](size_t i) { return i <= 1 ? Placement(Shard{0}) : R; });
  if (reduction == kNone) o.push_back({{Shard{0}, R}, rows});
  if (reduction == kSum) o.push_back({{Partial{}, Partial{}}, rows});
  return o;
}

// nll_loss_backward(grad_output, self, target, weight?, reduction, ignore_index, total_weight)
std::vector<DimOption> nll_loss_backward_options(const OpCall& c) {
  std::vector<DimOption> o{{{R}, std::vector<Placement>(c.inputs.size(), R)}};
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) {
    const Placement p = Partial(op);
    o.push_back({{p}, inputs_by_arg(c, [p](size_t i) { return i == 0 ? p : R; })});
  }
  if (c.inputs[1]->ndim() != 2) return o;
  const int64_t reduction = arg_int(c, 4, kMean);
  // total_weight (arg 6) is only read by the mean reduction, which needs its global value.
  std::vector<Placement> total_weight_choices{R};
  if (reduction != kMean) total_weight_choices.push_back(Partial{});
  for (const auto& tw : total_weight_choices) {
    o.push_back({{Shard{0}}, inputs_by_arg(c, [&](size_t i) {
                   if (i == 0) return reduction == kNone ? Placement(Shard{0}) : R;
                   if (i <= 2) return Placement(Shard{0});
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
  register_rule("aten::nll_loss_forward", nll_loss_options);
  register_rule("aten::nll_loss_backward", nll_loss_backward_options);
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
