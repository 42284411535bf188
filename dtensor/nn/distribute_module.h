// dtensor/nn/distribute_module.h
//
// distribute_module: the counterpart of torch.distributed.tensor.distribute_module. It
// partitions a module's parameters into DTensors and installs input/output transforms as
// forward hooks; parallel styles (dtensor/parallel) are built on it.
//
//   dtensor::nn::distribute_module(*mlp, mesh,
//       [](const std::string& name, torch::nn::Module& m, const dtensor::DeviceMesh& mesh) {
//         if (auto* lin = dynamic_cast<torch::nn::LinearImpl*>(&m))
//           dtensor::nn::swap_parameter(*lin, "weight",
//               dtensor::distribute_tensor(lin->weight.detach(), mesh, {dtensor::Shard{0}}));
//       },
//       /*input_fn=*/[](torch::nn::Module&, dtensor::nn::ForwardInputs& in, const dtensor::DeviceMesh& mesh) {
//         in[0] = dtensor::distribute_tensor(in[0].toTensor(), mesh, {dtensor::Replicate{}});
//       });
//   at::Tensor y = dtensor::nn::call(mlp, x);   // hooks run through call()
//
// Collective: partition_fn runs on every rank (distribute_tensor broadcasts from the mesh's
// first rank); the hooks' collectives run at each call, so every rank must call the module
// the same number of times.
#pragma once

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/hooks.h"
#include "dtensor/placement/placement.h"

#include <functional>
#include <string>

namespace dtensor {
namespace nn {

// Called for the module itself (name "") and each descendant (dotted path), parents first.
using PartitionFn =
    std::function<void(const std::string& name, torch::nn::Module& module, const DeviceMesh& mesh)>;
// Transform the inputs / the output of the module (registered as forward hooks on it).
using InputFn = std::function<void(torch::nn::Module& module, ForwardInputs& inputs, const DeviceMesh& mesh)>;
using OutputFn = std::function<void(torch::nn::Module& module, c10::IValue& output, const DeviceMesh& mesh)>;

// Without partition_fn every parameter of the module and its descendants is replicated
// (distribute_tensor with Replicate on every mesh dim). Buffers stay plain tensors (libtorch
// keeps them in a private registry). Parameters that already are DTensors are left alone.
// Returns the handles of the hooks it registered (none when both fns are empty).
std::vector<RemovableHandle> distribute_module(torch::nn::Module& module, const DeviceMesh& mesh,
                                               PartitionFn partition_fn = nullptr, InputFn input_fn = nullptr,
                                               OutputFn output_fn = nullptr);

// Swaps every (defined) parameter of `module` itself that is not yet a DTensor for
// distribute_tensor(param, mesh, placements). Collective.
void distribute_parameters(torch::nn::Module& module, const DeviceMesh& mesh,
                           const std::vector<Placement>& placements);

}  // namespace nn
}  // namespace dtensor
