// dtensor/ops/norm_rules.cpp: native_layer_norm and its backward (DESIGN.md D5).
//
// LayerNorm normalizes over the trailing `normalized_shape` dims: any of the leading dims
// (batch, sequence) may be sharded, with weight and bias replicated, and the output, mean and
// rstd keep that sharding (mean/rstd have the input's leading dims and size 1 after). In the
// backward the input gradient keeps it too, and the weight/bias gradients, sums over the
// leading dims, are Partial. The backward is linear in grad_out, so a Partial grad_out (with
// everything else replicated) gives Partial gradients. Sharding a normalized dim would need
// the statistics of the whole row: such inputs are replicated first.
#include "dtensor/ops/registry.h"

namespace dtensor {
namespace ops {
namespace {

const Placement R = Replicate{};

// First dim of `normalized_shape` (argument `arg`) in an input of `ndim` dims.
int64_t norm_axis(const OpCall& c, size_t arg, int64_t ndim) {
  return ndim - static_cast<int64_t>(arg_int_list(c, arg).size());
}

// native_layer_norm(input, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)
std::vector<DimOption> layer_norm_options(const OpCall& c) {
  const int64_t axis = norm_axis(c, 1, c.inputs[0]->ndim());
  std::vector<DimOption> o{{{R, R, R}, std::vector<Placement>(c.inputs.size(), R)}};
  for (int64_t d = 0; d < axis; ++d)
    o.push_back({{Shard{d}, Shard{d}, Shard{d}}, inputs_by_arg(c, [d](size_t i) { return i == 0 ? Placement(Shard{d}) : R; })});
  return o;
}

// native_layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight?, bias?,
// output_mask) -> (grad_input, grad_weight, grad_bias)
std::vector<DimOption> layer_norm_backward_options(const OpCall& c) {
  const int64_t axis = norm_axis(c, 2, c.inputs[0]->ndim());
  std::vector<DimOption> o{{{R, R, R}, std::vector<Placement>(c.inputs.size(), R)}};
  for (int64_t d = 0; d < axis; ++d) {
    // grad_out, input, mean, rstd (args 0, 1, 3, 4) sharded; weight, bias replicated.
    o.push_back({{Shard{d}, Partial{}, Partial{}},
                 inputs_by_arg(c, [d](size_t i) { return i <= 4 ? Placement(Shard{d}) : R; })});
  }
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) {
    const Placement p = Partial(op);
    o.push_back({{p, p, p}, inputs_by_arg(c, [p](size_t i) { return i == 0 ? p : R; })});
  }
  return o;
}

const bool registered = [] {
  register_rule("aten::native_layer_norm", layer_norm_options);
  register_rule("aten::native_layer_norm_backward", layer_norm_backward_options);
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
