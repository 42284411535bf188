// dtensor/nn/checkpoint.cpp: activation checkpointing as a hand-written autograd Node (the
// saved function is not an IValue, so torch::autograd::Function's saved_data does not fit).
#include "dtensor/nn/checkpoint.h"

#include "dtensor/compat.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <mutex>
#include <optional>

namespace dtensor {
namespace nn {

namespace {

at::Tensor rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lk(gen.mutex());
  return gen.get_state();
}

void set_rng_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lk(gen.mutex());
  gen.set_state(state);
}

struct CheckpointBackward : torch::autograd::Node {
  std::function<at::Tensor(const at::Tensor&)> fn;
  at::Tensor input;  // detached
  bool input_requires_grad = false;
  std::optional<at::Tensor> saved_rng;

  std::string name() const override { return "dtensor::nn::CheckpointBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    TORCH_CHECK(fn != nullptr, "checkpoint: the backward of a checkpointed function ran twice; "
                "retain_graph is not supported with dtensor::nn::checkpoint");
    auto f = std::move(fn);
    fn = nullptr;
    if (!grads[0].defined()) return {at::Tensor()};
    // 1. Recompute with grad, from a fresh leaf sharing the input's data.
    at::Tensor x = input.detach();
    if (input_requires_grad) x.set_requires_grad(true);
    at::Tensor y;
    {
      at::AutoGradMode enable(true);
      std::optional<at::Tensor> current;
      if (saved_rng) {
        current = rng_state();
        set_rng_state(*saved_rng);
      }
      try {
        y = f(x);
      } catch (...) {
        if (current) set_rng_state(*current);
        throw;
      }
      if (current) set_rng_state(*current);
    }
    // 2. Backward through the recomputed graph: parameters accumulate their .grad, x gets its.
    if (y.requires_grad()) torch::autograd::backward({y}, {grads[0]});
    return {input_requires_grad ? x.grad() : at::Tensor()};
  }
};

}  // namespace

at::Tensor checkpoint(std::function<at::Tensor(const at::Tensor&)> fn, const at::Tensor& input,
                      const CheckpointOptions& options) {
  TORCH_CHECK(fn != nullptr, "checkpoint: the function is empty");
  if (!at::GradMode::is_enabled()) return fn(input);
  std::optional<at::Tensor> saved_rng;
  if (options.preserve_rng_state) saved_rng = rng_state();
  at::Tensor out;
  {
    at::NoGradGuard no_grad;
    out = fn(input);
  }
  TORCH_CHECK(out.defined(), "checkpoint: the function returned an undefined tensor");
  auto node = compat::make_node<CheckpointBackward>();
  node->fn = std::move(fn);
  node->input = input.detach();
  node->input_requires_grad = input.requires_grad();
  node->saved_rng = std::move(saved_rng);
  node->set_next_edges(torch::autograd::collect_next_edges(input));
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace nn
}  // namespace dtensor
