// dtensor/ops/tensor_rules.cpp: *_like factories, copy_, triu/tril, and ops that return plain
// values (item, equal) (DESIGN.md D5).
#include "dtensor/ops/registry.h"

#include <algorithm>

namespace dtensor {
namespace ops {
namespace {

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
  // triu/tril (causal masks): position-dependent in the last two dims, so only the leading
  // dims may be sharded; linear, so Partial stays Partial.
  auto triangle = [](const OpCall& c) {
    std::vector<DimOption> o{{{Replicate{}}, {Replicate{}}}};
    for (int64_t d = 0; d + 2 < c.inputs[0]->ndim(); ++d) o.push_back({{Shard{d}}, {Shard{d}}});
    for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) o.push_back({{Partial(op)}, {Partial(op)}});
    return o;
  };
  for (const char* n : {"aten::triu", "aten::tril", "aten::triu_", "aten::tril_"}) register_rule(n, triangle);
  // Plain results must agree on every rank: compute them from replicated inputs.
  auto replicated_scalar = [](const OpCall& c) {
    return std::vector<DimOption>{{{}, std::vector<Placement>(c.inputs.size(), Replicate{})}};
  };
  // Output shapes that depend on the values: computed on replicated inputs, replicated.
  auto replicated_data_dependent = [](const OpCall& c) {
    return std::vector<DimOption>{{std::vector<Placement>(std::max<size_t>(c.output_meta.size(), 1), Replicate{}),
                                   std::vector<Placement>(c.inputs.size(), Replicate{})}};
  };
  RuleOptions from_local;
  from_local.output_shape_from_local = true;
  for (const char* n : {"aten::masked_select", "aten::nonzero"})
    register_rule(n, replicated_data_dependent, nullptr, from_local);
  // masked_scatter fills the masked positions in row-major order from `source`: which source
  // element lands where depends on the mask everywhere before it, so everything is replicated.
  auto all_replicated = [](const OpCall& c) {
    return std::vector<DimOption>{{std::vector<Placement>(std::max<size_t>(c.output_meta.size(), 1), Replicate{}),
                                   std::vector<Placement>(c.inputs.size(), Replicate{})}};
  };
  for (const char* n : {"aten::masked_scatter", "aten::masked_scatter_"}) register_rule(n, all_replicated);
  register_rule("aten::_local_scalar_dense", replicated_scalar);
  register_rule("aten::equal", replicated_scalar);
  register_rule("aten::is_nonzero", replicated_scalar);
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
