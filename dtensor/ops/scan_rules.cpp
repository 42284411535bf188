// dtensor/ops/scan_rules.cpp: scans along one dim (DESIGN.md D5): cumsum, cumprod (functional,
// in-place and out=), logcumsumexp, cummax and cummin; and flip, which their backward formulas
// use (the gradient of a scan is the reversed scan of the reversed gradient).
//
// A scan's element i depends on every element before it along the scan dim: a shard of that
// dim would need the totals of the shards before it, so the scan dim is replicated first.
// Every other dim keeps its shards. cumsum is linear: Partial(sum) and Partial(avg) inputs
// stay Partial (NOTE: [Partial and linearity]); cumprod and logcumsumexp are not.
// An in-place scan keeps the placements of the tensor it writes, so cumsum_ on a tensor
// sharded along the scan dim raises (redistribute it first); flip likewise replicates the
// flipped dims (a flipped shard belongs to the mirrored rank).
#include "dtensor/ops/registry.h"

namespace dtensor {
namespace ops {
namespace {

// Options for an op that needs the dims in `whole` unsharded and keeps every other dim's
// shards (same rank in and out). Inputs after the first are out= tensors: they hold the
// output's placement.
std::vector<DimOption> keep_other_dims(const OpCall& c, const std::vector<bool>& whole, bool linear) {
  const int64_t nd = c.inputs[0]->ndim();
  auto option = [&](const Placement& p) {
    return DimOption{std::vector<Placement>(std::max<size_t>(c.output_meta.size(), 1), p),
                     std::vector<Placement>(c.inputs.size(), p)};
  };
  std::vector<DimOption> o{option(Replicate{})};
  if (linear)
    for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) o.push_back(option(Partial(op)));
  for (int64_t d = 0; d < nd; ++d)
    if (!whole[d]) o.push_back(option(Shard{d}));
  return o;
}

Rule scan(bool linear) {
  return [linear](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    std::vector<bool> whole(static_cast<size_t>(nd), false);
    if (nd > 0) whole[normalize_shard_dim(arg_int(c, 1, 0), nd)] = true;
    return keep_other_dims(c, whole, linear);
  };
}

// Position of the schema argument `name`, or -1.
int64_t arg_position(const OpCall& c, const char* name) {
  const auto& formals = c.schema->arguments();
  for (size_t i = 0; i < formals.size(); ++i)
    if (formals[i].name() == name) return static_cast<int64_t>(i);
  return -1;
}

// sort / topk / kthvalue-like ops: the values along `dim` depend on the whole dim, which is
// replicated; every other dim keeps its shards (values and indices alike). Not linear.
Rule along_dim() {
  return [](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    std::vector<bool> whole(static_cast<size_t>(nd), false);
    const int64_t pos = arg_position(c, "dim");
    if (nd > 0) whole[normalize_shard_dim(pos < 0 ? -1 : arg_int(c, static_cast<size_t>(pos), -1), nd)] = true;
    return keep_other_dims(c, whole, /*linear=*/false);
  };
}

const bool registered = [] {
  // Overloads that exist in libtorch 1.13 and 2.x alike (checked through the dispatcher).
  for (const char* n : {"aten::sort", "aten::sort.stable", "aten::topk"}) register_rule(n, along_dim());
  for (const char* n : {"aten::cumsum", "aten::cumsum_"}) register_rule(n, scan(/*linear=*/true));
  // cummax / cummin give (values, indices): both keep the other dims' shards.
  for (const char* n : {"aten::cumprod", "aten::cumprod_", "aten::logcumsumexp", "aten::_logcumsumexp", "aten::cummax",
                        "aten::cummin"})
    register_rule(n, scan(/*linear=*/false));
  // cummaxmin_backward(grad, input, indices, dim), the gradient of cummax / cummin, scatters grad
  // back along `dim` into a tensor it makes; it reaches us whole (NOTE: [Composite ops run whole]
  // in dtensor/tensor/composite_ops.cpp). Every other dim keeps its shards.
  register_rule("aten::cummaxmin_backward", [](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    std::vector<bool> whole(static_cast<size_t>(nd), false);
    if (nd > 0) whole[normalize_shard_dim(arg_int(c, 3, 0), nd)] = true;
    return keep_other_dims(c, whole, /*linear=*/false);
  });
  register_rule("aten::flip", [](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    std::vector<bool> whole(static_cast<size_t>(nd), false);
    for (int64_t d : arg_int_list(c, 1)) whole[normalize_shard_dim(d, nd)] = true;
    return keep_other_dims(c, whole, /*linear=*/true);
  });
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
