// models/rms_norm.h
//
// RMSNorm, the simple test layer of PyTorch's common_dtensor.py (RMSNormPython):
//   y = x * rsqrt(mean(x^2, last dim) + eps) * weight,   weight = ones(dim).
// Its weight member is registered with dtensor::nn (NOTE: [Parameter swap]), so
// SequenceParallel and swap_parameter work on it.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace dtensor {
namespace models {

class RMSNormImpl : public torch::nn::Module {
 public:
  explicit RMSNormImpl(int64_t dim, double eps = 1e-6);
  at::Tensor forward(const at::Tensor& x);

  double eps;
  at::Tensor weight;
};
TORCH_MODULE(RMSNorm);

}  // namespace models
}  // namespace dtensor
