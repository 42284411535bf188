// suites/testing/training.h: the training preamble the model suites share (tensor parallel in
// suites/models, FSDP and FSDP x TP in suites/fsdp): deterministic parameters, the two
// optimizers, the loss and token batches, so every suite compares against the same reference
// in the same way.
#pragma once

#include "dtensor/nn/hooks.h"
#include "dtensor/nn/module_surgery.h"
#include "suites/parallel/parallel_testing.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtensor {
namespace testing {

// Deterministic parameters (no RNG: ranks as threads share the generator, and the reference
// must equal the parallelized model's starting point on every rank). Norm weights near 1.
inline void init_deterministic(torch::nn::Module& m) {
  at::NoGradGuard no_grad;
  double offset = 0;
  for (auto& kv : nn::named_parameters(m)) {
    at::Tensor& p = kv.second;
    const bool norm_weight = kv.first.find("norm.weight") != std::string::npos;
    p.copy_(norm_weight ? 1 + 0.1 * values(p.sizes().vec(), offset) : 0.4 * values(p.sizes().vec(), offset));
    offset += 1.3;
  }
}

// Linear + ReLU, the Linear called through nn::call (so hooks on it run): the block the FSDP
// suites stack into small models.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int64_t in, int64_t out) : lin(register_module("lin", torch::nn::Linear(in, out))) {}
  at::Tensor forward(const at::Tensor& x) { return at::relu(nn::call(lin, x)); }
  torch::nn::Linear lin;
};
TORCH_MODULE(Block);

enum class Optim { kSGD, kAdam };

// SGD (lr 0.05, momentum 0.9) or Adam (lr 0.01, eps 1e-6).
inline std::unique_ptr<torch::optim::Optimizer> make_optimizer(Optim o, const std::vector<at::Tensor>& params) {
  if (o == Optim::kSGD) return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  // eps 1e-6, not Adam's 1e-8: a gradient entry near 0 (below ~1e-7) is rounding noise that
  // differs between the sharded and the single-device matmuls, and with eps 1e-8 Adam turns its
  // sign into a step of ~lr, so the parameters would compare rounding, not sharding (on
  // libtorch 2.6 layers.0.feed_forward.w2 differed by up to 3e-4 after 3 steps that way).
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01).eps(1e-6));
}

inline at::Tensor mean_square(const at::Tensor& out) { return out.pow(2).mean(); }

// A [batch, seq] block of token ids below args.vocab_size (any ModelArgs-like type).
template <class Args>
at::Tensor tokens_for(const Args& args, int64_t batch, int64_t seq) {
  return (at::arange(batch * seq, at::kLong) * 5 + 3).remainder(args.vocab_size).view({batch, seq});
}

}  // namespace testing
}  // namespace dtensor
