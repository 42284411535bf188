// dtensor/ops/random_rules.cpp: random ops (DESIGN.md D5). Their rules are marked
// RuleOptions::random: the dispatcher runs them through the RNG tracker, which makes every
// placement give the single-device values (NOTE: [Random ops on DTensors] in
// dtensor/tensor/random.h). The placements are those of an elementwise op: the output is laid
// out like the input it is drawn for, so no option needs communication; inputs that
// parametrise the draws (probabilities, means, stds) follow the output, broadcasting.
// A random value is not a sum of per-rank values: a Partial input is reduced first, except
// for dropout, which is linear in its input (NOTE: [Partial and linearity]) once every rank
// draws the same mask. An in-place random op on a Partial tensor is refused (it cannot stay
// Partial).
// at::dropout and bernoulli.p are composite: on CPU they reach the dispatcher as empty_like +
// bernoulli_.float + div_ + mul, covered here and by the pointwise rules.
#include "dtensor/ops/registry.h"

namespace dtensor {
namespace ops {
namespace {

const Placement R = Replicate{};

// Replicate, and Shard(d) of the (first) output with every input following through
// broadcasting.
std::vector<DimOption> elementwise_options(const OpCall& c) {
  const size_t n_in = c.inputs.size();
  const size_t n_out = c.output_meta.size();
  const std::vector<int64_t>& out_shape = c.output_meta[0].shape;
  std::vector<DimOption> o{{std::vector<Placement>(n_out, R), std::vector<Placement>(n_in, R)}};
  for (int64_t d = 0; d < static_cast<int64_t>(out_shape.size()); ++d) {
    DimOption s{std::vector<Placement>(n_out, Shard{d}), {}};
    for (auto* in : c.inputs) {
      const int64_t a = broadcast_input_dim(in->tensor_meta.shape, out_shape, d);
      s.inputs.push_back(a < 0 ? R : Placement(Shard{a}));
    }
    o.push_back(std::move(s));
  }
  return o;
}

// rand_like/randn_like: the values do not depend on the input's, so a Partial input gives a
// Replicate output without communication.
std::vector<DimOption> like_options(const OpCall& c) {
  std::vector<DimOption> o = elementwise_options(c);
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG, comm::ReduceOp::MIN, comm::ReduceOp::MAX})
    o.push_back({{R}, {Partial(op)}});
  return o;
}

// native_dropout(input, p, train) -> (output, mask): output = input * mask * scale is linear
// in input; the mask is the same on every rank.
std::vector<DimOption> native_dropout_options(const OpCall& c) {
  std::vector<DimOption> o = elementwise_options(c);
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) o.push_back({{Partial(op), R}, {Partial(op)}});
  return o;
}

// native_dropout_backward(grad_output, mask, scale) = grad_output * mask * scale: not random,
// linear in grad_output.
std::vector<DimOption> native_dropout_backward_options(const OpCall& c) {
  std::vector<DimOption> o = elementwise_options(c);
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) o.push_back({{Partial(op)}, {Partial(op), R}});
  return o;
}

const bool registered = [] {
  RuleOptions random;
  random.random = true;
  // In place, drawing into self (whose values are overwritten).
  for (const char* op : {"aten::uniform_", "aten::normal_", "aten::bernoulli_.float", "aten::bernoulli_.Tensor",
                         "aten::exponential_", "aten::cauchy_", "aten::log_normal_", "aten::geometric_",
                         "aten::random_", "aten::random_.from", "aten::random_.to"})
    register_rule(op, elementwise_options, nullptr, random);
  // Functional: bernoulli(probabilities), normal(mean, std) in its tensor overloads.
  for (const char* op : {"aten::bernoulli", "aten::bernoulli.Tensor", "aten::normal.Tensor_float",
                         "aten::normal.float_Tensor", "aten::normal.Tensor_Tensor", "aten::normal_functional"})
    register_rule(op, elementwise_options, nullptr, random);
  register_rule("aten::rand_like", like_options, nullptr, random);
  register_rule("aten::randn_like", like_options, nullptr, random);
  register_rule("aten::randint_like", like_options, nullptr, random);
  register_rule("aten::native_dropout", native_dropout_options, nullptr, random);
  register_rule("aten::native_dropout_backward", native_dropout_backward_options);
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
