// dtensor/ops/reduction_rules.cpp: reductions over all dims or some (DESIGN.md D5): sum, mean,
// nansum, count_nonzero, prod, amax/amin, max/min (full, and dim with indices), argmax/argmin,
// all/any, std/var and std_mean/var_mean, norm/linalg_vector_norm, logsumexp; and
// value_selecting_reduction_backward (the gradient of max/min.dim, NOTE: [Composite ops run
// whole]). Scans (cumsum, cumprod, logcumsumexp) are in scan_rules.cpp.
//
// NOTE: [Reducing a sharded dim]
// Sharded dims that are not reduced stay sharded (renumbered when keepdim is false). What a
// SHARDED REDUCED dim gives depends on how per-shard results combine into the global one:
//   sum, nansum, count_nonzero, norm p=0 (a count) and p=1 -> Partial(sum);
//   mean                     -> Partial(avg), only when every shard has the same size (an
//                               average of uneven shards' means is not the mean);
//   amax, max()              -> Partial(max); amin, min(), norm p=-inf -> Partial(min): only
//                               when no shard is empty (a max over nothing has no value, and
//                               the local op throws);
//   norm p=inf               -> Partial(max) on any split (NOTE: [Inf norm of an empty shard]);
//   max/min.dim, argmax/argmin (indices are global positions), all/any (c10d does not reduce
//   bool), prod (Partial(product) is not a placement redistribute supports), std/var, norm
//   for other p, logsumexp -> the reduced dim is replicated first.
// A bool result (amax of a bool tensor...) is never Partial: c10d does not reduce bool.
// A Partial INPUT stays Partial only where the reduction commutes with the pending
// reduction: sum and mean are linear (NOTE: [Partial and linearity]), so Partial(sum) and
// Partial(avg) pass through; amax keeps Partial(max) and amin Partial(min) (a max of maxes).
// Every other Partial input is reduced first.
#include "dtensor/ops/registry.h"
#include "dtensor/ops/rule_helpers.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <optional>

namespace dtensor {
namespace ops {
namespace {

using comm::ReduceOp;
using detail::shards_never_empty;

const std::vector<int64_t>& in_shape(const OpCall& c) { return c.inputs[0]->tensor_meta.shape; }

// Whether every shard of a dim of size `n` has the same size however the mesh splits it.
bool shards_always_even(int64_t n, const DeviceMesh& mesh) { return n % mesh.size() == 0; }

// How a reduction treats sharded reduced dims and Partial inputs (NOTE: [Reducing a sharded dim]).
struct ReductionKind {
  // The output placement of a sharded reduced dim, per reduced dim's size; nullopt: replicate
  // that dim first.
  std::function<std::optional<Placement>(int64_t dim_size, const DeviceMesh& mesh)> sharded_reduced;
  // Partial inputs that pass through unchanged.
  std::vector<ReduceOp> partial_through;
};

// Per-shard results add up (sum, and norms that are sums over elements).
ReductionKind sum_of_shards(bool partial_through) {
  ReductionKind k{[](int64_t, const DeviceMesh&) { return std::optional<Placement>(Partial{}); }, {}};
  if (partial_through) k.partial_through = {ReduceOp::SUM, ReduceOp::AVG};
  return k;
}
ReductionKind linear_mean() {
  return {[](int64_t n, const DeviceMesh& mesh) {
            return shards_always_even(n, mesh) ? std::optional<Placement>(Partial(ReduceOp::AVG)) : std::nullopt;
          },
          {ReduceOp::SUM, ReduceOp::AVG}};
}
// max-like (op MAX) and min-like (op MIN) reductions without indices.
ReductionKind extremum(ReduceOp op, bool partial_through) {
  ReductionKind k{[op](int64_t n, const DeviceMesh& mesh) {
                    return shards_never_empty(n, mesh) ? std::optional<Placement>(Partial(op)) : std::nullopt;
                  },
                  {}};
  if (partial_through) k.partial_through.push_back(op);
  return k;
}
ReductionKind replicate_reduced() {
  return {[](int64_t, const DeviceMesh&) { return std::optional<Placement>(); }, {}};
}

// The options of a reduction of `reduced` dims of the first input (every output, and every
// out= tensor, takes the same placement). The outputs' rank tells keepdim apart: equal to the
// input's, reduced dims are kept; smaller by the number of reduced dims, they are dropped;
// otherwise (a flattened result) no dim stays sharded.
std::vector<DimOption> reduction_options(const OpCall& c, const std::vector<bool>& reduced, const ReductionKind& kind) {
  const auto& shape = in_shape(c);
  const int64_t nd = static_cast<int64_t>(shape.size());
  const size_t n_out = std::max<size_t>(c.output_meta.size(), 1);
  const int64_t out_nd = c.output_meta.empty() ? 0 : static_cast<int64_t>(c.output_meta[0].shape.size());
  int64_t n_reduced = 0;
  for (bool r : reduced) n_reduced += r ? 1 : 0;
  const bool keepdim = out_nd == nd;
  const bool dropped = !keepdim && out_nd == nd - n_reduced;
  const bool bool_result = !c.output_meta.empty() && c.output_meta[0].dtype == at::kBool;
  // Inputs after the first are out= tensors: they hold the output's placement.
  auto option = [&](const Placement& out, const Placement& in) {
    DimOption o{std::vector<Placement>(n_out, out), std::vector<Placement>(c.inputs.size(), out)};
    o.inputs[0] = in;
    return o;
  };
  std::vector<DimOption> o{option(Replicate{}, Replicate{})};
  if (!bool_result)
    for (ReduceOp op : kind.partial_through) o.push_back(option(Partial(op), Partial(op)));
  int64_t out_d = 0;
  for (int64_t d = 0; d < nd; ++d) {
    if (reduced[d]) {
      auto p = kind.sharded_reduced(shape[d], *c.mesh);
      if (p && !bool_result) o.push_back(option(*p, Shard{d}));
      if (keepdim) ++out_d;
      continue;
    }
    if (keepdim || dropped) o.push_back(option(Shard{out_d}, Shard{d}));
    ++out_d;
  }
  return o;
}

// The reduced dims given by the argument at `dim_arg` (an int, an int list, or None; None and
// [] reduce every dim), or every dim when `dim_arg` < 0.
std::vector<bool> reduced_dims(const OpCall& c, int dim_arg) {
  const int64_t nd = static_cast<int64_t>(in_shape(c).size());
  std::vector<int64_t> dims;
  if (dim_arg >= 0) dims = arg_int_list(c, static_cast<size_t>(dim_arg));
  std::vector<bool> reduced(static_cast<size_t>(nd), dims.empty());
  if (nd > 0)
    for (int64_t d : dims) reduced[normalize_shard_dim(d, nd)] = true;
  return reduced;
}

Rule reduction(int dim_arg, ReductionKind kind) {
  return [dim_arg, kind](const OpCall& c) { return reduction_options(c, reduced_dims(c, dim_arg), kind); };
}

// The p of norm / linalg_vector_norm (argument 1: a Scalar, or None for 2).
double norm_order(const OpCall& c) {
  if (c.args.size() < 2 || c.args[1].kind != ArgInfo::Kind::kOther) return 2;
  const auto& v = c.args[1].value;
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  return 2;
}

// NOTE: [Reducing a sharded dim]: the p-norms that combine per-shard norms with a plain
// reduction; others replicate the reduced dims.
// NOTE: [Inf norm of an empty shard]: p = +inf combines per-shard norms by max, and a rank
// whose shard of a reduced dim is empty contributes 0 to it (norms are >= 0), as dist does
// (linalg_rules.cpp): the result stays Partial(max) on any split, and the local op gets zeros
// of size 1 in place of such a dim (libtorch 2.x refuses the inf norm of an empty dim). A min
// (p = -inf) over nothing has no such neutral value: only splits without empty shards.
ReductionKind norm_kind(double p) {
  if (p == 0 || p == 1) return sum_of_shards(/*partial_through=*/false);
  if (std::isinf(p) && p > 0)
    return {[](int64_t, const DeviceMesh&) { return std::optional<Placement>(Partial(ReduceOp::MAX)); }, {}};
  if (std::isinf(p)) return extremum(ReduceOp::MIN, /*partial_through=*/false);
  return replicate_reduced();
}

Rule norm(int dim_arg) {
  return [dim_arg](const OpCall& c) { return reduction_options(c, reduced_dims(c, dim_arg), norm_kind(norm_order(c))); };
}

// NOTE: [Inf norm of an empty shard]: the local input's empty reduced dims become size 1 (zeros).
LocalArgRewrite inf_norm_of_empty_shards(int dim_arg) {
  return [dim_arg](std::vector<c10::IValue>& args, const OpCall& c, const std::vector<std::vector<Placement>>& outs) {
    const double p = norm_order(c);
    if (!(std::isinf(p) && p > 0) || outs.empty() ||
        std::none_of(outs[0].begin(), outs[0].end(), [](const Placement& q) { return is_partial(q); }))
      return;
    const at::Tensor x = args[0].toTensor();
    if (x.numel() != 0) return;
    const std::vector<bool> reduced = reduced_dims(c, dim_arg);
    std::vector<int64_t> shape = x.sizes().vec();
    bool changed = false;
    for (size_t d = 0; d < shape.size(); ++d)
      if (reduced[d] && shape[d] == 0 && in_shape(c)[d] > 0) {
        shape[d] = 1;
        changed = true;
      }
    if (changed) args[0] = at::zeros(shape, x.options());
  };
}

// value_selecting_reduction_backward(grad, dim, indices, sizes, keepdim): scatters grad into
// zeros of `sizes` at `indices` along `dim`. grad and indices have the forward's output
// shape; the result has `sizes`. Other dims keep their shards (indices along `dim` are global
// positions, so `dim` itself is never sharded); the op is linear in grad.
std::vector<DimOption> value_selecting_backward_options(const OpCall& c) {
  const std::vector<int64_t> sizes = arg_int_list(c, 3);
  const int64_t nd = static_cast<int64_t>(sizes.size());
  const bool keepdim = arg_bool(c, 4, false);
  std::vector<DimOption> o{{{Replicate{}}, {Replicate{}, Replicate{}}}};
  for (ReduceOp op : {ReduceOp::SUM, ReduceOp::AVG}) o.push_back({{Partial(op)}, {Partial(op), Replicate{}}});
  if (nd == 0) return o;
  const int64_t dim = normalize_shard_dim(arg_int(c, 1, 0), nd);
  for (int64_t d = 0; d < nd; ++d) {
    if (d == dim) continue;
    const int64_t in_d = keepdim || d < dim ? d : d - 1;
    o.push_back({{Shard{d}}, {Shard{in_d}, Shard{in_d}}});
  }
  return o;
}

void rewrite_sizes_arg(std::vector<c10::IValue>& args, const OpCall& c, const std::vector<std::vector<Placement>>& outs) {
  args[3] = compute_local_shape(arg_int_list(c, 3), *c.mesh, outs[0]);
}

const bool registered = [] {
  constexpr int kAll = -1;
  // Overloads are named one by one: a rule registered for "aten::x" also serves every
  // overload without its own, whose dim argument may be elsewhere (out= overloads are listed
  // for that reason too; their out tensor takes the output's placement).
  register_rule("aten::sum", reduction(kAll, sum_of_shards(/*partial_through=*/true)));
  register_rule("aten::sum.dim_IntList", reduction(1, sum_of_shards(/*partial_through=*/true)));
  register_rule("aten::sum.IntList_out", reduction(1, sum_of_shards(/*partial_through=*/true)));
  // nansum and count_nonzero add up per shard, but are not linear (a NaN, a zero, in one
  // rank's part of a Partial sum need not be one in the sum).
  register_rule("aten::nansum", reduction(1, sum_of_shards(/*partial_through=*/false)));
  register_rule("aten::count_nonzero", reduction(1, sum_of_shards(/*partial_through=*/false)));
  register_rule("aten::mean", reduction(kAll, linear_mean()));
  register_rule("aten::mean.dim", reduction(1, linear_mean()));
  register_rule("aten::mean.out", reduction(1, linear_mean()));
  register_rule("aten::prod", reduction(kAll, replicate_reduced()));
  register_rule("aten::prod.dim_int", reduction(1, replicate_reduced()));
  register_rule("aten::prod.int_out", reduction(1, replicate_reduced()));
  register_rule("aten::amax", reduction(1, extremum(ReduceOp::MAX, /*partial_through=*/true)));
  register_rule("aten::amin", reduction(1, extremum(ReduceOp::MIN, /*partial_through=*/true)));
  register_rule("aten::max", reduction(kAll, extremum(ReduceOp::MAX, /*partial_through=*/true)));
  register_rule("aten::min", reduction(kAll, extremum(ReduceOp::MIN, /*partial_through=*/true)));
  // With indices: the reduced dim is replicated (indices are positions in the whole dim).
  for (const char* n : {"aten::max.dim", "aten::min.dim", "aten::argmax", "aten::argmin"})
    register_rule(n, reduction(1, replicate_reduced()));
  // Order statistics along a dim (values and indices): the reduced dim is replicated (the k-th
  // smallest, the median, the most frequent value need the whole dim), the others keep their
  // shards; their .values out= overloads take these rules (NOTE: [Rules of functional ops serve
  // their out= overloads] in registry.cpp). Without a dim, the median of every element.
  for (const char* n : {"aten::median.dim", "aten::nanmedian.dim", "aten::mode"})
    register_rule(n, reduction(1, replicate_reduced()));
  register_rule("aten::kthvalue", reduction(2, replicate_reduced()));
  for (const char* n : {"aten::median", "aten::nanmedian"}) register_rule(n, reduction(kAll, replicate_reduced()));
  register_rule("aten::all", reduction(kAll, replicate_reduced()));
  register_rule("aten::any", reduction(kAll, replicate_reduced()));
  // (all.dims / any.dims: libtorch 2.x; without them the bare names' rule would take them.)
  for (const char* n : {"aten::all.dim", "aten::any.dim", "aten::all.out", "aten::any.out", "aten::all.dims",
                        "aten::any.dims"})
    register_rule(n, reduction(1, replicate_reduced()));
  register_rule("aten::all.all_out", reduction(kAll, replicate_reduced()));
  register_rule("aten::any.all_out", reduction(kAll, replicate_reduced()));
  // std/var: every other overload decomposes into the .correction one before the DTensor key.
  for (const char* n : {"aten::std.correction", "aten::var.correction", "aten::std_mean.correction",
                        "aten::var_mean.correction"})
    register_rule(n, reduction(1, replicate_reduced()));
  register_rule("aten::logsumexp", reduction(1, replicate_reduced()));
  // The out= overloads are named too: a rule that rewrites local arguments does not serve them
  // by itself (NOTE: [Rules of functional ops serve their out= overloads]); this rewrite only
  // replaces the input. Some names exist in one libtorch line only.
  for (const char* n : {"aten::norm.Scalar", "aten::norm.ScalarOpt_dtype", "aten::norm.ScalarOpt_dtype_out",
                        "aten::norm.Scalar_out"})
    register_rule(n, norm(kAll), inf_norm_of_empty_shards(kAll));
  for (const char* n : {"aten::norm.ScalarOpt_dim", "aten::norm.ScalarOpt_dim_dtype", "aten::norm.out",
                        "aten::norm.dtype_out", "aten::linalg_vector_norm", "aten::linalg_vector_norm.out"})
    register_rule(n, norm(2), inf_norm_of_empty_shards(2));
  // linalg__powsum (libtorch 2.15): the sum of |x|^p over the dims, for every p (|x|^inf is
  // inf, 1 or 0: no max), the inner part of vector norms: per-shard sums add up.
  register_rule("aten::linalg__powsum", [](const OpCall& c) {
    return reduction_options(c, reduced_dims(c, 2), sum_of_shards(/*partial_through=*/false));
  });
  register_rule("aten::value_selecting_reduction_backward", value_selecting_backward_options, rewrite_sizes_arg);
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
