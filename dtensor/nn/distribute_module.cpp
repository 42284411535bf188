// dtensor/nn/distribute_module.cpp
#include "dtensor/nn/distribute_module.h"

#include "dtensor/nn/module_surgery.h"
#include "dtensor/tensor/dtensor.h"

#include <c10/util/Exception.h>

namespace dtensor {
namespace nn {

void distribute_parameters(torch::nn::Module& module, const DeviceMesh& mesh, const std::vector<Placement>& placements) {
  // Collect first: swapping while iterating the registry would invalidate it.
  std::vector<std::pair<std::string, at::Tensor>> plain;
  for (const auto& kv : module.named_parameters(/*recurse=*/false))
    if (kv.value().defined() && !is_dtensor(kv.value())) plain.emplace_back(kv.key(), kv.value());
  for (auto& [name, param] : plain) swap_parameter(module, name, distribute_tensor(param.detach(), mesh, placements));
}

std::vector<RemovableHandle> distribute_module(torch::nn::Module& module, const DeviceMesh& mesh,
                                               PartitionFn partition_fn, InputFn input_fn, OutputFn output_fn) {
  const std::vector<Placement> replicate(static_cast<size_t>(mesh.ndim()), Replicate{});
  for (const auto& kv : module.named_modules(/*name_prefix=*/"", /*include_self=*/true)) {
    if (partition_fn) partition_fn(kv.key(), *kv.value(), mesh);
    else distribute_parameters(*kv.value(), mesh, replicate);
  }
  std::vector<RemovableHandle> handles;
  if (input_fn)
    handles.push_back(register_forward_pre_hook(
        module, [input_fn, mesh](torch::nn::Module& m, ForwardInputs& inputs) { input_fn(m, inputs, mesh); }));
  if (output_fn)
    handles.push_back(register_forward_hook(
        module, [output_fn, mesh](torch::nn::Module& m, const ForwardInputs&, c10::IValue& out) {
          output_fn(m, out, mesh);
        }));
  return handles;
}

}  // namespace nn
}  // namespace dtensor
