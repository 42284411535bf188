// suites/parallel/parallel_testing.h: helpers shared by the tensor-parallel and model suites.
#pragma once

#include "dtensor/tensor/dtensor.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <vector>

namespace dtensor {
namespace testing {

// Deterministic values (not at::randn: ranks as threads share the global generator, and every
// rank must compute the same reference).
inline at::Tensor values(const std::vector<int64_t>& shape, double offset = 0.0) {
  int64_t numel = 1;
  for (int64_t s : shape) numel *= s;
  return (at::arange(numel, at::kDouble) * 0.37 + offset).sin().to(at::kFloat).reshape(shape);
}

// Sets every parameter of `m` (in registration order) to deterministic values: the i-th gets
// values(its shape, offset + i) * 0.5, so a plain module and its parallelized copy set with the
// same offset hold the same weights.
inline void set_parameters(torch::nn::Module& m, double offset) {
  at::NoGradGuard no_grad;
  for (auto& p : m.parameters()) {
    p.copy_(values(p.sizes().vec(), offset) * 0.5);
    offset += 1;
  }
}

// The whole tensor: full_tensor() of a DTensor (collective), the tensor itself otherwise.
inline at::Tensor gathered(const at::Tensor& t) { return is_dtensor(t) ? full_tensor(t) : t; }

}  // namespace testing
}  // namespace dtensor
