// dtensor/experimental/local_map.h: PyTorch's torch.distributed.tensor.experimental.local_map
// (_func_map.py): run a function written for local tensors on DTensors, with the placements of
// its inputs and outputs declared and checked.
//
//   // x: Shard(1) on a 1-D mesh, w: Shard(0); the local mm gives a Partial sum.
//   dtensor::experimental::LocalMapOptions o;
//   o.in_placements = {{{dtensor::Shard{1}}}, {{dtensor::Shard{0}}}};
//   auto mm = dtensor::experimental::local_map(
//       [](const std::vector<at::Tensor>& in) { return std::vector<at::Tensor>{at::mm(in[0], in[1])}; },
//       /*out_placements=*/{{{dtensor::Partial{}}}}, o);
//   at::Tensor y = mm({x, w})[0];   // a DTensor, Partial
#pragma once

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/placement/placement.h"

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>
#include <vector>

namespace dtensor {
namespace experimental {

// One argument's or output's placements; nullopt: a plain tensor (not a DTensor).
using PlacementsOrNone = std::optional<std::vector<Placement>>;
using LocalFunction = std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)>;

struct LocalMapOptions {
  // Per input: the placements it must have (nullopt: a plain tensor, passed through). Without
  // it, DTensor inputs are passed as their local tensors whatever their placements.
  std::optional<std::vector<PlacementsOrNone>> in_placements;
  // Per input: the placements of its gradient (to_local's grad_placements); default: the
  // placements it has when passed to `func`.
  std::optional<std::vector<PlacementsOrNone>> in_grad_placements;
  // The mesh of the outputs; default: the mesh of the DTensor inputs (all must share one).
  std::optional<DeviceMesh> device_mesh;
  // A DTensor input whose placements differ from in_placements is redistributed to them
  // (otherwise it is an error naming the input and both placements).
  bool redistribute_inputs = false;
};

// The function that, given inputs some of which are DTensors, checks them against
// options.in_placements (every rank raises the same error), calls `func` on the local tensors
// and wraps each output i with out_placements[i] (from_local without a check, as PyTorch:
// `func` must make outputs that are the shards those placements describe). Called with no
// DTensor input, it calls `func` on the plain tensors and returns its outputs unwrapped.
// out_placements: one entry per output (nullopt: return that output as it is).
std::function<std::vector<at::Tensor>(const std::vector<at::Tensor>&)> local_map(
    LocalFunction func, std::vector<PlacementsOrNone> out_placements, LocalMapOptions options = {});

}  // namespace experimental
}  // namespace dtensor
