// dtensor/parallel/api.h
//
// parallelize_module: applies parallel styles (style.h) to the submodules of a module tree,
// the counterpart of torch.distributed.tensor.parallel.parallelize_module.
//
//   // Every rank, same model, 1-D mesh over the tensor-parallel ranks:
//   dtensor::parallelize_module(*model, tp_mesh, {
//       {"tok_embeddings", dtensor::RowwiseParallel().input_layouts(dtensor::Replicate{})},
//       {"layers.*.attention.wq", dtensor::ColwiseParallel()},
//       {"layers.*.attention.wo", dtensor::RowwiseParallel()},
//   });
//   at::Tensor y = dtensor::nn::call(model, tokens);  // children called through nn::call
//
// Plan paths are dotted child names from `module` ("layers.0.attention.wq"); a component may
// be a glob as Python's fnmatch reads it (`*` any run of characters, `?` one character,
// `[1-2]` / `[!0]` one character in / not in a set), matched against child names, so
// "layers.*.attention.wq" covers every layer and "net[1-2]" the children net1 and net2. The
// path "" is `module` itself. Entries apply in plan order. The whole plan is checked before
// anything is applied: a style on a module it does not support, or two parameter-distributing
// styles on one module raise on every rank before any collective. A path that matches no
// submodule is skipped with a warning (TORCH_WARN), as PyTorch does.
//
// src_data_rank (PyTorch's keyword argument): the parameters are distributed from the rank at
// this coordinate of the mesh (default 0); nullopt: no communication, each rank keeps its own
// piece of its own values (distribute_tensor's src_data_rank).
//
// Collective: every rank of `mesh` must call it with the same module structure and plan.
#pragma once

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/parallel/style.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

namespace torch {
namespace nn {
class Module;
template <class Impl>
class ModuleHolder;
}  // namespace nn
}  // namespace torch

namespace dtensor {

// One plan entry: a module path (with globs) and the style for the modules it matches.
struct PlanEntry {
  template <class Style, class = std::enable_if_t<std::is_base_of<ParallelStyle, std::decay_t<Style>>::value>>
  PlanEntry(std::string path, Style&& style)
      : path(std::move(path)), style(std::make_shared<std::decay_t<Style>>(std::forward<Style>(style))) {}
  PlanEntry(std::string path, std::shared_ptr<const ParallelStyle> style)
      : path(std::move(path)), style(std::move(style)) {}

  std::string path;
  std::shared_ptr<const ParallelStyle> style;
};

using ParallelizePlan = std::vector<PlanEntry>;

// Applies `plan` to the submodules of `module`. `mesh` must be 1-D (slice a larger mesh, e.g.
// mesh["tp"]). Returns `module`.
torch::nn::Module& parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh,
                                      const ParallelizePlan& plan, std::optional<int64_t> src_data_rank = 0);
// Applies one style to `module` itself.
torch::nn::Module& parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh,
                                      const ParallelStyle& style, std::optional<int64_t> src_data_rank = 0);
// The same on the current mesh (DeviceMeshGuard in dtensor/tensor/dtensor.h).
torch::nn::Module& parallelize_module(torch::nn::Module& module, const ParallelizePlan& plan);
torch::nn::Module& parallelize_module(torch::nn::Module& module, const ParallelStyle& style);

// The same for a ModuleHolder (torch::nn::Linear, models::Transformer, ...); returns it.
template <class Impl>
torch::nn::ModuleHolder<Impl> parallelize_module(torch::nn::ModuleHolder<Impl> module, const DeviceMesh& mesh,
                                                 const ParallelizePlan& plan,
                                                 std::optional<int64_t> src_data_rank = 0) {
  parallelize_module(static_cast<torch::nn::Module&>(*module), mesh, plan, src_data_rank);
  return module;
}
template <class Impl>
torch::nn::ModuleHolder<Impl> parallelize_module(torch::nn::ModuleHolder<Impl> module, const DeviceMesh& mesh,
                                                 const ParallelStyle& style,
                                                 std::optional<int64_t> src_data_rank = 0) {
  parallelize_module(static_cast<torch::nn::Module&>(*module), mesh, style, src_data_rank);
  return module;
}

template <class Impl>
torch::nn::ModuleHolder<Impl> parallelize_module(torch::nn::ModuleHolder<Impl> module, const ParallelizePlan& plan) {
  parallelize_module(static_cast<torch::nn::Module&>(*module), plan);
  return module;
}
template <class Impl>
torch::nn::ModuleHolder<Impl> parallelize_module(torch::nn::ModuleHolder<Impl> module, const ParallelStyle& style) {
  parallelize_module(static_cast<torch::nn::Module&>(*module), style);
  return module;
}

// The dotted paths of the submodules of `module` that `pattern` matches (glob components as
// above), in traversal order. Not collective.
std::vector<std::string> match_module_paths(torch::nn::Module& module, const std::string& pattern);

}  // namespace dtensor
