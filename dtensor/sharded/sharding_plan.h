// dtensor/sharded/sharding_plan.h
//
// ShardingPlan: how shard_module shards a module (torch.distributed._shard.sharding_plan and
// .sharder): a spec per parameter, or a custom Sharder per submodule; optionally the layout of
// some modules' outputs and which modules return their local shard.
//
//   auto colwise = std::make_shared<ChunkShardingSpec>(0, placements);
//   auto rowwise = std::make_shared<ChunkShardingSpec>(1, placements);
//   ShardingPlan plan;
//   plan.plan = {{"net1.weight", colwise}, {"net2.weight", rowwise}};
//   plan.output_plan = {{"net2", colwise}};        // net2's output resharded to rows
//   plan.return_local_tensor = {"net2"};           // ... and returned as this rank's rows
//   shard_module(*mlp, plan);                      // collective (api.h)
#pragma once

#include "dtensor/sharded/sharding_spec.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace torch {
namespace nn {
class Module;
}
}  // namespace torch

namespace dtensor {
namespace sharded {

// Replaces a submodule by a sharded version of itself (torch.distributed._shard.sharder.Sharder).
class Sharder {
 public:
  virtual ~Sharder() = default;
  // The sharded module: `module` itself changed in place, or a new module that shard_module
  // registers under the old one's name (Module::replace_module). A parent that reads the child
  // through a typed member (torch::nn::Linear fc) keeps the old module in that member: shard in
  // place, or have the parent look its children up by name.
  virtual std::shared_ptr<torch::nn::Module> shard(const std::shared_ptr<torch::nn::Module>& module) = 0;
};

struct ShardingPlan {
  // A spec shards the parameter named by the key ("net1.weight"); a Sharder replaces the
  // submodule named by the key ("embeddings"). An empty pointer is an error.
  using Entry = std::variant<std::shared_ptr<const ShardingSpec>, std::shared_ptr<Sharder>>;

  // In order; names must be unique.
  std::vector<std::pair<std::string, Entry>> plan;
  // Module path ("" for the root) -> the spec its output is resharded to (a forward hook).
  std::optional<std::vector<std::pair<std::string, std::shared_ptr<const ShardingSpec>>>> output_plan;
  // Module paths whose output is replaced by this rank's local shard (a forward hook).
  std::optional<std::vector<std::string>> return_local_tensor;
};

// Builds a plan for a module (torch.distributed._shard.sharding_plan.ShardingPlanner).
class ShardingPlanner {
 public:
  virtual ~ShardingPlanner() = default;
  virtual ShardingPlan build_plan(torch::nn::Module& module) = 0;
};

}  // namespace sharded
}  // namespace dtensor
