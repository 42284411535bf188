// dtensor/nn/module_surgery.h
//
// Replacing a registered parameter of a torch::nn module (DESIGN.md D4): the C++ counterpart
// of PyTorch's `module.register_parameter(name, nn.Parameter(dtensor))`, which is how
// parallel styles put DTensor parameters into a model.
//
//   torch::nn::Linear lin(10, 16);
//   at::Tensor w = dtensor::distribute_tensor(lin->weight.detach(), mesh, {dtensor::Shard{0}});
//   dtensor::nn::swap_parameter(*lin, "weight", w);
//   // lin->weight, lin->named_parameters()["weight"] and optimizers built afterwards see w.
//
// NOTE: [Parameter swap]
// A libtorch module holds each parameter twice: in its registry (Module::parameters_, read by
// named_parameters(), optimizers, to(), serialization) and in a public member that forward()
// reads (LinearImpl::weight). Registering a name again throws, and `param.set_data(dtensor)`
// "succeeds" but leaves a plain TensorImpl carrying the DTensor dispatch key (every later use
// raises; see maybe_get_dtensor_impl). So a swap replaces the registry entry (through an
// accessor to the protected registry) AND assigns the member. The member is found in a
// registry of (module type, parameter name) -> member: Linear (weight, bias), Embedding
// (weight) and LayerNorm (weight, bias) are built in; other module types (models::RMSNorm, a
// user's module) add theirs with register_parameter_member. A module type whose member is
// unknown cannot be swapped: the error says how to register it.
//
// Nothing here is collective.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>
#include <c10/util/Type.h>

#include <functional>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

namespace torch {
namespace nn {
class Module;
}  // namespace nn
}  // namespace torch

namespace dtensor {
namespace nn {

// Returns the member of `module` that holds parameter `name`, or nullptr when `module` is not
// of the type the accessor was registered for.
using ParameterMember = std::function<at::Tensor*(torch::nn::Module& module)>;

// Registers the member that holds parameter `name` for modules of type `module_type` (a
// name for messages) and, through `member`, for any module the accessor accepts. Later
// registrations are tried first. Thread-safe.
void register_parameter_member(const std::string& module_type, const std::string& name,
                               ParameterMember member);

// Typed form: modules of type ModuleImpl (or derived from it) keep parameter `name` in
// `member`, e.g. register_parameter_member<models::RMSNormImpl>("weight", &RMSNormImpl::weight).
template <class ModuleImpl>
void register_parameter_member(const std::string& name, at::Tensor ModuleImpl::*member) {
  register_parameter_member(c10::demangle(typeid(ModuleImpl).name()), name,
                            [member](torch::nn::Module& m) -> at::Tensor* {
                              auto* typed = dynamic_cast<ModuleImpl*>(&m);
                              return typed ? &(typed->*member) : nullptr;
                            });
}

// True when swap_parameter(module, name, ...) knows the member of `name` for this module.
bool has_parameter_member(torch::nn::Module& module, const std::string& name);

// Replaces parameter `name` of `module` (not of its children) by `value`, in the registry and
// in the member (NOTE: [Parameter swap]). `value` must be defined and have the global shape of
// the current parameter. A leaf `value` is registered as is (so two modules can share one
// tensor: weight tying); a non-leaf is detached first, as nn.Parameter does. The parameter
// keeps its requires_grad setting. Throws, naming the module type and parameter, when the
// module has no such (defined) parameter or its member is unknown.
void swap_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value);
// The tensor registered as parameter `name` of `module` (not of its children), undefined when
// there is none (PyTorch's Module.get_parameter for a direct child name). No copy of the registry.
at::Tensor get_parameter(torch::nn::Module& module, const std::string& name);
// PyTorch's Module.to_empty(device=...): every parameter of `module` and its descendants
// replaced (swap_parameter) by an uninitialised tensor of its shape and dtype on `device`; a
// DTensor parameter by a DTensor of the same spec over a new local tensor, so only the local
// shard is allocated. Tied parameters stay tied. For a model built on the meta device and
// sharded (fully_shard, parallelize_module) before anything is allocated: initialise it after
// (reset_parameters, torch::nn::init: random ops on DTensors draw the values the single device
// draws, NOTE: [RNG tracker] in dtensor/tensor/random.h). A buffer on the meta device raises,
// naming it (buffers are not replaced). Not collective.
void to_empty(torch::nn::Module& module, c10::Device device);

// The parameters of `module` and its descendants with their dotted names, like
// Module::named_parameters(), but a tensor registered under several names (tied weights) is
// listed once, under its first name (PyTorch's remove_duplicate=True). Hand these to
// optimizers: a tied weight listed twice would be updated twice.
std::vector<std::pair<std::string, at::Tensor>> named_parameters(const torch::nn::Module& module);
std::vector<at::Tensor> parameters(const torch::nn::Module& module);

}  // namespace nn
}  // namespace dtensor
