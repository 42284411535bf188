// dtensor/ops/pointwise_rules.cpp: elementwise ops with broadcasting (DESIGN.md D5).
//
// NOTE: [Partial and linearity]
// A Partial tensor is a sum (or avg) of per-rank values. An op may keep it Partial only when
// it is linear in that input: f(a1 + a2) = f(a1) + f(a2). add/sub are linear in all operands
// together (every operand Partial); mul is linear in any ONE operand (the others replicated);
// div, neg, clone, the *_backward ops are linear in their first operand, and so is
// masked_fill with the value 0 (the norm and std backward formulas use it in place). Some are
// linear in their first operand and one other together: addcmul, self + value * t1 * t2, in
// self with t1 or with t2 (the other replicated); addcdiv, self + value * t1 / t2, in self with
// t1; lerp, (1 - w) self + w end, in self with end. Adding a scalar, relu, exp, comparisons...
// are not: a Partial input is reduced first.
//
// NOTE: [Partial(max) and Partial(min) through monotone ops]
// A Partial(max) tensor is the elementwise max of the ranks' values, a Partial(min) one their
// min. An op non-decreasing in an input over that input's whole domain keeps it, its other
// inputs replicated: max_i f(a_i, r) = f(max_i a_i, r) (exp, relu, floor, tanh, clamp, add).
// A non-increasing one turns a max into a min and back (neg, erfc, the subtrahend of sub).
// maximum of two Partial(max) tensors is their Partial(max) -- max_i max(a_i, b_i) =
// max(max_i a_i, max_i b_i) -- and minimum of two Partial(min) tensors likewise. Ops monotone
// on part of their domain only (log, sqrt, asin, reciprocal) are left out: another rank's
// value may lie outside it. Some are monotone for some arguments only: mul and div by a
// Scalar by its sign, leaky_relu for a non-negative slope, elu for non-negative parameters,
// add and sub in their second operand by the sign of alpha.
// A Partial(avg) tensor is the mean of the ranks' values, which an affine map keeps even with
// a replicated term: avg_i (a_i + r) = avg_i a_i + r (add, sub, rsub; where and masked_fill
// pick each element from one operand or a replicated value). PyTorch's DTensor registers the
// same for the unary ops, maximum/minimum and add/sub (_pointwise_ops.py).
#include "dtensor/ops/registry.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

namespace dtensor {
namespace ops {
namespace {

enum class Linear { kNone, kAllOperands, kAnyOne, kFirst };

// How an op's result moves with each input (NOTE: [Partial(max) and Partial(min) through
// monotone ops]).
enum class Order { kNone, kIncreasing, kDecreasing };

struct Monotone {
  std::vector<Order> operands;  // by schema argument; kNone past the end
  // Every input with an order Partial(op) gives Partial(op) (maximum: max; where: every kind).
  std::vector<comm::ReduceOp> together;
  bool avg_with_replicated = false;  // Partial(avg) in one input with an order, the others replicated
};

comm::ReduceOp swapped(comm::ReduceOp op) {
  return op == comm::ReduceOp::MAX ? comm::ReduceOp::MIN : comm::ReduceOp::MAX;
}

// Scalar argument `i` as a number; NaN when it is not one (a tensor, None).
double arg_number(const OpCall& c, size_t i, double fallback) {
  if (i >= c.args.size()) return fallback;
  if (c.args[i].kind != ArgInfo::Kind::kOther) return std::nan("");
  const auto& v = c.args[i].value;
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1.0 : 0.0;
  return std::nan("");
}

// How x -> k * x moves: increasing for k >= 0, decreasing for k < 0, unknown for NaN.
Order by_sign(double k) { return k >= 0 ? Order::kIncreasing : k < 0 ? Order::kDecreasing : Order::kNone; }
Order flipped(Order o) {
  return o == Order::kIncreasing ? Order::kDecreasing : o == Order::kDecreasing ? Order::kIncreasing : Order::kNone;
}

// The Partial options of `m` (out= inputs are set by the caller).
std::vector<DimOption> monotone_options(const OpCall& c, const Monotone& m, const std::vector<size_t>& outs,
                                        size_t n_out) {
  const size_t n_in = c.inputs.size();
  std::vector<Order> order;  // of each input, from its schema argument
  for (size_t i = 0; i < c.args.size(); ++i) {
    const auto& a = c.args[i];
    const size_t n = a.kind == ArgInfo::Kind::kDTensor ? 1 : a.kind == ArgInfo::Kind::kDTensorList ? a.list.size() : 0;
    order.insert(order.end(), n, i < m.operands.size() ? m.operands[i] : Order::kNone);
  }
  for (size_t k : outs) order[k] = Order::kNone;
  std::vector<DimOption> opts;
  auto one = [&](size_t j, Placement in, Placement out) {
    DimOption o{std::vector<Placement>(n_out, out), std::vector<Placement>(n_in, Replicate{})};
    o.inputs[j] = in;
    opts.push_back(std::move(o));
  };
  for (size_t j = 0; j < n_in; ++j) {
    if (order[j] == Order::kNone) continue;
    for (auto op : {comm::ReduceOp::MAX, comm::ReduceOp::MIN})
      one(j, Partial(op), Partial(order[j] == Order::kIncreasing ? op : swapped(op)));
    if (m.avg_with_replicated) one(j, Partial(comm::ReduceOp::AVG), Partial(comm::ReduceOp::AVG));
  }
  const auto ordered = std::count_if(order.begin(), order.end(), [](Order o) { return o != Order::kNone; });
  for (auto op : m.together) {
    if (ordered < 2) break;  // one input: covered above
    DimOption o{std::vector<Placement>(n_out, Partial(op)), std::vector<Placement>(n_in, Replicate{})};
    for (size_t j = 0; j < n_in; ++j)
      if (order[j] != Order::kNone) o.inputs[j] = Partial(op);
    opts.push_back(std::move(o));
  }
  return opts;
}

// Options shared by every pointwise op: Replicate, and Shard(d) for each output dim with
// every input sharded on the dim that lines up with it (Replicate where it broadcasts).
// `with_first`: the inputs that may be Partial together with the first one, each alone (NOTE:
// [Partial and linearity]: addcmul, addcdiv, lerp).
std::vector<DimOption> pointwise_options(const OpCall& c, Linear lin, const Monotone& mono = {},
                                         const std::vector<size_t>& with_first = {}) {
  const size_t n_in = c.inputs.size();
  const size_t n_out = std::max<size_t>(c.output_meta.size(), 1);
  const std::vector<int64_t> out_shape =
      c.output_meta.empty() ? c.inputs[0]->tensor_meta.shape : c.output_meta[0].shape;
  std::vector<DimOption> opts;
  opts.push_back({std::vector<Placement>(n_out, Replicate{}), std::vector<Placement>(n_in, Replicate{})});
  for (int64_t d = 0; d < static_cast<int64_t>(out_shape.size()); ++d) {
    DimOption o{std::vector<Placement>(n_out, Shard{d}), {}};
    for (auto* in : c.inputs) {
      const int64_t a = broadcast_input_dim(in->tensor_meta.shape, out_shape, d);
      o.inputs.push_back(a < 0 ? Placement(Replicate{}) : Placement(Shard{a}));
    }
    opts.push_back(std::move(o));
  }
  // Partial options (NOTE: [Partial and linearity]).
  const std::vector<size_t> outs = out_inputs(c);
  bool all_tensor_args_are_dtensors = true;
  bool every_tensor_is_a_dtensor = true;  // inputs sit at their schema positions
  for (size_t i = 0; i < c.args.size(); ++i) {
    const auto& a = c.args[i];
    const auto kind = c.schema->arguments()[i].type()->kind();
    if (a.kind == ArgInfo::Kind::kOther && (kind == c10::TypeKind::TensorType || kind == c10::TypeKind::NumberType) &&
        c.schema->arguments()[i].name() != "alpha")
      all_tensor_args_are_dtensors = false;
    if (a.kind == ArgInfo::Kind::kOther && kind == c10::TypeKind::TensorType) every_tensor_is_a_dtensor = false;
  }
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) {
    Partial p(op);
    switch (lin) {
      case Linear::kNone: break;
      case Linear::kAllOperands:
        if (all_tensor_args_are_dtensors)
          opts.push_back({std::vector<Placement>(n_out, p), std::vector<Placement>(n_in, p)});
        break;
      case Linear::kAnyOne:
        for (size_t j = 0; j < n_in; ++j) {
          if (std::find(outs.begin(), outs.end(), j) != outs.end()) continue;  // not an operand
          DimOption o{std::vector<Placement>(n_out, p), std::vector<Placement>(n_in, Replicate{})};
          o.inputs[j] = p;
          opts.push_back(std::move(o));
        }
        break;
      case Linear::kFirst: {
        DimOption o{std::vector<Placement>(n_out, p), std::vector<Placement>(n_in, Replicate{})};
        o.inputs[0] = p;
        opts.push_back(std::move(o));
        break;
      }
    }
    for (size_t j : with_first) {
      if (!every_tensor_is_a_dtensor || j >= n_in) continue;
      DimOption o{std::vector<Placement>(n_out, p), std::vector<Placement>(n_in, Replicate{})};
      o.inputs[0] = p;
      o.inputs[j] = p;
      opts.push_back(std::move(o));
    }
  }
  for (auto& o : monotone_options(c, mono, outs, n_out)) opts.push_back(std::move(o));
  // An out= tensor is written with the result: it takes the output's placement.
  for (auto& o : opts)
    for (size_t k : outs) o.inputs[k] = o.outputs[0];
  return opts;
}

void reg(const std::vector<std::string>& names, Linear lin) {
  for (const auto& n : names) register_rule(n, [lin](const OpCall& c) { return pointwise_options(c, lin); });
}

// name -> name, name_ (in place) and name.out variants share the rule (overloads included).
std::vector<std::string> with_variants(const std::vector<std::string>& bases) {
  std::vector<std::string> out;
  for (const auto& b : bases) {
    out.push_back("aten::" + b);
    out.push_back("aten::" + b + "_");
  }
  return out;
}

void reg_monotone(const std::vector<std::string>& names, Linear lin, const Monotone& m) {
  for (const auto& n : names) register_rule(n, [lin, m](const OpCall& c) { return pointwise_options(c, lin, m); });
}

// NOTE: [Partial(max) and Partial(min) through monotone ops]. Registered after the lists above,
// replacing their entries for these names.
void register_monotone_ops() {
  constexpr Order inc = Order::kIncreasing, dec = Order::kDecreasing;
  reg_monotone(with_variants({"asinh", "atan", "ceil", "erf", "exp", "exp2", "expm1", "floor", "relu", "round",
                              "sgn", "sigmoid", "sign", "sinh", "tanh", "trunc", "hardtanh", "relu6",
                              "hardsigmoid", "selu", "celu", "special_ndtr", "special_log_ndtr"}),
               Linear::kNone, {{inc}});
  reg_monotone(with_variants({"erfc", "special_erfcx"}), Linear::kNone, {{dec}});
  // clamp(x, lo, hi) = min(max(x, lo), hi) rises with each of the three.
  reg_monotone(with_variants({"clamp"}), Linear::kNone, {{inc, inc, inc}});
  reg_monotone(with_variants({"maximum", "fmax", "clamp_min"}), Linear::kNone, {{inc, inc}, {comm::ReduceOp::MAX}});
  reg_monotone(with_variants({"minimum", "fmin", "clamp_max"}), Linear::kNone, {{inc, inc}, {comm::ReduceOp::MIN}});
  reg_monotone({"aten::max.other", "aten::max.out"}, Linear::kNone, {{inc, inc}, {comm::ReduceOp::MAX}});
  reg_monotone({"aten::min.other", "aten::min.out"}, Linear::kNone, {{inc, inc}, {comm::ReduceOp::MIN}});
  reg_monotone(with_variants({"logaddexp", "logaddexp2"}), Linear::kNone, {{inc, inc}});
  // where(cond, a, b) picks each element from a or b: Partial a and b of one kind give that
  // kind, and a max, min or mean with a replicated other operand is kept.
  reg_monotone({"aten::where"}, Linear::kNone,
               {{Order::kNone, inc, inc},
                {comm::ReduceOp::SUM, comm::ReduceOp::AVG, comm::ReduceOp::MAX, comm::ReduceOp::MIN},
                /*avg_with_replicated=*/true});
  // Identities and positive scalings, besides their linearity.
  reg_monotone({"aten::clone", "aten::detach", "aten::detach_", "aten::alias", "aten::positive", "aten::lift_fresh",
                "aten::deg2rad", "aten::deg2rad_", "aten::rad2deg", "aten::rad2deg_"},
               Linear::kFirst, {{inc}});
  reg_monotone({"aten::neg", "aten::neg_"}, Linear::kFirst, {{dec}});
  // Monotone for some arguments only.
  for (const char* n : {"aten::leaky_relu", "aten::leaky_relu_"})
    register_rule(n, [](const OpCall& c) {
      const bool rising = arg_number(c, 1, 0.01) >= 0;  // negative_slope
      return pointwise_options(c, Linear::kNone, rising ? Monotone{{inc}} : Monotone{});
    });
  for (const char* n : {"aten::elu", "aten::elu_"})
    register_rule(n, [](const OpCall& c) {
      const bool rising = arg_number(c, 1, 1) >= 0 && arg_number(c, 2, 1) >= 0 && arg_number(c, 3, 1) >= 0;
      return pointwise_options(c, Linear::kNone, rising ? Monotone{{inc}} : Monotone{});
    });
  for (const char* n : {"aten::mul.Scalar", "aten::mul_.Scalar"})
    register_rule(n, [](const OpCall& c) {
      return pointwise_options(c, Linear::kFirst, Monotone{{by_sign(arg_number(c, 1, 1))}});
    });
  for (const char* n : {"aten::div.Scalar", "aten::div_.Scalar"})
    register_rule(n, [](const OpCall& c) {
      const double k = arg_number(c, 1, 1);
      return pointwise_options(c, Linear::kFirst, Monotone{{k == 0 ? Order::kNone : by_sign(k)}});
    });
  // a + alpha * b and a - alpha * b: linear in all operands together (the all-tensor check in
  // pointwise_options leaves out a plain tensor "other"), the order in b by the sign of alpha
  // (argument 2). With a Scalar b they add a constant: not linear, but monotone. rsub is
  // b - alpha * a, linear in both together as sub.
  for (const char* n : {"aten::add.Tensor", "aten::add_.Tensor", "aten::add.out"})
    register_rule(n, [](const OpCall& c) {
      return pointwise_options(c, Linear::kAllOperands, Monotone{{inc, by_sign(arg_number(c, 2, 1))}, {}, true});
    });
  for (const char* n : {"aten::sub.Tensor", "aten::sub_.Tensor", "aten::sub.out"})
    register_rule(n, [](const OpCall& c) {
      return pointwise_options(c, Linear::kAllOperands,
                               Monotone{{inc, flipped(by_sign(arg_number(c, 2, 1)))}, {}, true});
    });
  for (const char* n : {"aten::add.Scalar", "aten::add_.Scalar", "aten::sub.Scalar", "aten::sub_.Scalar"})
    register_rule(n, [](const OpCall& c) { return pointwise_options(c, Linear::kNone, Monotone{{inc}, {}, true}); });
  for (const char* n : {"aten::rsub", "aten::rsub_"})
    register_rule(n, [](const OpCall& c) {
      return pointwise_options(c, Linear::kAllOperands,
                               Monotone{{flipped(by_sign(arg_number(c, 2, 1))), inc}, {}, true});
    });
  // NOTE: [Partial and linearity]: addcmul and addcdiv are linear in self with a factor (the
  // numerator of addcdiv), and add a replicated value to self when both factors are replicated.
  // lerp's (1 - w) self + w end is linear in self and end together; a Partial(max) does not go
  // through it (the weight may exceed 1).
  for (const auto& n : with_variants({"addcmul"}))
    register_rule(n, [](const OpCall& c) {
      return pointwise_options(c, Linear::kNone, Monotone{{inc}, {}, true}, {1, 2});
    });
  for (const auto& n : with_variants({"addcdiv"}))
    register_rule(n, [](const OpCall& c) {
      return pointwise_options(c, Linear::kNone, Monotone{{inc}, {}, true}, {1});
    });
  for (const auto& n : with_variants({"lerp"}))
    register_rule(n, [](const OpCall& c) { return pointwise_options(c, Linear::kNone, Monotone{}, {1}); });
}

const bool registered = [] {
  // The monotone ones are in register_monotone_ops.
  reg(with_variants({"abs", "acos", "asin", "cos", "cosh", "frac", "log", "log1p", "log2", "log10", "reciprocal",
                     "rsqrt", "sin", "sqrt", "tan", "gelu", "silu", "logical_not", "bitwise_not", "isnan", "isinf",
                     "isneginf", "isposinf", "signbit", "nan_to_num", "pow", "atan2", "eq", "ne", "lt", "le", "gt",
                     "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor",
                     "bitwise_left_shift", "bitwise_right_shift", "__lshift__", "__rshift__", "fmod", "remainder",
                     "masked_fill", "copysign", "hypot", "floor_divide", "fill", "erfinv",
                     "digamma", "lgamma", "polygamma", "mvlgamma", "sinc", "logit", "softplus", "mish", "hardswish",
                     "hardshrink", "softshrink", "acosh", "atanh", "angle", "i0", "special_i0e",
                     "special_i1", "special_i1e", "special_ndtri", "special_entr", "special_xlog1py", "xlogy",
                     "nextafter", "heaviside", "igamma", "igammac", "gcd", "lcm", "log_sigmoid_forward", "rrelu",
                     "rrelu_with_noise", "threshold",
                     // ldexp_ decomposes above DTensor in libtorch 1.13 / 2.6; today's libtorch
                     // gives it a kernel of its own (CompositeExplicitAutograd), so it needs a rule.
                     "ldexp", "frexp", "special_zeta"}),
      Linear::kNone);
  // The in-place shift operators (their results are not the names' with a trailing underscore).
  reg({"aten::__ilshift__", "aten::__irshift__"}, Linear::kNone);
  // The special polynomial and Bessel families (libtorch 2.x; absent names are never called).
  reg({"aten::special_chebyshev_polynomial_t", "aten::special_chebyshev_polynomial_u",
       "aten::special_chebyshev_polynomial_v", "aten::special_chebyshev_polynomial_w",
       "aten::special_shifted_chebyshev_polynomial_t", "aten::special_shifted_chebyshev_polynomial_u",
       "aten::special_shifted_chebyshev_polynomial_v", "aten::special_shifted_chebyshev_polynomial_w",
       "aten::special_hermite_polynomial_h", "aten::special_hermite_polynomial_he",
       "aten::special_laguerre_polynomial_l", "aten::special_legendre_polynomial_p", "aten::special_bessel_j0",
       "aten::special_bessel_j1", "aten::special_bessel_y0", "aten::special_bessel_y1",
       "aten::special_modified_bessel_i0", "aten::special_modified_bessel_i1", "aten::special_modified_bessel_k0",
       "aten::special_modified_bessel_k1", "aten::special_scaled_modified_bessel_k0",
       "aten::special_scaled_modified_bessel_k1", "aten::special_spherical_bessel_j0", "aten::special_airy_ai"},
      Linear::kNone);
  // More *_backward ops: grad_output times a function of the forward input, so linear in
  // grad_output (their first operand).
  reg({"aten::log_sigmoid_backward", "aten::logit_backward", "aten::softplus_backward",
       "aten::hardsigmoid_backward", "aten::hardswish_backward", "aten::mish_backward",
       "aten::hardshrink_backward", "aten::softshrink_backward", "aten::rrelu_with_noise_backward"},
      Linear::kFirst);
  // add/sub (linear in all operands together), add/sub with a Scalar, max/min of two tensors
  // (elementwise; the bare names are reductions, reduction_rules.cpp), mul.Scalar, div.Scalar,
  // neg and the identities are in register_monotone_ops.
  reg({"aten::mul.Tensor", "aten::mul_.Tensor", "aten::mul.out"}, Linear::kAnyOne);
  reg({"aten::div.Tensor", "aten::div_.Tensor", "aten::threshold_backward", "aten::gelu_backward",
       "aten::tanh_backward", "aten::sigmoid_backward", "aten::silu_backward", "aten::hardtanh_backward",
       "aten::leaky_relu_backward", "aten::elu_backward", "aten::_conj", "aten::conj_physical",
       "aten::conj_physical_", "aten::real", "aten::imag"},
      Linear::kFirst);
  // div with a rounding mode rounds: not linear.
  reg({"aten::div.Tensor_mode", "aten::div_.Tensor_mode", "aten::div.Scalar_mode", "aten::div_.Scalar_mode"},
      Linear::kNone);
  // masked_fill(self, mask, 0) zeroes positions: linear in self (a non-zero value is not).
  for (const char* n : {"aten::masked_fill.Scalar", "aten::masked_fill_.Scalar"}) {
    register_rule(n, [](const OpCall& c) {
      const c10::IValue& v = c.args.size() > 2 ? c.args[2].value : c10::IValue();
      const bool zero = (v.isDouble() && v.toDouble() == 0) || (v.isInt() && v.toInt() == 0) ||
                        (v.isBool() && !v.toBool());
      // Its filled elements hold the value on every rank: a max, min or mean of the others is kept.
      return pointwise_options(c, zero ? Linear::kFirst : Linear::kNone,
                               Monotone{{Order::kIncreasing}, {}, /*avg_with_replicated=*/true});
    });
  }
  // linalg_cross(self, other, dim): elementwise with broadcasting except along `dim` (size 3),
  // which each cross product reads whole; bilinear, like mul.
  register_rule("aten::linalg_cross", [](const OpCall& c) {
    std::vector<DimOption> opts = pointwise_options(c, Linear::kAnyOne);
    const int64_t nd = c.output_meta.empty() ? c.inputs[0]->ndim() : static_cast<int64_t>(c.output_meta[0].shape.size());
    const int64_t dim = normalize_shard_dim(arg_int(c, 2, -1), nd);
    opts.erase(std::remove_if(opts.begin(), opts.end(),
                              [dim](const DimOption& o) { return is_shard(o.outputs[0], dim); }),
               opts.end());
    return opts;
  });
  // fill_ with a Scalar and zero_ keep whatever placement their input has, Partial included
  // (NOTE: [Filling a Partial tensor]).
  const Rule keep_placement = [](const OpCall& c) {
    std::vector<DimOption> opts;
    opts.push_back({{Replicate{}}, {Replicate{}}});
    for (int64_t d = 0; d < static_cast<int64_t>(c.inputs[0]->tensor_meta.shape.size()); ++d)
      opts.push_back({{Shard{d}}, {Shard{d}}});
    for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG, comm::ReduceOp::MIN, comm::ReduceOp::MAX})
      opts.push_back({{Partial(op)}, {Partial(op)}});
    return opts;
  };
  // NOTE: [Filling a Partial tensor]
  // A Partial tensor filled with v must stand for v once reduced. For avg, min and max every
  // rank holding v does; for sum only one rank of each reduced group may hold v, the others 0
  // (the rank at coordinate 0 of every Partial(sum) mesh dim holds v). PyTorch's DTensor
  // registers aten.fill_.Scalar with the single-input strategy and leaves v on every rank, so
  // a Partial(sum) tensor filled with v reduces to v * ranks there; here it reduces to v, as on
  // one device. zero_ needs nothing: 0 on every rank is 0 for every kind.
  const LocalArgRewrite fill_one_rank_of_a_sum = [](std::vector<c10::IValue>& args, const OpCall& call,
                                                     const std::vector<std::vector<Placement>>& outputs) {
    const auto& coordinate = call.mesh->get_coordinate();
    if (!coordinate) return;
    for (size_t m = 0; m < outputs[0].size(); ++m)
      if (is_partial(outputs[0][m]) && std::get<Partial>(outputs[0][m]).reduce_op == comm::ReduceOp::SUM &&
          (*coordinate)[m] != 0) {
        args[1] = c10::Scalar(0);  // (self, value)
        return;
      }
  };
  register_rule("aten::fill_.Scalar", keep_placement, fill_one_rank_of_a_sum);
  for (const char* n : {"aten::zero_", "aten::zero"}) register_rule(n, keep_placement);
  // A cast is linear between floating dtypes; rounding to an integer dtype is not.
  // ... and rounding from one real floating dtype to another keeps the order.
  register_rule("aten::_to_copy", [](const OpCall& c) {
    const bool floating = c.output_meta.empty() || at::isFloatingType(c.output_meta[0].dtype) ||
                          at::isComplexType(c.output_meta[0].dtype);
    const bool real_to_real = !c.output_meta.empty() && at::isFloatingType(c.output_meta[0].dtype) &&
                              !c.inputs.empty() && at::isFloatingType(c.inputs[0]->tensor_meta.dtype);
    return pointwise_options(c, floating ? Linear::kFirst : Linear::kNone,
                             real_to_real ? Monotone{{Order::kIncreasing}} : Monotone{});
  });
  register_monotone_ops();
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
