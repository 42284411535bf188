// dtensor/ops/linalg_rules.cpp: linear algebra on batches of matrices, the diagonal ops, dist,
// histc, the FFT primitives, is_same_size and the _foreach_* family (DESIGN.md D5).
//
// Linear algebra (svd, qr, eigh, det, solve, cholesky, lu, ...) works matrix by matrix: a dim
// of the leading batch dims may be sharded when every tensor input and output has those same
// batch dims (no broadcasting between them); the matrix dims themselves are replicated
// (PyTorch replicates _linalg_svd / linalg_qr / _linalg_eigh altogether). The deprecated
// cholesky and cholesky_inverse have no meta kernel in libtorch 1.13 and refuse the zero-filled
// stand-ins their output shapes are inferred from: the dispatcher then infers them on identity
// matrices (StandIn::kIdentity in output_meta.cpp). The solves are
// linear in their right-hand side: a Partial(sum|avg) right-hand side against a replicated
// matrix gives a Partial solution. _linalg_check_errors (the composites' check of `info`)
// replicates `info`, so that a singular matrix raises on every rank.
//
// diag / diag_embed / diagonal_copy move elements and write zeros: Partial inputs stay Partial
// (NOTE: [Partial through data movement]); diag_embed and diagonal_copy keep the shards of the
// dims they do not touch, diag (1-D <-> 2-D) replicates as PyTorch does.
//
// dist(a, b, p) = ||a - b||_p over every element: with a and b sharded alike on a dim, the
// per-shard results combine by a plain reduction for p = 0, 1 (sum) and p = inf (max); other p
// replicate. A rank whose shard is empty (an uneven split) contributes 0 to the max, which is
// right since norms are >= 0: libtorch 1.13's dist gives 0 there, 2.x's linalg_vector_norm
// refuses the inf norm of an empty tensor, so the local kernel returns the 0 itself (a
// globally empty input still runs the op, which then raises as the plain op does).
//
// histc(self, bins, min, max) with a fixed range (min != max) counts per shard: Partial(sum)
// from any sharding. With min == max the range comes from the data: replicated.
//
// _fft_c2c / _fft_r2c / _fft_c2r transform the dims they are given: every other dim may be
// sharded, and the transforms are linear (Partial sum/avg stay Partial).
//
// is_same_size compares global shapes: its local kernel answers from them on any placements,
// with no communication (comparing local shapes, as the op would, is wrong for shards).
//
// _foreach_* ops apply a pointwise op to each tensor of their lists: element i of every list
// keeps the shard of the first list's element i when the lists' elements have equal shapes
// (the rule offers, per mesh dim, the layout the inputs already have, so no element moves);
// a Partial element goes through where the op's pointwise form lets it (NOTE: [Partial elements
// of list ops]) and is reduced first otherwise. _foreach_norm: per-element Partial(sum) for ord 0 and 1,
// Partial(max) for ord inf (min for -inf) when no shard of the element is empty (the inf norm
// of an empty shard raises in linalg_vector_norm, and a local rewrite would cost
// _foreach_norm.Scalar_out its rule), replicated otherwise. libtorch 2.x's _foreach_max gives
// Partial(max) on the same condition, and _foreach_powsum (the sum of |x|^p, for every p:
// |x|^inf is inf, 1 or 0) Partial(sum).
#include "dtensor/ops/rule_helpers.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ExpandUtils.h>
#include <c10/util/accumulate.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <set>

namespace dtensor {
namespace ops {
namespace {

using comm::ReduceOp;
using detail::add_partial_options;
using detail::mapped_options;
using detail::number_of;
using detail::PartialKind;
using detail::scalar_arg;

const Placement R = Replicate{};

std::vector<Placement> all(size_t n, const Placement& p) { return std::vector<Placement>(n, p); }
const std::vector<int64_t>& shape_of(const OpCall& c, size_t input) { return c.inputs[input]->tensor_meta.shape; }

// ---- batches of matrices -------------------------------------------------------------------

bool has_prefix(const std::vector<int64_t>& shape, const std::vector<int64_t>& prefix) {
  return shape.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), shape.begin());
}

// Options for an op on a batch of matrices whose first input is [*batch, m, n].
// `linear_rhs`: the DTensor input the first output is linear in (-1: none); the other outputs
// depend on the other inputs only.
std::vector<DimOption> batched_options(const OpCall& c, int linear_rhs = -1) {
  const size_t n_in = c.inputs.size(), n_out = std::max<size_t>(c.output_meta.size(), 1);
  std::vector<DimOption> o{{all(n_out, R), all(n_in, R)}};
  const auto& first = shape_of(c, 0);
  if (first.size() >= 3) {
    const std::vector<int64_t> batch(first.begin(), first.end() - 2);
    // An output of shape [0] is a placeholder (U and Vh of _linalg_svd with compute_uv=false,
    // the path of linalg_svdvals): it has no batch dims and stays replicated.
    auto placeholder = [&](const TensorMeta& m) { return m.shape == std::vector<int64_t>{0}; };
    bool aligned = true;
    for (size_t i = 0; i < n_in && aligned; ++i) aligned = has_prefix(shape_of(c, i), batch);
    for (const auto& m : c.output_meta) aligned = aligned && (placeholder(m) || has_prefix(m.shape, batch));
    if (aligned)
      for (int64_t d = 0; d < static_cast<int64_t>(batch.size()); ++d)
        if (batch[d] > 1) {
          DimOption sharded{all(n_out, Shard{d}), all(n_in, Shard{d})};
          for (size_t k = 0; k < c.output_meta.size(); ++k)
            if (placeholder(c.output_meta[k])) sharded.outputs[k] = R;
          o.push_back(std::move(sharded));
        }
  }
  if (linear_rhs >= 0 && static_cast<size_t>(linear_rhs) < n_in)
    for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) {
      DimOption p{all(n_out, R), all(n_in, R)};
      p.outputs[0] = Partial(op);
      p.inputs[static_cast<size_t>(linear_rhs)] = Partial(op);
      o.push_back(std::move(p));
    }
  return o;
}

Rule batched(int linear_rhs = -1) {
  return [linear_rhs](const OpCall& c) { return batched_options(c, linear_rhs); };
}

// ---- diagonals ------------------------------------------------------------------------------

std::vector<DimOption> diag_options(const OpCall&) {
  std::vector<DimOption> o{{{R}, {R}}};
  add_partial_options(o, PartialKind::kMoves, 1, 1, {0});
  return o;
}

// diag_embed(self, offset, dim1=-2, dim2=-1): self's last dim becomes the diagonal of the
// output dims dim1, dim2; the other output dims are self's leading dims in order.
std::vector<DimOption> diag_embed_options(const OpCall& c) {
  const int64_t out_nd = c.inputs[0]->ndim() + 1;
  const int64_t d1 = normalize_shard_dim(arg_int(c, 2, -2), out_nd), d2 = normalize_shard_dim(arg_int(c, 3, -1), out_nd);
  std::vector<int64_t> map(static_cast<size_t>(out_nd), -1);
  for (int64_t d = 0, in = 0; d < out_nd; ++d)
    if (d != d1 && d != d2) map[d] = in++;
  return mapped_options(map);
}

// diagonal_copy(self, offset, dim1, dim2): the output drops dim1 and dim2 and appends the
// diagonal.
std::vector<DimOption> diagonal_copy_options(const OpCall& c) {
  const int64_t nd = c.inputs[0]->ndim();
  const int64_t d1 = normalize_shard_dim(arg_int(c, 2, 0), nd), d2 = normalize_shard_dim(arg_int(c, 3, 1), nd);
  std::vector<int64_t> map;
  for (int64_t d = 0; d < nd; ++d)
    if (d != d1 && d != d2) map.push_back(d);
  map.push_back(-1);
  return mapped_options(map);
}

// ---- dist, histc ------------------------------------------------------------------------------

std::vector<DimOption> dist_options(const OpCall& c) {
  std::vector<DimOption> o{{{R}, {R, R}}};
  const double p = scalar_arg(c, 2, 2);
  Placement partial = R;
  if (p == 0 || p == 1) partial = Partial(ReduceOp::SUM);
  else if (std::isinf(p) && p > 0) partial = Partial(ReduceOp::MAX);
  else return o;
  const std::vector<int64_t> shape = at::infer_size(shape_of(c, 0), shape_of(c, 1));
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d) {
    const int64_t a = broadcast_input_dim(shape_of(c, 0), shape, d), b = broadcast_input_dim(shape_of(c, 1), shape, d);
    if (a < 0 && b < 0) continue;
    o.push_back({{partial}, {a < 0 ? R : Placement(Shard{a}), b < 0 ? R : Placement(Shard{b})}});
  }
  return o;
}

std::vector<c10::IValue> dist_kernel(const c10::OperatorHandle& op, std::vector<c10::IValue>& args, const OpCall& call,
                                     const OutputSharding& sharding) {
  const at::Tensor& a = args[0].toTensor();
  const at::Tensor& b = args[1].toTensor();
  const bool sharded = std::any_of(sharding.outputs[0].begin(), sharding.outputs[0].end(),
                                   [](const Placement& p) { return is_partial(p); });
  if (sharded && c10::multiply_integers(at::infer_size(a.sizes(), b.sizes())) == 0 &&
      c10::multiply_integers(at::infer_size(shape_of(call, 0), shape_of(call, 1))) != 0)
    return {c10::IValue(at::zeros({}, a.options().dtype(sharding.output_meta[0].dtype)))};
  torch::jit::Stack stack(args.begin(), args.end());
  op.callBoxed(&stack);
  return stack;
}

std::vector<DimOption> histc_options(const OpCall& c) {
  std::vector<DimOption> o{{{R}, {R}}};
  if (scalar_arg(c, 2, 0) == scalar_arg(c, 3, 0)) return o;
  for (int64_t d = 0; d < c.inputs[0]->ndim(); ++d) o.push_back({{Partial{}}, {Shard{d}}});
  return o;
}

// ---- FFT ------------------------------------------------------------------------------------

// _fft_c2c / _fft_r2c / _fft_c2r(self, int[] dim, ...): the output has self's dims.
std::vector<DimOption> fft_options(const OpCall& c) {
  const int64_t nd = c.inputs[0]->ndim();
  std::vector<int64_t> map(static_cast<size_t>(nd));
  for (int64_t d = 0; d < nd; ++d) map[d] = d;
  for (int64_t d : arg_int_list(c, 1)) map[normalize_shard_dim(d, nd)] = -1;
  return mapped_options(map, PartialKind::kLinear);
}

// ---- is_same_size -----------------------------------------------------------------------------

// Every input keeps its placements (the layout the call has on each mesh dim is one option).
std::vector<DimOption> keep_layout_options(const OpCall& c) {
  std::vector<DimOption> o{{{}, all(c.inputs.size(), R)}};
  for (int64_t m = 0; m < c.mesh->ndim(); ++m) {
    DimOption k{{}, {}};
    for (const auto* in : c.inputs) k.inputs.push_back(in->placements[static_cast<size_t>(m)]);
    o.push_back(std::move(k));
  }
  return o;
}

std::vector<c10::IValue> is_same_size_kernel(const c10::OperatorHandle&, std::vector<c10::IValue>&, const OpCall& call,
                                             const OutputSharding&) {
  return {c10::IValue(shape_of(call, 0) == shape_of(call, 1))};
}

// ---- _foreach_* -------------------------------------------------------------------------------

// The lists of a _foreach call: for each Tensor[] argument, the positions of its elements in
// OpCall::inputs; `singles` the positions of plain DTensor arguments (a Tensor `other`).
struct ForeachArgs {
  std::vector<std::vector<size_t>> lists;
  // Single tensor operands (other, weight: broadcast over each element). Not the `scalars` of
  // _foreach_addcmul/addcdiv.Tensor (libtorch 2.x), one value per element: element i reads
  // scalars[i] whole, so it stays replicated while the elements keep their shards.
  std::vector<size_t> singles;
};

ForeachArgs foreach_args(const OpCall& c) {
  ForeachArgs f;
  size_t pos = 0;
  for (size_t i = 0; i < c.args.size(); ++i) {
    const auto& a = c.args[i];
    if (a.kind == ArgInfo::Kind::kDTensor) {
      if (c.schema->arguments()[i].name() != "scalars") f.singles.push_back(pos);
      ++pos;
    } else if (a.kind == ArgInfo::Kind::kDTensorList) {
      std::vector<size_t> l;
      for (size_t k = 0; k < a.list.size(); ++k) l.push_back(pos++);
      f.lists.push_back(std::move(l));
    }
  }
  return f;
}

// The shard element i may keep when the first list's element has `p`: every list's element i
// has the same shape and every single tensor operand is a 0-dim one (it broadcasts).
Placement foreach_element_placement(const OpCall& c, const ForeachArgs& f, size_t i, const Placement& p) {
  if (!is_shard(p)) return R;
  const auto& shape = shape_of(c, f.lists[0][i]);
  for (const auto& l : f.lists)
    if (i >= l.size() || shape_of(c, l[i]) != shape) return R;
  for (size_t s : f.singles)
    if (c.inputs[s]->ndim() != 0) return R;
  return Shard{std::get<Shard>(p).dim};  // a strided shard is redistributed to a plain one
}

// NOTE: [Partial elements of list ops]
// Element i of a _foreach op's result is the pointwise op on the lists' elements i, so a Partial
// element goes through as it would through that op:
// - Partial(sum) and Partial(avg) through the linear ones: neg, clone, mul and div by a Scalar
//   (one per element for a ScalarList) or by a replicated 0-dim tensor, mul and div.List by a
//   replicated element, add and sub.List of two Partials of one kind (alpha scales linearly);
// - Partial(avg) also through adding a replicated value (add and sub of a Scalar, a 0-dim tensor
//   or a replicated element): avg_r (a_r + c) = avg_r a_r + c;
// - Partial(max) and Partial(min) through the ops monotone on their whole domain (NOTE:
//   [Partial(max) and Partial(min) through monotone ops]): the increasing unary ones (exp,
//   floor, tanh, sign, ...), add and sub of a replicated value, maximum, minimum, clamp_min and
//   clamp_max of a replicated value, and, for two Partial(max) (min) elements, maximum and
//   clamp_min (minimum and clamp_max); neg, erfc, and mul or div by a negative Scalar turn a
//   max into a min and back;
// - addcmul and addcdiv (self + value * t1 * t2, or t1 / t2): a Partial(sum) or (avg) self with
//   a factor of the same kind (the numerator of addcdiv) and the other replicated; a self of any
//   of these kinds but sum with both factors replicated (a replicated value added);
// - zero_ leaves zeros, which every kind of Partial holds.
// A replicated element with a Partial one of the other list goes through add, sub, mul,
// maximum, minimum, clamp_min and clamp_max.List as above (add and sub by the sign of alpha).
// In place an element keeps its placement, so an op that would turn its kind is no option there.
// Everything else (abs, log, sqrt, pow, lerp, addcmul, ...) reduces the element first.
struct ForeachElement {
  std::vector<Placement> inputs;  // element i of each list
  Placement output;
};

// Element i's value of the Scalar (`overload` Scalar) or Scalar[] (ScalarList) argument at
// `arg`; NaN when it is neither (a Tensor `other`).
double foreach_scalar(const OpCall& c, const std::string& overload, size_t arg, size_t i) {
  if (overload == "Scalar") return scalar_arg(c, arg, std::nan(""));
  if (overload != "ScalarList" || arg >= c.args.size() || !c.args[arg].value.isList()) return std::nan("");
  const auto list = c.args[arg].value.toListRef();
  if (i >= list.size()) return std::nan("");
  return number_of(list[i], std::nan(""));
}

// `have`: element i's placement on one mesh dim in each list; the first is a Partial, or it is
// replicated and the second is.
std::optional<ForeachElement> foreach_partial_element(const OpCall& c, const ForeachArgs& f, size_t i,
                                                      const std::vector<Placement>& have, bool in_place) {
  using comm::ReduceOp;
  static const std::set<std::string> increasing = {"atan", "ceil", "erf", "exp", "expm1", "floor", "round",
                                                   "sigmoid", "sign", "sinh", "tanh", "trunc"};
  std::string base = c.schema->name().substr(std::string("aten::_foreach_").size());
  if (!base.empty() && base.back() == '_') base.pop_back();
  const std::string& overload = c.schema->overload_name();
  const bool first_partial = is_partial(have[0]);
  if (!first_partial && !(have.size() == 2 && is_replicate(have[0]) && is_partial(have[1]))) return std::nullopt;
  const ReduceOp k = std::get<Partial>(first_partial ? have[0] : have[1]).reduce_op;
  const bool linear = k == ReduceOp::SUM || k == ReduceOp::AVG;
  const bool ordered = k == ReduceOp::MAX || k == ReduceOp::MIN;
  const ReduceOp turned = k == ReduceOp::MAX ? ReduceOp::MIN : ReduceOp::MAX;
  std::optional<ReduceOp> out;
  if (!first_partial) {
    // A replicated element with a Partial one of the second list (out of place only: in place
    // the replicated element is written and stays replicated).
    if (in_place || overload != "List") return std::nullopt;
    if (base == "add" || base == "sub") {
      const double alpha = scalar_arg(c, 2, 1) * (base == "sub" ? -1 : 1);  // r + alpha * p
      if (k == ReduceOp::AVG) out = k;
      else if (ordered && !std::isnan(alpha)) out = alpha >= 0 ? k : turned;
    } else if (base == "mul") {
      if (linear) out = k;
    } else if (base == "maximum" || base == "minimum" || base == "clamp_min" || base == "clamp_max") {
      if (ordered) out = k;
    }
  } else if (f.lists.size() == 1) {
    const double s = foreach_scalar(c, overload, 1, i);
    if (base == "clone" || base == "zero") out = k;
    else if (base == "neg") out = ordered ? turned : k;
    else if (increasing.count(base) && ordered) out = k;
    else if (base == "erfc" && ordered) out = turned;
    else if ((base == "mul" || base == "div") && linear && !(base == "div" && s == 0)) out = k;
    else if ((base == "mul" || base == "div") && ordered && !std::isnan(s) && (base == "mul" || s != 0))
      out = s >= 0 ? k : turned;
    else if ((base == "add" || base == "sub") && (k == ReduceOp::AVG || ordered)) out = k;
    else if ((base == "maximum" || base == "minimum" || base == "clamp_min" || base == "clamp_max") && ordered)
      out = k;
  } else if (f.lists.size() == 2 && overload == "List") {
    const bool other_replicated = is_replicate(have[1]);
    const bool same_partial = is_partial(have[1]) && std::get<Partial>(have[1]).reduce_op == k;
    if (base == "add" || base == "sub") {
      if ((same_partial && linear) || (other_replicated && (k == ReduceOp::AVG || ordered))) out = k;
    } else if (base == "mul" || base == "div") {
      if (other_replicated && linear) out = k;
    } else if (base == "maximum" || base == "clamp_min") {
      if ((same_partial && k == ReduceOp::MAX) || (other_replicated && ordered)) out = k;
    } else if (base == "minimum" || base == "clamp_max") {
      if ((same_partial && k == ReduceOp::MIN) || (other_replicated && ordered)) out = k;
    }
  }
  if (first_partial && f.lists.size() == 3 && (base == "addcmul" || base == "addcdiv")) {
    // self + value * t1 * t2 (t1 / t2): linear in self and one factor together (the numerator
    // of addcdiv), and self plus a replicated value otherwise.
    auto same = [&](const Placement& p) { return is_partial(p) && std::get<Partial>(p).reduce_op == k; };
    const bool r1 = is_replicate(have[1]), r2 = is_replicate(have[2]);
    if (linear && ((same(have[1]) && r2) || (base == "addcmul" && r1 && same(have[2])))) out = k;
    else if ((k == ReduceOp::AVG || ordered) && r1 && r2) out = k;
  }
  if (!out || (in_place && *out != k)) return std::nullopt;
  return ForeachElement{have, Partial(*out)};
}

// The _foreach_* ops that reduce each element to a 0-dim tensor: _foreach_norm, and libtorch
// 2.x's _foreach_max and _foreach_powsum (sum of |x|^p).
enum class ForeachReduction { kNone, kNorm, kMax, kPowsum };

// `reduction`: each element reduced to a 0-dim tensor (a shard gives a Partial, or is gathered).
// In place (_foreach_add_, ...: NOTE: [In-place list ops]) there are no outputs: element i of
// the first list is written and keeps its placement.
std::vector<DimOption> foreach_options(const OpCall& c, ForeachReduction reduction) {
  const bool norm = reduction != ForeachReduction::kNone;
  const ForeachArgs f = foreach_args(c);
  const size_t n_in = c.inputs.size(), n_out = c.output_meta.size();
  const bool in_place = n_out == 0 && !c.written_list_inputs.empty();
  std::vector<DimOption> o{{all(n_out, R), all(n_in, R)}};
  if (f.lists.empty() || (f.lists[0].size() != n_out && !in_place)) return o;
  const size_t n_elements = f.lists[0].size();
  Placement reduced = R;
  bool inf_norm = false;  // an extremum: no shard of the element may be empty
  if (reduction == ForeachReduction::kMax) {
    reduced = Partial(ReduceOp::MAX);
    inf_norm = true;
  } else if (reduction == ForeachReduction::kPowsum) {
    reduced = Partial(ReduceOp::SUM);  // sum of |x|^p for every p (|x|^inf is inf, 1 or 0)
  } else if (norm) {
    const double p = scalar_arg(c, 1, 2);
    inf_norm = std::isinf(p);
    if (p == 0 || p == 1) reduced = Partial(ReduceOp::SUM);
    else if (inf_norm) reduced = Partial(p > 0 ? ReduceOp::MAX : ReduceOp::MIN);
  }
  for (int64_t m = 0; m < c.mesh->ndim(); ++m) {
    DimOption k{all(n_out, R), all(n_in, R)};
    bool any = false;
    for (size_t i = 0; i < n_elements; ++i) {
      const Placement& first = c.inputs[f.lists[0][i]]->placements[static_cast<size_t>(m)];
      std::vector<Placement> have;  // element i's placement in each list
      for (const auto& l : f.lists)
        have.push_back(i < l.size() ? c.inputs[l[i]]->placements[static_cast<size_t>(m)] : R);
      const bool second_partial = have.size() > 1 && is_replicate(first) && is_partial(have[1]);
      if ((is_partial(first) || second_partial) && !norm) {  // NOTE: [Partial elements of list ops]
        if (auto e = foreach_partial_element(c, f, i, have, in_place)) {
          any = true;
          for (size_t j = 0; j < f.lists.size(); ++j)
            if (i < f.lists[j].size()) k.inputs[f.lists[j][i]] = e->inputs[j];
          if (!in_place) k.outputs[i] = e->output;
        }
        continue;
      }
      Placement p = foreach_element_placement(c, f, i, first);
      if (norm && is_shard(p) && !is_partial(reduced)) p = R;
      // The inf norm (and max, min) of an empty shard raises in libtorch 2.x: only splits
      // without one.
      if (inf_norm && is_shard(p) &&
          !detail::shards_never_empty(shape_of(c, f.lists[0][i])[static_cast<size_t>(std::get<Shard>(p).dim)], *c.mesh))
        p = R;
      if (!is_shard(p)) continue;
      any = true;
      for (const auto& l : f.lists) k.inputs[l[i]] = p;
      if (!in_place) k.outputs[i] = norm ? reduced : p;
    }
    if (any) o.push_back(std::move(k));
  }
  return o;
}

const bool registered = [] {
  // Decompositions, in both libtorch 1.13 and 2.x (their composite forms decompose into these).
  for (const char* n : {"aten::_linalg_svd", "aten::linalg_qr", "aten::_linalg_eigh", "aten::_linalg_det",
                        "aten::_linalg_slogdet", "aten::linalg_inv_ex", "aten::linalg_cholesky_ex",
                        "aten::linalg_lu_factor_ex", "aten::linalg_lu", "aten::linalg_eig", "aten::geqrf", "aten::linalg_householder_product",
                        "aten::linalg_ldl_factor_ex", "aten::linalg_matrix_exp", "aten::lu_unpack", "aten::linalg_lstsq",
                        "aten::linalg_pinv.atol_rtol_tensor", "aten::cholesky", "aten::cholesky_inverse"})
    register_rule(n, batched());
  // Solves: linear in the right-hand side (its input position).
  register_rule("aten::_linalg_solve_ex", batched(1));        // (A, B)
  register_rule("aten::linalg_solve_triangular", batched(1));  // (A, B)
  register_rule("aten::triangular_solve", batched(0));         // (B, A)
  register_rule("aten::cholesky_solve", batched(0));           // (B, L)
  register_rule("aten::linalg_lu_solve", batched(2));          // (LU, pivots, B)
  register_rule("aten::linalg_ldl_solve", batched(2));         // (LD, pivots, B)
  register_rule("aten::ormqr", batched(2));                    // (A, tau, C)
  // The composite linalg ops check the decomposition's `info` with this op: replicated, so that
  // a failure raises on every rank (a rank checking only its shard would raise alone).
  register_rule("aten::_linalg_check_errors",
                [](const OpCall& c) { return std::vector<DimOption>{{{}, all(c.inputs.size(), R)}}; });
  register_rule("aten::diag", diag_options);
  register_rule("aten::diag_embed", diag_embed_options);
  register_rule("aten::diagonal_copy", diagonal_copy_options);
  RuleOptions empty_shard_dist;
  empty_shard_dist.kernel = dist_kernel;
  register_rule("aten::dist", dist_options, nullptr, empty_shard_dist);
  register_rule("aten::histc", histc_options);
  for (const char* n : {"aten::_fft_c2c", "aten::_fft_r2c", "aten::_fft_c2r"}) register_rule(n, fft_options);
  RuleOptions global_shapes;
  global_shapes.kernel = is_same_size_kernel;
  register_rule("aten::is_same_size", keep_layout_options, nullptr, global_shapes);
  return true;
}();

// The _foreach_* names with a rule (every overload: converters/samples/linalg_samples.cpp
// builds a sample for each; names missing from a libtorch have no overloads there).
const char* const kForeachOps[] = {
    // unary
    "_foreach_abs", "_foreach_acos", "_foreach_asin", "_foreach_atan", "_foreach_ceil", "_foreach_cos",
    "_foreach_cosh", "_foreach_erf", "_foreach_erfc", "_foreach_exp", "_foreach_expm1", "_foreach_floor",
    "_foreach_frac", "_foreach_lgamma", "_foreach_log", "_foreach_log10", "_foreach_log1p", "_foreach_log2",
    "_foreach_neg", "_foreach_reciprocal", "_foreach_round", "_foreach_sigmoid", "_foreach_sin", "_foreach_sinh",
    "_foreach_sqrt", "_foreach_tan", "_foreach_tanh", "_foreach_trunc", "_foreach_rsqrt", "_foreach_sign",
    "_foreach_clone",
    // with scalars or other lists
    "_foreach_add", "_foreach_sub", "_foreach_mul", "_foreach_div", "_foreach_maximum", "_foreach_minimum",
    "_foreach_clamp_min", "_foreach_clamp_max", "_foreach_addcmul", "_foreach_addcdiv", "_foreach_lerp",
    "_foreach_pow", "_foreach_norm", "_foreach_max", "_foreach_powsum"};

const bool foreach_registered = [] {
  for (const char* n : kForeachOps) {
    const std::string name = n;
    const ForeachReduction reduction = name == "_foreach_norm"   ? ForeachReduction::kNorm
                                       : name == "_foreach_max"  ? ForeachReduction::kMax
                                       : name == "_foreach_powsum" ? ForeachReduction::kPowsum
                                                                   : ForeachReduction::kNone;
    register_rule("aten::" + name, [reduction](const OpCall& c) { return foreach_options(c, reduction); });
    // The in-place variant (_foreach_add_, ...; absent names are never called).
    if (reduction == ForeachReduction::kNone)
      register_rule("aten::" + name + "_", [](const OpCall& c) { return foreach_options(c, ForeachReduction::kNone); });
  }
  register_rule("aten::_foreach_zero_", [](const OpCall& c) { return foreach_options(c, ForeachReduction::kNone); });
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
