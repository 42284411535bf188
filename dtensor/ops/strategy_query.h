// dtensor/ops/strategy_query.h: what a sharding rule offers for one call, beside what
// propagate() chooses, for tools that judge the rules (converters/strategy_discovery.h: a
// strategy the rule offers that is not valid, a valid one it does not offer).
//
//   ops::OpCall call = ...;  // as the dispatcher builds it (dtensor/ops/registry.h)
//   auto q = ops::query_strategies(call, [&] { return output_meta; });
//   for (const auto& o : q->options) ...  // each single-dim option the rule gave
#pragma once

#include "dtensor/ops/registry.h"

#include <functional>
#include <optional>
#include <vector>

namespace dtensor {
namespace ops {

struct StrategyQuery {
  // The rule's single-dim options for the call, fitted to it (an out= tensor takes the
  // placement of the output it receives), in the rule's order.
  std::vector<DimOption> options;
  // For each option, whether it may run on the call's mesh (valid_strategy: what an op writes
  // keeps its layout, RuleOptions::valid) when every mesh dim takes it.
  std::vector<bool> runnable;
  // What propagate() chooses (the cheapest valid strategy), computed afresh.
  OutputSharding chosen;
  // For a call with strided inputs, what propagate() runs instead when it may relabel them as
  // plain shards (NOTE: [Ops on strided shards]); nullopt otherwise.
  std::optional<OutputSharding> relabelled;
  // The rule runs the local computation its own way (RuleOptions::kernel, a LocalArgRewrite):
  // the op on the local pieces is not what it runs.
  bool has_kernel = false;
  bool has_rewrite = false;
  bool random = false;
};

// `chosen` is not cached, and is without propagate's relabelling of strided shards, which
// `relabelled` gives. nullopt when the op has no rule. `infer_meta` fills call.output_meta
// first. Throws what the rule throws; `chosen.cost` is infinity when no option is valid.
std::optional<StrategyQuery> query_strategies(OpCall& call,
                                              const std::function<std::vector<TensorMeta>()>& infer_meta);

}  // namespace ops
}  // namespace dtensor
