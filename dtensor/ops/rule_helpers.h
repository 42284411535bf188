// dtensor/ops/rule_helpers.h: pieces shared by the rule files of the view and tensor families
// (internal to dtensor/ops; rules themselves are registered through registry.h).
#pragma once

#include "dtensor/ops/registry.h"

#include <functional>
#include <vector>

namespace dtensor {
namespace ops {
namespace detail {

// NOTE: [Partial through data movement]
// A Partial tensor is a reduction over the ranks of per-rank values. An op that only moves or
// copies elements to positions that do not depend on the values (views, cat, gather with a
// replicated index, flip, roll) commutes with every reduction: f(max_r x_r) = max_r f(x_r).
// An op that also writes constants keeps those reductions for which the constant reduces to
// itself: zeros (select_backward, tril) keep all four; another constant (scatter.value) keeps
// avg, min and max but not sum. An op that adds (index_add, scatter_add, index_put with
// accumulate) is linear: sum and avg only, with every added operand Partial alike.
enum class PartialKind {
  kNone,       // a Partial input is reduced first
  kMoves,      // sum, avg, min, max
  kLinear,     // sum, avg
  kNotSum,     // avg, min, max (a non-zero constant is written)
};
std::vector<comm::ReduceOp> partial_reduce_ops(PartialKind kind);

// Appends, for each reduce op of `kind`, the option "every input in `partial_inputs` and every
// output Partial(op), the other inputs Replicate".
void add_partial_options(std::vector<DimOption>& options, PartialKind kind, size_t n_inputs, size_t n_outputs,
                         const std::vector<size_t>& partial_inputs);

// Options of a one-input op whose output dim d holds the data of input dim out_to_in[d]
// (-1: none): Replicate, Partial of `kind`, and Shard(d) <- Shard(out_to_in[d]); every one of
// the `n_outputs` outputs takes the same placement (split, unbind).
std::vector<DimOption> mapped_options(const std::vector<int64_t>& out_to_in, PartialKind kind = PartialKind::kMoves,
                                      size_t n_outputs = 1);

// Calls `fn` with every coordinate of `mesh`; false as soon as `fn` is.
bool for_every_coordinate(const DeviceMesh& mesh, const std::function<bool(const std::vector<int64_t>&)>& fn);

// The dims of a tensor of `ndim` dims that `placements` shard (normalised), without repeats.
std::vector<int64_t> sharded_dims(const std::vector<Placement>& placements, int64_t ndim);

// Whether every shard of a dim of size `n` is non-empty however the mesh splits it: over any
// subset of mesh dims, in mesh order (each one splitting the pieces of the one before).
bool shards_never_empty(int64_t n, const DeviceMesh& mesh);

// A Scalar as a number, or `fallback` when `v` is none.
double number_of(const c10::IValue& v, double fallback);
// Argument `i` of the call as a number (a Scalar, int, float or bool), or `fallback`.
double scalar_arg(const OpCall& c, size_t i, double fallback);

// slice(dim, start, end, step) of a dim of `size` covers all of it.
bool whole_slice(int64_t size, const c10::IValue& start, const c10::IValue& end, int64_t step);

}  // namespace detail
}  // namespace ops
}  // namespace dtensor
