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
// be a glob with `*` (any run of characters) and `?` (one character), matched against child
// names, so "layers.*.attention.wq" covers every layer. Entries apply in plan order. The
// whole plan is checked before anything is applied: a path that matches no submodule, a style
// on a module it does not support, or two parameter-distributing styles on one module raise
// on every rank before any collective.
//
// Collective: every rank of `mesh` must call it with the same module structure and plan.
#pragma once

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/parallel/style.h"

#include <memory>
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
                                      const ParallelizePlan& plan);
// Applies one style to `module` itself.
torch::nn::Module& parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh,
                                      const ParallelStyle& style);

// The same for a ModuleHolder (torch::nn::Linear, models::Transformer, ...); returns it.
template <class Impl>
torch::nn::ModuleHolder<Impl> parallelize_module(torch::nn::ModuleHolder<Impl> module, const DeviceMesh& mesh,
                                                 const ParallelizePlan& plan) {
  parallelize_module(static_cast<torch::nn::Module&>(*module), mesh, plan);
  return module;
}
template <class Impl>
torch::nn::ModuleHolder<Impl> parallelize_module(torch::nn::ModuleHolder<Impl> module, const DeviceMesh& mesh,
                                                 const ParallelStyle& style) {
  parallelize_module(static_cast<torch::nn::Module&>(*module), mesh, style);
  return module;
}

// The dotted paths of the submodules of `module` that `pattern` matches (glob components as
// above), in traversal order. Not collective.
std::vector<std::string> match_module_paths(torch::nn::Module& module, const std::string& pattern);

}  // namespace dtensor
