// dtensor/checkpoint/state_dict.h
//
// Model and optimizer state dicts for distributed checkpoints
// (torch.distributed.checkpoint.state_dict): plain and tensor-parallel models (DTensor
// parameters), SGD / Adam / AdamW state keyed by parameter name.
//
//   namespace dcp = dtensor::checkpoint;
//   dcp::StateDict sd = dcp::with_prefix(dcp::get_model_state_dict(model), "model.");
//   dcp::StateDict osd = dcp::get_optimizer_state_dict(model, optim);
//   sd.merge(dcp::with_prefix(osd, "optim."));
//   dcp::save(sd, dir);
//   ...                                              // another process, maybe another layout
//   dcp::StateDict msd = dcp::get_model_state_dict(model2), osd2 = dcp::get_optimizer_state_dict(model2, optim2);
//   dcp::StateDict all = dcp::with_prefix(msd, "model."); all.merge(dcp::with_prefix(osd2, "optim."));
//   dcp::load(all, dir);
//   dcp::set_model_state_dict(model2, dcp::strip_prefix(all, "model."));
//   dcp::set_optimizer_state_dict(model2, optim2, dcp::strip_prefix(all, "optim."));
//
// Keys: the model's are its parameter names (tied parameters once) and buffer names. The
// optimizer's are "state.<param>.<name>" (exp_avg, exp_avg_sq, max_exp_avg_sq, momentum_buffer:
// tensors laid out like the parameter; step: an int), and "param_groups.<param>.<option>" (lr,
// betas, eps, weight_decay, amsgrad, momentum, dampening, nesterov) for each parameter of each
// group, so that a state dict does not depend on the order of parameters in the optimizer.
//
// Without full_state_dict, the tensors of the returned dict ARE the model's parameters and
// the optimizer's state (a DCP load into them updates the model in place). A fresh optimizer
// gets its state created first (zeros, step 0: what its first step would create; PyTorch
// initialises it with a step on zero gradients), so that it has keys to load into.
//
// Calls are collective (every rank of the default group, same model structure) when a process
// group is initialised and full_state_dict or broadcast_from_rank0 is set, or a value needs
// redistributing; a key mismatch under strict raises on every rank.
#pragma once

#include "dtensor/checkpoint/save_load.h"

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>

namespace dtensor {
namespace checkpoint {

struct StateDictOptions {
  // get: every DTensor gathered into a plain tensor (collective). set: values may be full
  // plain tensors (also the default: a plain value for a DTensor target is sliced).
  bool full_state_dict = false;
  // get: tensors copied to the CPU; with full_state_dict, only rank 0 gets the values and the
  // other ranks an empty dict.
  bool cpu_offload = false;
  // set: only rank 0's values are used (full tensors); the other ranks may pass an empty dict.
  bool broadcast_from_rank0 = false;
  // set: keys of the model (or optimizer) missing from the dict, and keys of the dict the model
  // lacks, are errors; with false they are returned and skipped.
  bool strict = true;
  // Optimizer state dicts in PyTorch's layout (what torch.distributed.checkpoint.state_dict's
  // get_state_dict gives, flattened as DCP flattens it), for checkpoints shared with PyTorch
  // jobs: "state.<param>.step" is a 0-dim float32 tensor (ours: an int), and the options are
  // per group, "param_groups.<i>.<option>" with "param_groups.<i>.params" listing the group's
  // parameter names (ours: "param_groups.<param>.<option>"). get also gives the options
  // PyTorch's optimizers have and libtorch's do not, with the values libtorch's behave as
  // (maximize, foreach, differentiable, fused; Adam and AdamW: capturable,
  // decoupled_weight_decay), so that PyTorch's dcp.load finds every key it asks for. set reads
  // each parameter's options from the group listing it, and refuses (naming the group) a
  // group whose maximize or differentiable is set, or whose decoupled_weight_decay is not
  // this optimizer's (AdamW's is true, Adam's false).
  bool pytorch_layout = false;
};

StateDict get_model_state_dict(const torch::nn::Module& model, const StateDictOptions& options = {});
LoadResult set_model_state_dict(torch::nn::Module& model, const StateDict& state_dict,
                                const StateDictOptions& options = {});

// `optim` must be an SGD, Adam or AdamW over parameters of `model`.
StateDict get_optimizer_state_dict(const torch::nn::Module& model, torch::optim::Optimizer& optim,
                                   const StateDictOptions& options = {});
LoadResult set_optimizer_state_dict(const torch::nn::Module& model, torch::optim::Optimizer& optim,
                                    const StateDict& state_dict, const StateDictOptions& options = {});

// "w" -> "<prefix>w", and back (strip_prefix keeps only the keys that start with it).
StateDict with_prefix(const StateDict& state_dict, const std::string& prefix);
StateDict strip_prefix(const StateDict& state_dict, const std::string& prefix);

}  // namespace checkpoint
}  // namespace dtensor
