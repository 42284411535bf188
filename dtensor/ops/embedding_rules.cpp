// dtensor/ops/embedding_rules.cpp: embedding and embedding_dense_backward (DESIGN.md D5).
//
// embedding(weight [V, D], indices [...]) -> [..., D], one mesh dim at a time:
//   - indices sharded on a dim, table replicated: the output is sharded on that dim;
//   - table sharded on D (column-wise), indices replicated: output sharded on its last dim;
//   - table sharded on V (row-wise), indices replicated: Partial output
//     (NOTE: [Row-sharded embedding]);
//   - a Partial table (embedding is linear in the table) gives a Partial output.
// embedding_dense_backward(grad [..., D], indices, V, padding_idx, scale_grad_by_freq) -> [V, D]
// follows: row-sharded gradient from replicated inputs, column-sharded from a grad sharded on
// D, Partial from batch-sharded grad and indices (not with scale_grad_by_freq: the counts are
// global), and Partial from a Partial grad.
//
// NOTE: [Row-sharded embedding]
// With the table sharded on rows (RowwiseParallel on an Embedding) each rank holds rows
// [offset, offset + rows) (uneven and nested shards included: compute_local_shape_and_global_offset).
// Forward: the rank looks up the indices that fall in its rows and gives zero rows for the
// others; the sum over ranks is the embedding, so the output is Partial(sum) (PyTorch's
// _MaskPartial), reduced by the style's output redistribution. Backward: from replicated
// grad and indices each rank computes only its rows of the weight gradient: indices outside
// its rows go to an extra dummy row that is dropped, and padding_idx is translated (or
// dropped when another rank owns it), so scale_grad_by_freq counts stay exact. That
// Shard(0) option comes first, so a row-sharded table gets a gradient sharded like itself
// with no communication. The backward op cannot see the table's layout (PyTorch's strategy
// has no row-wise option and replicates that gradient); a replicated DTensor table used
// with replicated indices therefore also gets a Shard(0) gradient: correct, and the
// optimizer step gathers it.
#include "dtensor/ops/registry.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace dtensor {
namespace ops {
namespace {

const Placement R = Replicate{};

std::vector<c10::IValue> call_op(const c10::OperatorHandle& op, std::vector<c10::IValue>& args) {
  op.callBoxed(&args);
  return std::move(args);
}

// This rank's row range of a [V, ...] tensor laid out as `placements`.
std::pair<int64_t, int64_t> local_rows(const OpCall& call, const std::vector<int64_t>& global_shape,
                                       const std::vector<Placement>& placements) {
  auto so = compute_local_shape_and_global_offset(global_shape, *call.mesh, placements);
  return {so.second[0], so.first[0]};  // {offset, rows}
}

bool shards_dim0(const std::vector<Placement>& ps) {
  for (const auto& p : ps)
    if (is_shard(p, 0)) return true;
  return false;
}

std::vector<DimOption> embedding_options(const OpCall& c) {
  const int64_t idx_nd = c.inputs[1]->ndim();
  const int64_t out_nd = idx_nd + 1;
  std::vector<DimOption> o{{{R}, {R, R}}};
  for (int64_t d = 0; d < idx_nd; ++d) o.push_back({{Shard{d}}, {R, Shard{d}}});
  o.push_back({{Shard{out_nd - 1}}, {Shard{1}, R}});
  o.push_back({{Partial{}}, {Shard{0}, R}});
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) o.push_back({{Partial(op)}, {Partial(op), R}});
  return o;
}

std::vector<c10::IValue> embedding_kernel(const c10::OperatorHandle& op, std::vector<c10::IValue>& args,
                                          const OpCall& call, const OutputSharding& s) {
  if (!shards_dim0(s.inputs[0])) return call_op(op, args);
  const at::Tensor weight = args[0].toTensor(), indices = args[1].toTensor();
  const auto [offset, rows] = local_rows(call, call.inputs[0]->tensor_meta.shape, s.inputs[0]);
  const at::Tensor outside = (indices < offset) | (indices >= offset + rows);
  auto out_shape = indices.sizes().vec();
  out_shape.push_back(weight.size(1));
  if (rows == 0) return {at::zeros(out_shape, weight.options())};
  at::Tensor out = at::embedding(weight, (indices - offset).masked_fill_(outside, 0));
  return {out.masked_fill_(outside.unsqueeze(-1), 0)};
}

std::vector<DimOption> embedding_backward_options(const OpCall& c) {
  const int64_t grad_nd = c.inputs[0]->ndim();
  const int64_t idx_nd = c.inputs[1]->ndim();
  std::vector<DimOption> o{{{Shard{0}}, {R, R}}, {{R}, {R, R}}};
  o.push_back({{Shard{1}}, {Shard{grad_nd - 1}, R}});
  // With scale_grad_by_freq each index's rows are divided by its count among ALL the indices:
  // ranks holding a slice of the indices would count their slice only.
  if (!arg_bool(c, 4, false))
    for (int64_t d = 0; d < idx_nd; ++d) o.push_back({{Partial{}}, {Shard{d}, Shard{d}}});
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) o.push_back({{Partial(op)}, {Partial(op), R}});
  return o;
}

std::vector<c10::IValue> embedding_backward_kernel(const c10::OperatorHandle& op, std::vector<c10::IValue>& args,
                                                   const OpCall& call, const OutputSharding& s) {
  if (!shards_dim0(s.outputs[0])) return call_op(op, args);
  const at::Tensor grad = args[0].toTensor(), indices = args[1].toTensor();
  const int64_t padding_idx = args[3].toInt();
  const bool scale = args[4].toBool();
  const auto [offset, rows] = local_rows(call, call.output_meta[0].shape, s.outputs[0]);
  const at::Tensor outside = (indices < offset) | (indices >= offset + rows);
  const at::Tensor local_indices = (indices - offset).masked_fill_(outside, rows);  // dummy row `rows`
  const int64_t local_padding = padding_idx >= offset && padding_idx < offset + rows ? padding_idx - offset : -1;
  at::Tensor g = at::embedding_dense_backward(grad, local_indices, rows + 1, local_padding, scale);
  return {g.narrow(0, 0, rows).contiguous()};
}

const bool registered = [] {
  RuleOptions forward, backward;
  forward.kernel = embedding_kernel;
  backward.kernel = embedding_backward_kernel;
  register_rule("aten::embedding", embedding_options, nullptr, forward);
  register_rule("aten::embedding_dense_backward", embedding_backward_options, nullptr, backward);
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
