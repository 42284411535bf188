// models/mlp.cpp
#include "models/mlp.h"

#include "dtensor/nn/hooks.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

namespace dtensor {
namespace models {

namespace {

// torch::nn::LinearImpl::reset_parameters with an explicit generator: kaiming_uniform_(weight,
// a = sqrt(5)), then bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), with libtorch's expressions so
// that the bounds round identically.
void init_linear(torch::nn::LinearImpl& lin, at::Generator& gen) {
  at::NoGradGuard no_grad;
  const int64_t fan_in = lin.weight.size(1);
  const double a = std::sqrt(5.0);
  const double gain = std::sqrt(2.0 / (1 + std::pow(a, 2)));
  const double std_dev = gain / std::sqrt(fan_in);
  const double bound = std::sqrt(3.0) * std_dev;
  lin.weight.uniform_(-bound, bound, gen);
  if (lin.bias.defined()) {
    const auto bias_bound = 1 / std::sqrt(fan_in);
    lin.bias.uniform_(-bias_bound, bias_bound, gen);
  }
}

}  // namespace

MLPModuleImpl::MLPModuleImpl(c10::Device device, bool bias) {
  net1 = register_module("net1", torch::nn::Linear(torch::nn::LinearOptions(10, 16).bias(bias)));
  relu = register_module("relu", torch::nn::ReLU());
  net2 = register_module("net2", torch::nn::Linear(torch::nn::LinearOptions(16, 10).bias(bias)));
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(kMLPSeed);
  init_linear(*net1, gen);
  init_linear(*net2, gen);
  to(device);
}

at::Tensor MLPModuleImpl::forward(const at::Tensor& x) { return nn::call(net2, nn::call(relu, nn::call(net1, x))); }

void MLPModuleImpl::reset_parameters() {
  net1->reset_parameters();
  net2->reset_parameters();
}

MLPStackedImpl::MLPStackedImpl(c10::Device device, int64_t n_layers) {
  TORCH_CHECK(n_layers >= 0, "MLPStacked: n_layers must be >= 0, got ", n_layers);
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < n_layers; ++i) layers->push_back(MLPModule(device));
}

at::Tensor MLPStackedImpl::forward(at::Tensor x) {
  for (size_t i = 0; i < layers->size(); ++i) x = nn::call(layers->ptr<MLPModuleImpl>(i), x);
  return x;
}

}  // namespace models
}  // namespace dtensor
