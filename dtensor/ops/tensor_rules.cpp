// dtensor/ops/tensor_rules.cpp: ops that build, join, reorder or copy whole tensors
// (DESIGN.md D5): *_like and new_* factories, cat, stack, roll, copy_, triu/tril, and the
// ops that return plain values (item, equal) or data-dependent shapes (masked_select,
// nonzero). The indexing ops (index_select, gather, scatter, index, index_put, index_add)
// live in index_rules.cpp; the factories without a tensor input in dtensor/tensor/factory.cpp.
#include "dtensor/ops/rule_helpers.h"

#include <c10/util/strides.h>

#include <algorithm>
#include <optional>

namespace dtensor {
namespace ops {
namespace {

using detail::add_partial_options;
using detail::mapped_options;
using detail::PartialKind;

const std::vector<int64_t>& out_shape(const OpCall& c) { return c.output_meta[0].shape; }

// A Tensor[] argument's dim, normalised against `ndim` (cat: the output's; stack: one more).
int64_t list_dim(const OpCall& c, int64_t ndim) { return normalize_shard_dim(arg_int(c, 1, 0), ndim); }

// cat skips 1-D tensors of size 0 whatever the other inputs' shapes (a legacy rule): they
// take no part in the sharding.
bool legacy_empty(const DTensorSpec& s) { return s.tensor_meta.shape == std::vector<int64_t>{0}; }

// Options for ops that join a list of tensors (cat, stack): every input sharded like the
// others on the same dim, the output on out_dim(d).
std::vector<DimOption> join_options(const OpCall& c, int64_t in_ndim, int64_t join_dim, bool stack) {
  const size_t n = c.inputs.size();
  auto each = [&](const Placement& p) {
    std::vector<Placement> in(n, p);
    for (size_t i = 0; i < n; ++i)
      if (!stack && legacy_empty(*c.inputs[i])) in[i] = Replicate{};
    return in;
  };
  std::vector<DimOption> o{{{Replicate{}}, each(Replicate{})}};
  for (comm::ReduceOp op : detail::partial_reduce_ops(PartialKind::kMoves)) o.push_back({{Partial(op)}, each(Partial(op))});
  // Partial(avg), (max) or (min) pieces joined with replicated ones: the mean (max, min) over
  // ranks of a join is the join of the means, a replicated piece being its own (a Partial(sum)
  // would count it once per rank). Offered as the inputs are laid out, per mesh dim (not to
  // cat.out, whose out= tensor is among the inputs).
  for (int64_t m = 0; c.written_input < 0 && m < c.mesh->ndim(); ++m) {
    std::optional<comm::ReduceOp> kind;
    bool mixed = true;
    for (const DTensorSpec* in : c.inputs) {
      const Placement& p = in->placements[static_cast<size_t>(m)];
      if (is_replicate(p)) continue;
      const auto* partial = std::get_if<Partial>(&p);
      if (!partial || partial->reduce_op == comm::ReduceOp::SUM || (kind && *kind != partial->reduce_op)) mixed = false;
      else kind = partial->reduce_op;
    }
    if (!mixed || !kind) continue;
    std::vector<Placement> in;
    for (const DTensorSpec* spec : c.inputs) in.push_back(spec->placements[static_cast<size_t>(m)]);
    if (std::all_of(in.begin(), in.end(), [](const Placement& p) { return is_partial(p); })) continue;  // above
    o.push_back({{Partial(*kind)}, std::move(in)});
  }
  for (int64_t d = 0; d < in_ndim; ++d) {
    if (!stack && d == join_dim) continue;  // cat: the joined dim is replicated
    const int64_t out_d = stack && d >= join_dim ? d + 1 : d;
    o.push_back({{Shard{out_d}}, each(Shard{d})});
  }
  return o;
}

// new_zeros(size) and friends: the input gives only dtype and device, so it keeps whatever
// layout it has (each of its placements is offered with a Replicate output). An output of the
// input's shape may instead follow the input's shards, and its Partial where the values allow
// (`follow`). new_empty_strided always gives a Replicate buffer: autograd's CopySlices writes
// through as_strided views of it (NOTE: [as_strided on DTensors]).
std::vector<DimOption> new_factory_options(const OpCall& c, PartialKind kind, bool follow = true) {
  const DTensorSpec& in = *c.inputs[0];
  std::vector<DimOption> o;
  const bool same_shape = follow && in.tensor_meta.shape == out_shape(c);
  if (same_shape) {
    for (int64_t d = 0; d < in.ndim(); ++d) o.push_back({{Shard{d}}, {Shard{d}}});
    add_partial_options(o, kind, 1, 1, {0});
  }
  std::vector<Placement> seen;
  for (const Placement& p : in.placements) {
    if (std::find(seen.begin(), seen.end(), p) != seen.end()) continue;
    seen.push_back(p);
    o.push_back({{Replicate{}}, {p}});
  }
  return o;
}

void rewrite_new_factory(std::vector<c10::IValue>& args, const OpCall& c, const std::vector<std::vector<Placement>>& outs) {
  const auto shape = compute_local_shape(out_shape(c), *c.mesh, outs[0]);
  const bool whole = shape == out_shape(c);
  args[1] = shape;
  if (c.name == "aten::new_empty_strided" && !whole) {  // a shard gets contiguous strides
    const auto strides = c10::contiguous_strides(shape);
    args[2] = std::vector<int64_t>(strides.begin(), strides.end());
  }
}

const bool registered = [] {
  // *_like: the output has the input's layout; a Partial input gives a Replicate output (the
  // new values are not partial sums). No communication.
  auto like = [](const OpCall& c) {
    std::vector<DimOption> o{{{Replicate{}}, {Replicate{}}}};
    for (int64_t d = 0; d < c.inputs[0]->ndim(); ++d) o.push_back({{Shard{d}}, {Shard{d}}});
    for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG, comm::ReduceOp::MIN, comm::ReduceOp::MAX})
      o.push_back({{Replicate{}}, {Partial(op)}});
    return o;
  };
  // (rand_like / randn_like: random_rules.cpp.)
  for (const char* n : {"aten::empty_like", "aten::zeros_like", "aten::ones_like", "aten::full_like"})
    register_rule(n, like);
  register_rule("aten::new_zeros", [](const OpCall& c) { return new_factory_options(c, PartialKind::kMoves); },
                rewrite_new_factory);
  for (const char* n : {"aten::new_ones", "aten::new_full"})
    register_rule(n, [](const OpCall& c) { return new_factory_options(c, PartialKind::kNotSum); }, rewrite_new_factory);
  register_rule("aten::new_empty", [](const OpCall& c) { return new_factory_options(c, PartialKind::kMoves); },
                rewrite_new_factory);
  register_rule("aten::new_empty_strided",
                [](const OpCall& c) { return new_factory_options(c, PartialKind::kMoves, /*follow=*/false); },
                rewrite_new_factory);

  register_rule("aten::cat", [](const OpCall& c) {
    const int64_t nd = static_cast<int64_t>(out_shape(c).size());
    return join_options(c, nd, list_dim(c, nd), /*stack=*/false);
  });
  register_rule("aten::stack", [](const OpCall& c) {
    const int64_t nd = static_cast<int64_t>(out_shape(c).size());
    return join_options(c, nd - 1, list_dim(c, nd), /*stack=*/true);
  });

  // roll moves elements along its dims: those are replicated (roll without dims rolls the
  // flattened tensor: everything is). (flip: scan_rules.cpp.)
  register_rule("aten::roll", [](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    const auto dims = arg_int_list(c, 2);
    std::vector<int64_t> map(static_cast<size_t>(nd), -1);
    if (!dims.empty()) {
      for (int64_t d = 0; d < nd; ++d) map[d] = d;
      for (int64_t d : dims) map[normalize_shard_dim(d, nd)] = -1;
    }
    return mapped_options(map);
  });

  // copy_(self, src): src takes self's layout (the engine keeps self's placements).
  register_rule("aten::copy_", [](const OpCall& c) {
    const auto& out = c.inputs[0]->tensor_meta.shape;
    std::vector<DimOption> o{{{Replicate{}}, {Replicate{}, Replicate{}}}};
    for (int64_t d = 0; d < static_cast<int64_t>(out.size()); ++d) {
      const int64_t a = broadcast_input_dim(c.inputs[1]->tensor_meta.shape, out, d);
      o.push_back({{Shard{d}}, {Shard{d}, a < 0 ? Placement(Replicate{}) : Placement(Shard{a})}});
    }
    for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG})
      o.push_back({{Partial(op)}, {Partial(op), Partial(op)}});
    return o;
  });
  // triu/tril (causal masks): every dim keeps its shards, the last two by shifting the
  // diagonal (NOTE: [Triangles of a shard]); linear, so Partial stays Partial.
  auto triangle = [](const OpCall& c) {
    std::vector<DimOption> o{{{Replicate{}}, {Replicate{}}}};
    for (int64_t d = 0; d < c.inputs[0]->ndim(); ++d) o.push_back({{Shard{d}}, {Shard{d}}});
    for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) o.push_back({{Partial(op)}, {Partial(op)}});
    return o;
  };
  // NOTE: [Triangles of a shard]
  // triu(x, k) keeps element (i, j) of the last two dims when j - i >= k (tril: <= k). A rank
  // holding rows from r0 and columns from c0 holds global (r0 + i', c0 + j'), so it keeps local
  // (i', j') when j' - i' >= k + r0 - c0: the local call takes that diagonal. Uneven and empty
  // shards need nothing more; a causal mask sharded by rows (sequence parallel) or columns
  // stays sharded with no communication (PyTorch's DTensor replicates those dims).
  const LocalArgRewrite shift_diagonal = [](std::vector<c10::IValue>& args, const OpCall& call,
                                           const std::vector<std::vector<Placement>>& outputs) {
    const std::vector<int64_t>& shape = call.inputs[0]->tensor_meta.shape;
    const int64_t nd = static_cast<int64_t>(shape.size());
    if (nd < 2) return;
    const auto offset = compute_local_shape_and_global_offset(shape, *call.mesh, outputs[0]).second;
    const int64_t shift = offset[nd - 2] - offset[nd - 1];
    if (shift == 0) return;
    args[1] = args[1].toInt() + shift;  // (self, diagonal, [out])
  };
  // A strided shard's rows are not one range: it keeps the last two dims whole.
  RuleOptions plain_offsets;
  plain_offsets.valid = [](const OpCall& c, const FullPlacements&, const FullPlacements& outputs) {
    const int64_t nd = c.inputs[0]->ndim();
    for (const Placement& p : outputs[0])
      if (is_strided_shard(p) && (is_shard(p, nd - 1) || is_shard(p, nd - 2))) return false;
    return true;
  };
  // The out= overloads too: a functional rule with a rewrite does not serve them.
  for (const char* n : {"aten::triu", "aten::tril", "aten::triu_", "aten::tril_", "aten::triu.out", "aten::tril.out"})
    register_rule(n, triangle, shift_diagonal, plain_offsets);
  // Plain results must agree on every rank: compute them from replicated inputs.
  auto replicated_scalar = [](const OpCall& c) {
    return std::vector<DimOption>{{{}, std::vector<Placement>(c.inputs.size(), Replicate{})}};
  };
  // Everything replicated: output shapes that depend on the values (computed on replicated
  // inputs), and masked_scatter, which fills the masked positions in row-major order from
  // `source` (which source element lands where depends on the mask everywhere before it).
  auto all_replicated = [](const OpCall& c) {
    return std::vector<DimOption>{{std::vector<Placement>(std::max<size_t>(c.output_meta.size(), 1), Replicate{}),
                                   std::vector<Placement>(c.inputs.size(), Replicate{})}};
  };
  RuleOptions from_local;
  from_local.output_shape_from_local = true;
  // _unique(self, sorted, return_inverse) -> (values, inverse): index_fill's backward calls it.
  for (const char* n : {"aten::masked_select", "aten::nonzero", "aten::_unique"})
    register_rule(n, all_replicated, nullptr, from_local);
  register_rule("aten::masked_scatter", all_replicated);
  // libtorch 2.x: masked_scatter's gradient of source (grad.masked_select(mask), zeros after it).
  register_rule("aten::masked_scatter_backward", all_replicated);
  RuleOptions relayout;  // NOTE: [In-place indexing may re-lay out what it writes]
  relayout.relayout_written = true;
  register_rule("aten::masked_scatter_", all_replicated, nullptr, relayout);
  // bucketize(self, boundaries): elementwise in self; the boundaries are searched whole.
  register_rule("aten::bucketize.Tensor", [](const OpCall& c) {
    std::vector<DimOption> o{{{Replicate{}}, {Replicate{}, Replicate{}}}};
    for (int64_t d = 0; d < c.inputs[0]->ndim(); ++d) o.push_back({{Shard{d}}, {Shard{d}, Replicate{}}});
    return o;
  });
  register_rule("aten::bucketize.Scalar",
                [](const OpCall&) { return std::vector<DimOption>{{{Replicate{}}, {Replicate{}}}}; });
  // constant_pad_nd(self, pad, value): the dims the pad list covers (the last pad.size() / 2)
  // are replicated, the others keep their shards; the pad value is a constant written (0 keeps
  // every Partial, another value all but sum). A covered dim with a (0, 0) pair is replicated
  // too: libtorch 1.13 refuses a covered dim of local size 0 ("resulted in a negative output
  // size"), which a rank holding an empty shard of it would pass.
  register_rule("aten::constant_pad_nd", [](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    const auto pad = arg_int_list(c, 1);
    std::vector<int64_t> map(static_cast<size_t>(nd));
    for (int64_t d = 0; d < nd; ++d) map[d] = d;
    for (size_t k = 0; k + 1 < pad.size(); k += 2)
      if (nd - 1 - static_cast<int64_t>(k / 2) >= 0) map[nd - 1 - static_cast<int64_t>(k / 2)] = -1;
    double value = 0;
    if (c.args.size() > 2 && c.args[2].value.isDouble()) value = c.args[2].value.toDouble();
    if (c.args.size() > 2 && c.args[2].value.isInt()) value = static_cast<double>(c.args[2].value.toInt());
    return mapped_options(map, value == 0 ? PartialKind::kMoves : PartialKind::kNotSum);
  });
  // slice_scatter(self, src, dim, start, end, step): src fills a slice of `dim`; the other dims
  // (the same size in both) shard alike; Partials of both pass through (data movement).
  register_rule("aten::slice_scatter", [](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    const int64_t dim = nd == 0 ? 0 : normalize_shard_dim(arg_int(c, 2, 0), nd);
    std::vector<DimOption> o{{{Replicate{}}, {Replicate{}, Replicate{}}}};
    add_partial_options(o, PartialKind::kMoves, 2, 1, {0, 1});
    for (int64_t d = 0; d < nd; ++d)
      if (d != dim && c.inputs[1]->ndim() == nd && c.inputs[0]->tensor_meta.shape[d] == c.inputs[1]->tensor_meta.shape[d])
        o.push_back({{Shard{d}}, {Shard{d}, Shard{d}}});
    return o;
  });
  // select_scatter(self, src, dim, index) and diagonal_scatter(self, src, offset, dim1, dim2):
  // src fills a slice of self without `dim` (without dim1 and dim2, their diagonal last); the
  // other dims of self shard alike with src's matching dim; Partials pass through.
  auto scatter_into = [](const OpCall& c, const std::vector<int64_t>& removed) {
    const int64_t nd = c.inputs[0]->ndim();
    std::vector<DimOption> o{{{Replicate{}}, {Replicate{}, Replicate{}}}};
    add_partial_options(o, PartialKind::kMoves, 2, 1, {0, 1});
    int64_t src_dim = 0;
    for (int64_t d = 0; d < nd; ++d) {
      if (std::find(removed.begin(), removed.end(), d) != removed.end()) continue;
      o.push_back({{Shard{d}}, {Shard{d}, Shard{src_dim++}}});
    }
    return o;
  };
  register_rule("aten::select_scatter", [scatter_into](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    return scatter_into(c, {nd == 0 ? 0 : normalize_shard_dim(arg_int(c, 2, 0), nd)});
  });
  register_rule("aten::diagonal_scatter", [scatter_into](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    return scatter_into(c, {normalize_shard_dim(arg_int(c, 3, 0), nd), normalize_shard_dim(arg_int(c, 4, 1), nd)});
  });
  // split_with_sizes_copy(self, split_sizes, dim) -> Tensor[]: the split dim is replicated.
  register_rule("aten::split_with_sizes_copy", [](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    const int64_t dim = normalize_shard_dim(arg_int(c, 2, 0), nd);
    std::vector<int64_t> map(static_cast<size_t>(nd));
    for (int64_t d = 0; d < nd; ++d) map[d] = d == dim ? -1 : d;
    return mapped_options(map, PartialKind::kMoves, c.output_meta.size());
  });
  register_rule("aten::_local_scalar_dense", replicated_scalar);
  register_rule("aten::equal", replicated_scalar);
  register_rule("aten::is_nonzero", replicated_scalar);
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
