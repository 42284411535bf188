// dtensor/ops/reduction_rules.cpp: sum and mean, over all dims or some (DESIGN.md D5).
// Reducing a sharded dim gives a Partial result (sum -> Partial(sum), mean -> Partial(avg),
// the latter only when every shard has the same size); other sharded dims stay sharded,
// renumbered when keepdim is false. Sum and mean are linear, so Partial inputs stay Partial.
#include "dtensor/ops/registry.h"

#include <set>

namespace dtensor {
namespace ops {
namespace {

std::vector<DimOption> reduction_options(const OpCall& c, bool is_mean, bool all_dims) {
  const auto& shape = c.inputs[0]->tensor_meta.shape;
  const int64_t nd = static_cast<int64_t>(shape.size());
  std::set<int64_t> reduced;
  bool keepdim = false;
  if (all_dims) {
    for (int64_t d = 0; d < nd; ++d) reduced.insert(d);
  } else {
    auto dims = arg_int_list(c, 1);
    if (dims.empty())
      for (int64_t d = 0; d < nd; ++d) reduced.insert(d);
    for (auto d : dims) reduced.insert(nd == 0 ? 0 : normalize_shard_dim(d, nd));
    keepdim = arg_bool(c, 2, false);
  }
  int64_t mesh_numel = c.mesh->size();
  std::vector<DimOption> o;
  o.push_back({{Replicate{}}, {Replicate{}}});
  o.push_back({{Partial{}}, {Partial{}}});
  o.push_back({{Partial(comm::ReduceOp::AVG)}, {Partial(comm::ReduceOp::AVG)}});
  for (int64_t d = 0; d < nd; ++d) {
    if (reduced.count(d)) {
      if (!is_mean) o.push_back({{Partial{}}, {Shard{d}}});
      else if (shape[d] % mesh_numel == 0) o.push_back({{Partial(comm::ReduceOp::AVG)}, {Shard{d}}});
    } else {
      int64_t out_d = d;
      if (!keepdim)
        for (int64_t r : reduced) out_d -= r < d ? 1 : 0;
      o.push_back({{Shard{out_d}}, {Shard{d}}});
    }
  }
  return o;
}

const bool registered = [] {
  register_rule("aten::sum", [](const OpCall& c) { return reduction_options(c, false, true); });
  register_rule("aten::sum.dim_IntList", [](const OpCall& c) { return reduction_options(c, false, false); });
  register_rule("aten::mean", [](const OpCall& c) { return reduction_options(c, true, true); });
  register_rule("aten::mean.dim", [](const OpCall& c) { return reduction_options(c, true, false); });
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
