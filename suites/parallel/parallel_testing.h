// suites/parallel/parallel_testing.h: helpers shared by the tensor-parallel and model suites.
#pragma once

#include "dtensor/tensor/dtensor.h"

#include <ATen/ATen.h>

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

// The whole tensor: full_tensor() of a DTensor (collective), the tensor itself otherwise.
inline at::Tensor gathered(const at::Tensor& t) { return is_dtensor(t) ? full_tensor(t) : t; }

}  // namespace testing
}  // namespace dtensor
