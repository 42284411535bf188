// dtensor/ops/index_rules.cpp: indexing ops (DESIGN.md D5): index_select, gather, the scatter
// family, index_add, index.Tensor and index_put (advanced indexing with long or bool indices),
// and the in-place forms autograd uses in their backward (scatter_add_, index_add_,
// _index_put_impl_).
//
// The indexed dim of `self` is always replicated (which rows an index picks is data, not
// layout). What may stay sharded: the other dims of `self` together with the matching dims of
// the index and source tensors, when they have the same size (so their torch.chunk pieces line
// up); and the index itself when `self` is replicated, which shards the output the same way
// (the embedding-style lookup). Partials follow NOTE: [Partial through data movement].
#include "dtensor/ops/rule_helpers.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace dtensor {
namespace ops {
namespace {

using detail::add_partial_options;
using detail::PartialKind;

const std::vector<int64_t>& shape_of(const OpCall& c, size_t input) { return c.inputs[input]->tensor_meta.shape; }

std::vector<Placement> all(size_t n, const Placement& p) { return std::vector<Placement>(n, p); }

// ---- index_select / gather ----------------------------------------------------------------------

// index_select(self, dim, index): index is 1-D (or 0-D).
std::vector<DimOption> index_select_options(const OpCall& c) {
  const int64_t nd = c.inputs[0]->ndim();
  const int64_t dim = nd == 0 ? 0 : normalize_shard_dim(arg_int(c, 1, 0), nd);
  std::vector<DimOption> o{{{Replicate{}}, all(2, Replicate{})}};
  add_partial_options(o, PartialKind::kMoves, 2, 1, {0});
  for (int64_t d = 0; d < nd; ++d)
    if (d != dim) o.push_back({{Shard{d}}, {Shard{d}, Replicate{}}});
  if (c.inputs[1]->ndim() == 1 && nd > 0) o.push_back({{Shard{dim}}, {Replicate{}, Shard{0}}});
  return o;
}

// gather(self, dim, index): the output has the index's shape; out[i][j] = self[index[i][j]][j]
// for dim 0.
// NOTE: [Gather from a sharded dim]
// With self sharded on `dim` and the index replicated, each rank gathers the entries its rows
// hold and writes 0 elsewhere: the output is Partial(sum) with no communication (PyTorch's
// _MaskPartial; it allows this for an index of size 1 along `dim`, the masking here works for
// any index). Uneven and empty shards included (the local offset comes from
// compute_local_shape_and_global_offset).
std::vector<DimOption> gather_options(const OpCall& c) {
  const int64_t nd = c.inputs[1]->ndim();
  const int64_t dim = nd == 0 ? 0 : normalize_shard_dim(arg_int(c, 1, 0), nd);
  std::vector<DimOption> o{{{Replicate{}}, all(2, Replicate{})}};
  add_partial_options(o, PartialKind::kMoves, 2, 1, {0});
  // Along `dim` the index holds positions, elsewhere its position is also the position in
  // self: an index sharded on dim d != dim needs self sharded alike.
  if (nd > 0) o.push_back({{Shard{dim}}, {Replicate{}, Shard{dim}}});
  for (int64_t d = 0; d < nd; ++d)
    if (d != dim && c.inputs[0]->ndim() == nd && shape_of(c, 0)[d] == shape_of(c, 1)[d])
      o.push_back({{Shard{d}}, {Shard{d}, Shard{d}}});
  if (nd > 0 && c.inputs[0]->ndim() == nd) o.push_back({{Partial{}}, {Shard{dim}, Replicate{}}});
  return o;
}

std::vector<c10::IValue> gather_kernel(const c10::OperatorHandle& op, std::vector<c10::IValue>& args,
                                       const OpCall& call, const OutputSharding& s) {
  const int64_t nd = call.inputs[0]->ndim();
  const int64_t dim = nd == 0 ? 0 : normalize_shard_dim(args[1].toInt(), nd);
  bool masked = false;
  for (const auto& p : s.inputs[0]) masked = masked || (nd > 0 && is_shard(p, dim));
  if (!masked) {
    op.callBoxed(&args);
    return std::move(args);
  }
  const auto so = compute_local_shape_and_global_offset(call.inputs[0]->tensor_meta.shape, *call.mesh, s.inputs[0]);
  const int64_t offset = so.second[dim], rows = so.first[dim];
  const at::Tensor index = args[2].toTensor();
  const at::Tensor outside = (index < offset) | (index >= offset + rows);
  if (rows == 0) {  // nothing to gather from: one row of zeros stands in for the shard
    auto shape = args[0].toTensor().sizes().vec();
    shape[dim] = 1;
    args[0] = at::zeros(shape, args[0].toTensor().options());
  }
  args[2] = (index - offset).masked_fill_(outside, 0);
  op.callBoxed(&args);
  args[0].toTensor().masked_fill_(outside, 0);
  return std::move(args);
}

// ---- scatter, index_add -------------------------------------------------------------------------

// How the Partials of self (and src) survive a scatter-like op, by its reduction.
PartialKind scatter_partial_kind(const OpCall& c) {
  const std::string& n = c.name;
  auto reduce = [&](size_t i) {
    return i < c.args.size() && c.args[i].value.isString() ? c.args[i].value.toStringRef() : std::string();
  };
  if (n == "aten::scatter.src" || n == "aten::scatter_.src") return PartialKind::kMoves;
  if (n == "aten::scatter.value" || n == "aten::scatter_.value") return PartialKind::kNotSum;
  if (n == "aten::scatter_add" || n == "aten::scatter_add_" || n == "aten::index_add" || n == "aten::index_add_")
    return PartialKind::kLinear;
  if (n == "aten::scatter.reduce" || n == "aten::scatter_.reduce")
    return reduce(4) == "add" ? PartialKind::kLinear : PartialKind::kNone;
  if (n == "aten::scatter_reduce.two" || n == "aten::scatter_reduce_.two")
    return reduce(4) == "sum" ? PartialKind::kLinear : PartialKind::kNone;
  return PartialKind::kNone;  // scatter.value_reduce
}

// scatter*(self, dim, index, src|value) and index_add(self, dim, index, source): every tensor
// sharded alike on a dim other than `dim` where their sizes agree.
std::vector<DimOption> scatter_options(const OpCall& c) {
  const size_t n = c.inputs.size();  // self, index[, src]
  const int64_t nd = c.inputs[0]->ndim();
  const int64_t dim = nd == 0 ? 0 : normalize_shard_dim(arg_int(c, 1, 0), nd);
  std::vector<DimOption> o{{{Replicate{}}, all(n, Replicate{})}};
  std::vector<size_t> partial_inputs{0};
  if (n == 3) partial_inputs.push_back(2);
  add_partial_options(o, scatter_partial_kind(c), n, 1, partial_inputs);
  // NOTE: [Adding rows split along the scattered dim]
  // scatter_add(self, dim, index, src) and index_add(self, dim, index, source) add the rows of
  // src (along `dim`) wherever the index says: rows split across ranks can each be added by
  // their rank into its own term of a Partial(sum) self, and the terms sum to the result. This
  // is the gradient of an embedding or a gather whose batch is split across ranks: no gather
  // of the index and src, and a replicated self becomes Partial without communication. Sum
  // only (an average would divide the added rows); the functional overloads only (an in-place
  // one would turn the caller's tensor Partial).
  if ((c.name == "aten::scatter_add" || c.name == "aten::index_add") && n == 3 && nd > 0) {
    const bool index_add = c.name == "aten::index_add";
    // scatter_add's index and src must split alike: the same size along dim.
    if (index_add || shape_of(c, 1)[static_cast<size_t>(dim)] == shape_of(c, 2)[static_cast<size_t>(dim)]) {
      const Partial sum(comm::ReduceOp::SUM);
      o.push_back({{sum}, {sum, Shard{index_add ? 0 : dim}, Shard{dim}}});
    }
  }
  // scatter_reduce and index_reduce amax/amin keep Partial(max)/Partial(min): max(self, src) of
  // maxima is the max.
  if ((c.name.rfind("aten::scatter_reduce", 0) == 0 || c.name.rfind("aten::index_reduce", 0) == 0) &&
      c.args.size() > 4 && c.args[4].value.isString()) {
    const std::string& r = c.args[4].value.toStringRef();
    if (r == "amax" || r == "amin") {
      const Partial p(r == "amax" ? comm::ReduceOp::MAX : comm::ReduceOp::MIN);
      DimOption po{{p}, all(n, Replicate{})};
      for (size_t i : partial_inputs) po.inputs[i] = p;
      o.push_back(std::move(po));
    }
  }
  for (int64_t d = 0; d < nd; ++d) {
    if (d == dim) continue;
    bool aligned = true;
    for (size_t i = 1; i < n; ++i)
      aligned = aligned && c.inputs[i]->ndim() == nd && shape_of(c, i)[d] == shape_of(c, 0)[d];
    // index_add's and index_reduce's index is 1-D: only self and source
    if (c.name.rfind("aten::index_add", 0) == 0 || c.name.rfind("aten::index_reduce", 0) == 0) {
      aligned = n == 3 && c.inputs[2]->ndim() == nd && shape_of(c, 2)[d] == shape_of(c, 0)[d];
      if (aligned) o.push_back({{Shard{d}}, {Shard{d}, Replicate{}, Shard{d}}});
      continue;
    }
    if (aligned) o.push_back({{Shard{d}}, all(n, Shard{d})});
  }
  return o;
}

// index_fill(self, dim, index, value): a constant into the positions `index` of `dim`. The
// other dims keep their shards (the index, and a tensor value, replicated); a Partial self stays
// Partial for avg, min and max (NOTE: [Partial through data movement]: a constant is written).
std::vector<DimOption> index_fill_options(const OpCall& c) {
  const size_t n = c.inputs.size();  // self, index[, value]
  const int64_t nd = c.inputs[0]->ndim();
  const int64_t dim = nd == 0 ? 0 : normalize_shard_dim(arg_int(c, 1, 0), nd);
  std::vector<DimOption> o{{{Replicate{}}, all(n, Replicate{})}};
  add_partial_options(o, PartialKind::kNotSum, n, 1, {0});
  for (int64_t d = 0; d < nd; ++d) {
    if (d == dim) continue;
    DimOption k{{Shard{d}}, all(n, Replicate{})};
    k.inputs[0] = Shard{d};
    o.push_back(std::move(k));
  }
  return o;
}

// ---- index.Tensor / index_put -------------------------------------------------------------------

// NOTE: [Advanced indexing layout]
// self[indices] with a Tensor?[] of index tensors (None standing for ':'): a long index
// consumes one dim of self, a bool mask as many dims as it has (it becomes their nonzero()
// positions). The index tensors broadcast together into the "index result" (a mask counts as
// one dim, of data-dependent size). When the consumed dims are adjacent the result takes
// their place in the output; otherwise it comes first, followed by the dims of self that are
// not indexed.
struct IndexLayout {
  std::vector<int64_t> self_to_out;  // each dim of self -> its output dim, -1 when indexed
  int64_t result_start = 0;          // first output dim of the index result
  std::vector<int64_t> result_shape; // broadcast shape of long indices (empty with a mask)
  int64_t out_ndim = 0;
  bool has_mask = false;
  std::vector<size_t> index_inputs;  // positions in OpCall::inputs of the index tensors
};

bool is_mask(const DTensorSpec& s) { return s.tensor_meta.dtype == at::kBool || s.tensor_meta.dtype == at::kByte; }

IndexLayout index_layout(const OpCall& c) {
  IndexLayout l;
  TORCH_CHECK(c.args[0].kind == ArgInfo::Kind::kDTensor, "DTensor: ", c.name,
              " indexes a plain tensor with DTensor indices; distribute the indexed tensor too");
  const int64_t nd = c.inputs[0]->ndim();
  const ArgInfo& list = c.args[1];
  std::vector<bool> indexed(static_cast<size_t>(nd), false);
  int64_t self_dim = 0, first = -1, last = -1;
  size_t next_spec = 0;
  const int64_t entries = list.kind == ArgInfo::Kind::kDTensorList ? list.list_size : 0;
  int64_t result_ndim = 0;
  std::vector<std::vector<int64_t>> long_shapes;
  for (int64_t p = 0; p < entries; ++p) {
    const bool present = next_spec < list.list_index.size() && list.list_index[next_spec] == p;
    if (!present) {
      ++self_dim;
      continue;
    }
    const DTensorSpec& s = list.list[next_spec++];
    l.index_inputs.push_back(next_spec);  // inputs: self, then the list's tensors in order
    const int64_t consumed = is_mask(s) ? std::max<int64_t>(s.ndim(), 1) : 1;
    TORCH_CHECK(self_dim + consumed <= nd, "DTensor: ", c.name, ": too many indices for a tensor of ", nd, " dims");
    for (int64_t k = 0; k < consumed; ++k) indexed[self_dim + k] = true;
    if (first < 0) first = self_dim;
    last = self_dim + consumed - 1;
    self_dim += consumed;
    if (is_mask(s)) {
      l.has_mask = true;
      result_ndim = std::max<int64_t>(result_ndim, 1);
    } else {
      long_shapes.push_back(s.tensor_meta.shape);
      result_ndim = std::max<int64_t>(result_ndim, s.ndim());
    }
  }
  bool adjacent = true;
  for (int64_t d = first; first >= 0 && d <= last; ++d) adjacent = adjacent && indexed[d];
  if (!l.has_mask) {  // broadcast the long indices' shapes (aligned on the right)
    l.result_shape.assign(static_cast<size_t>(result_ndim), 1);
    for (const auto& s : long_shapes)
      for (size_t k = 0; k < s.size(); ++k) {
        int64_t& r = l.result_shape[l.result_shape.size() - s.size() + k];
        if (s[k] != 1) r = s[k];
      }
  }
  l.self_to_out.assign(static_cast<size_t>(nd), -1);
  int64_t out = first >= 0 && !adjacent ? result_ndim : 0;
  for (int64_t d = 0; d < nd; ++d) {
    if (first >= 0 && adjacent && d == first) {
      l.result_start = out;
      out += result_ndim;
    }
    if (!indexed[d]) l.self_to_out[d] = out++;
  }
  l.out_ndim = out;
  return l;
}

// index(self, indices). With a bool mask the output shape depends on the mask's values:
// everything is replicated (RuleOptions::output_shape_from_local_if).
std::vector<DimOption> index_options(const OpCall& c) {
  const size_t n = c.inputs.size();
  const IndexLayout l = index_layout(c);
  std::vector<DimOption> o{{{Replicate{}}, all(n, Replicate{})}};
  if (l.has_mask) return o;
  add_partial_options(o, PartialKind::kMoves, n, 1, {0});
  for (int64_t d = 0; d < static_cast<int64_t>(l.self_to_out.size()); ++d) {
    if (l.self_to_out[d] < 0) continue;
    DimOption s{{Shard{l.self_to_out[d]}}, all(n, Replicate{})};
    s.inputs[0] = Shard{d};
    o.push_back(std::move(s));
  }
  // The index result sharded like the index tensors (self replicated).
  for (int64_t k = 0; k < static_cast<int64_t>(l.result_shape.size()); ++k) {
    if (l.result_shape[k] == 1) continue;
    DimOption s{{Shard{l.result_start + k}}, all(n, Replicate{})};
    for (size_t i : l.index_inputs) {
      const int64_t a = broadcast_input_dim(shape_of(c, i), l.result_shape, k);
      if (a >= 0) s.inputs[i] = Shard{a};
    }
    o.push_back(std::move(s));
  }
  return o;
}

bool index_has_mask(const OpCall& c) { return index_layout(c).has_mask; }

// index_put(self, indices, values, accumulate): self keeps the shards of its dims that are not
// indexed, with `values` (broadcast to the shape of self[indices]) sharded on the matching dim.
std::vector<DimOption> index_put_options(const OpCall& c) {
  const size_t n = c.inputs.size();
  const IndexLayout l = index_layout(c);
  const bool values_is_dtensor = c.args[2].kind == ArgInfo::Kind::kDTensor;
  const size_t values = n - 1;
  std::vector<DimOption> o{{{Replicate{}}, all(n, Replicate{})}};
  if (values_is_dtensor)
    add_partial_options(o, arg_bool(c, 3, false) ? PartialKind::kLinear : PartialKind::kMoves, n, 1, {0, values});
  const auto& self_shape = shape_of(c, 0);
  for (int64_t d = 0; d < static_cast<int64_t>(l.self_to_out.size()); ++d) {
    if (l.self_to_out[d] < 0) continue;
    DimOption s{{Shard{d}}, all(n, Replicate{})};
    s.inputs[0] = Shard{d};
    if (values_is_dtensor) {
      const auto& v = shape_of(c, values);
      const int64_t a = static_cast<int64_t>(v.size()) - (l.out_ndim - l.self_to_out[d]);
      if (a >= 0 && !(v[a] == 1 && self_shape[d] != 1)) {
        if (v[a] != self_shape[d]) continue;
        s.inputs[values] = Shard{a};
      }
    }
    o.push_back(std::move(s));
  }
  return o;
}

const bool registered = [] {
  register_rule("aten::index_select", index_select_options);
  RuleOptions masked_gather;  // NOTE: [Gather from a sharded dim]
  masked_gather.kernel = gather_kernel;
  for (const char* n : {"aten::gather", "aten::gather.out"}) register_rule(n, gather_options, nullptr, masked_gather);
  for (const char* n : {"aten::scatter.src", "aten::scatter.value", "aten::scatter.reduce", "aten::scatter.value_reduce",
                        "aten::scatter_add", "aten::scatter_reduce.two", "aten::index_add"})
    register_rule(n, scatter_options);
  // NOTE: [In-place indexing may re-lay out what it writes]
  RuleOptions relayout;
  relayout.relayout_written = true;
  for (const char* n : {"aten::scatter_.src", "aten::scatter_.value", "aten::scatter_.reduce",
                        "aten::scatter_.value_reduce", "aten::scatter_add_", "aten::scatter_reduce_.two",
                        "aten::index_add_"})
    register_rule(n, scatter_options, nullptr, relayout);
  RuleOptions mask_is_data;
  mask_is_data.output_shape_from_local_if = index_has_mask;
  register_rule("aten::index_reduce", scatter_options);
  register_rule("aten::index_reduce_", scatter_options, nullptr, relayout);
  register_rule("aten::index_fill", index_fill_options);
  register_rule("aten::index_fill_", index_fill_options, nullptr, relayout);
  register_rule("aten::index.Tensor", index_options, nullptr, mask_is_data);
  register_rule("aten::index_put", index_put_options);
  for (const char* n : {"aten::index_put_", "aten::_index_put_impl_"}) register_rule(n, index_put_options, nullptr, relayout);
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
