// dtensor/ops/conv_rules.cpp: aten::convolution and aten::convolution_backward (DESIGN.md D5).
// conv1d/conv2d/conv3d, conv_transpose*d and _convolution reach the dispatcher as
// aten::convolution; autograd calls aten::convolution_backward.
//
// NOTE: [Convolution sharding]
// input is (N, C_in, *spatial), weight (C_out, C_in / groups, *k) — (C_in, C_out / groups, *k)
// when transposed — and bias (C_out). A convolution is a sum over input channels and kernel
// taps of products, separately for every sample, so per mesh dim:
//   - batch: input Shard(0), weight and bias replicated -> output Shard(0) (the data-parallel
//     case; any groups);
//   - output channels (groups == 1): weight and bias sharded on C_out, input replicated ->
//     output Shard(1);
//   - input channels (groups == 1): input Shard(1) and weight sharded on C_in -> output
//     Partial(sum) (each rank sums over its channels), bias Partial;
//   - input Partial (weight replicated), or weight Partial (input replicated) -> output Partial
//     of the same op, bias Partial of that op too (it is added once in the sum).
// Spatial dims are never sharded (a kernel tap reaches across shard borders: halo exchange is
// not implemented), and channel sharding with groups > 1 would have to align shards with
// groups: those placements are redistributed to one of the above. So is channel sharding
// that would leave a rank without channels (libtorch mis-shapes a convolution of an input
// without channels). The backward mirrors the
// forward: grad_input = conv_transpose(grad_output, weight) and grad_weight = sum over the
// batch of input x grad_output, grad_bias = sum of grad_output over batch and space.
#include "dtensor/ops/registry.h"

#include <ATen/core/ivalue.h>

namespace dtensor {
namespace ops {
namespace {

const Placement R = Replicate{};

// Whether no rank's shard of a dim of size `n` is empty, whichever mesh dims shard it.
// libtorch's convolution mis-shapes its output for an input without channels (it takes the
// "empty input" path), so channel sharding is offered only when every shard has channels.
bool shards_never_empty(int64_t n, const DeviceMesh& mesh) {
  const int64_t m = mesh.ndim();
  std::vector<int64_t> coord(static_cast<size_t>(m), 0);
  for (int64_t subset = 1; subset < (int64_t{1} << m); ++subset) {
    std::vector<Placement> ps(static_cast<size_t>(m), Replicate{});
    for (int64_t d = 0; d < m; ++d)
      if (subset & (int64_t{1} << d)) ps[d] = Shard{0};
    for (;;) {  // every coordinate of the mesh
      if (compute_local_shape({n}, mesh.shape(), ps, coord)[0] == 0) return false;
      int64_t d = m - 1;
      while (d >= 0 && ++coord[d] == mesh.size(d)) coord[d--] = 0;
      if (d < 0) break;
    }
  }
  return true;
}

struct ConvArgs {
  bool transposed = false;
  int64_t groups = 1;
  int64_t w_out = 0, w_in = 1;  // weight dims of output and input channels
};

ConvArgs conv_args(const OpCall& c, size_t transposed_arg, size_t groups_arg) {
  ConvArgs a;
  a.transposed = arg_bool(c, transposed_arg, false);
  a.groups = arg_int(c, groups_arg, 1);
  if (a.transposed) std::swap(a.w_out, a.w_in);
  return a;
}

// Channel counts of a convolution from its weight: {out, in}.
std::pair<int64_t, int64_t> channels(const OpCall& c, size_t weight_input, const ConvArgs& a) {
  const auto& w = c.inputs[weight_input]->tensor_meta.shape;
  return {w[static_cast<size_t>(a.w_out)], w[static_cast<size_t>(a.w_in)]};
}

std::vector<DimOption> convolution_options(const OpCall& c) {
  const ConvArgs a = conv_args(c, 6, 8);
  const bool has_bias = c.args[2].kind == ArgInfo::Kind::kDTensor;
  std::vector<DimOption> o;
  auto add = [&](Placement out, Placement input, Placement weight, Placement bias) {
    DimOption d{{out}, {input, weight}};
    if (has_bias) d.inputs.push_back(bias);
    o.push_back(std::move(d));
  };
  add(R, R, R, R);
  add(Shard{0}, Shard{0}, R, R);
  const auto [c_out, c_in] = channels(c, 1, a);
  if (a.groups == 1 && shards_never_empty(c_out, *c.mesh)) add(Shard{1}, R, Shard{a.w_out}, Shard{0});
  if (a.groups == 1 && shards_never_empty(c_in, *c.mesh)) add(Partial{}, Shard{1}, Shard{a.w_in}, Partial{});
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) {
    add(Partial(op), Partial(op), R, Partial(op));
    add(Partial(op), R, Partial(op), Partial(op));
  }
  return o;
}

// convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
// transposed, output_padding, groups, output_mask) -> (grad_input, grad_weight, grad_bias).
std::vector<DimOption> convolution_backward_options(const OpCall& c) {
  const ConvArgs a = conv_args(c, 7, 9);
  std::vector<DimOption> o;
  // outputs: grad_input, grad_weight, grad_bias; inputs: grad_output, input, weight.
  o.push_back({{R, R, R}, {R, R, R}});
  o.push_back({{Shard{0}, Partial{}, Partial{}}, {Shard{0}, Shard{0}, R}});
  const auto [c_out, c_in] = channels(c, 2, a);
  if (a.groups == 1 && shards_never_empty(c_out, *c.mesh))
    o.push_back({{Partial{}, Shard{a.w_out}, Shard{0}}, {Shard{1}, R, Shard{a.w_out}}});
  if (a.groups == 1 && shards_never_empty(c_in, *c.mesh))
    o.push_back({{Shard{1}, Shard{a.w_in}, R}, {R, Shard{1}, Shard{a.w_in}}});
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) {
    const Placement p = Partial(op);
    o.push_back({{p, p, p}, {p, R, R}});  // linear in grad_output
    o.push_back({{R, p, R}, {R, p, R}});  // grad_weight is linear in input; the others do not use it
    o.push_back({{p, R, R}, {R, R, p}});  // grad_input is linear in weight; the others do not use it
  }
  return o;
}

// bias_sizes holds the global bias shape: a bias sharded on C_out has a local one.
void rewrite_bias_sizes(std::vector<c10::IValue>& args, const OpCall& c,
                        const std::vector<std::vector<Placement>>& outputs) {
  if (args[3].isNone() || c.output_meta.size() < 3 || c.output_meta[2].shape.empty()) return;
  args[3] = compute_local_shape(c.output_meta[2].shape, *c.mesh, outputs[2]);
}

const bool registered = [] {
  register_rule("aten::convolution", convolution_options);
  register_rule("aten::convolution_backward", convolution_backward_options, rewrite_bias_sizes);
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
