// models/mlp.h
//
// The small reference models of PyTorch's common_dtensor.py that tensor-parallel tests use:
// MLPModule (Linear 10->16, ReLU, Linear 16->10) and MLPStacked (n MLPModules in a row).
// Children are called through dtensor::nn::call, so parallel styles can hook them.
//
//   dtensor::models::MLPModule mlp;                      // same weights on every rank (seed 5)
//   dtensor::parallelize_module(*mlp, mesh, {{"net1", dtensor::ColwiseParallel()},
//                                            {"net2", dtensor::RowwiseParallel()}});
//   at::Tensor y = dtensor::nn::call(mlp, x);
//
// NOTE: [Seeded construction]
// PyTorch's MLPModule calls torch.manual_seed(5) before creating its layers, so every rank
// builds the same weights. Ranks as threads share libtorch's global generator, so here the
// layers are initialised from a private generator seeded with 5, drawing in the same order
// and with the same bounds as Linear's reset_parameters: the weights equal those of
// torch::nn::Linear(10, 16), torch::nn::Linear(16, 10) built after at::manual_seed(5), and
// construction neither reads nor advances the global generator's stream for other threads
// (the Linear constructors still draw from it once, as libtorch's do).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>

namespace dtensor {
namespace models {

// The seed MLPModule uses (NOTE: [Seeded construction]).
constexpr uint64_t kMLPSeed = 5;

class MLPModuleImpl : public torch::nn::Module {
 public:
  explicit MLPModuleImpl(c10::Device device = c10::Device(c10::kCPU), bool bias = true);
  at::Tensor forward(const at::Tensor& x);
  // Re-initialises both layers from the global generator (like nn.Linear.reset_parameters).
  void reset_parameters();

  torch::nn::Linear net1{nullptr};
  torch::nn::ReLU relu{nullptr};
  torch::nn::Linear net2{nullptr};
};
TORCH_MODULE(MLPModule);

class MLPStackedImpl : public torch::nn::Module {
 public:
  explicit MLPStackedImpl(c10::Device device = c10::Device(c10::kCPU), int64_t n_layers = 2);
  at::Tensor forward(at::Tensor x);

  torch::nn::ModuleList layers{nullptr};  // MLPModules, named "0", "1", ...
};
TORCH_MODULE(MLPStacked);

}  // namespace models
}  // namespace dtensor
