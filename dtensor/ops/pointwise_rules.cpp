// dtensor/ops/pointwise_rules.cpp: elementwise ops with broadcasting (DESIGN.md D5).
//
// NOTE: [Partial and linearity]
// A Partial tensor is a sum (or avg) of per-rank values. An op may keep it Partial only when
// it is linear in that input: f(a1 + a2) = f(a1) + f(a2). add/sub are linear in all operands
// together (every operand Partial); mul is linear in any ONE operand (the others replicated);
// div, neg, clone, the *_backward ops are linear in their first operand, and so is
// masked_fill with the value 0 (the norm and std backward formulas use it in place). Adding a
// scalar, relu, exp, comparisons... are not: a Partial input is reduced first.
#include "dtensor/ops/registry.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace dtensor {
namespace ops {
namespace {

enum class Linear { kNone, kAllOperands, kAnyOne, kFirst };

// Options shared by every pointwise op: Replicate, and Shard(d) for each output dim with
// every input sharded on the dim that lines up with it (Replicate where it broadcasts).
std::vector<DimOption> pointwise_options(const OpCall& c, Linear lin) {
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
  for (size_t i = 0; i < c.args.size(); ++i) {
    const auto& a = c.args[i];
    const auto kind = c.schema->arguments()[i].type()->kind();
    if (a.kind == ArgInfo::Kind::kOther && (kind == c10::TypeKind::TensorType || kind == c10::TypeKind::NumberType) &&
        c.schema->arguments()[i].name() != "alpha")
      all_tensor_args_are_dtensors = false;
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
  }
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

const bool registered = [] {
  reg(with_variants({"abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor",
                     "frac", "log", "log1p", "log2", "log10", "reciprocal", "relu", "round", "rsqrt", "sigmoid",
                     "sign", "sgn", "sin", "sinh", "sqrt", "tan", "tanh", "trunc", "gelu", "silu", "hardtanh",
                     "leaky_relu", "logical_not", "bitwise_not", "isnan", "isinf", "isneginf", "isposinf", "signbit",
                     "nan_to_num", "clamp", "clamp_min", "clamp_max", "pow", "maximum", "minimum", "fmax", "fmin",
                     "atan2", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
                     "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift",
                     "__lshift__", "__rshift__", "fmod", "remainder", "addcmul", "addcdiv", "masked_fill",
                     "copysign", "hypot", "floor_divide", "fill", "where", "exp2", "erfinv", "digamma", "lgamma",
                     "polygamma", "mvlgamma", "sinc", "logit", "softplus", "elu", "mish", "hardsigmoid",
                     "hardswish", "hardshrink", "softshrink", "rsub", "lerp", "asinh", "acosh", "atanh", "angle",
                     "i0", "special_i0e", "special_i1", "special_i1e", "special_erfcx", "special_ndtr",
                     "special_ndtri", "special_log_ndtr", "special_entr", "special_xlog1py", "xlogy", "nextafter",
                     "logaddexp", "logaddexp2", "heaviside", "igamma", "igammac", "gcd", "lcm",
                     "log_sigmoid_forward", "relu6", "celu", "selu", "rrelu", "rrelu_with_noise", "threshold",
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
  // add/sub with a Scalar "other" add a constant: not linear (all_tensor_args check covers
  // Tensor "other"; the .Scalar overloads are registered explicitly as non-linear).
  reg({"aten::add.Tensor", "aten::add_.Tensor", "aten::sub.Tensor", "aten::sub_.Tensor", "aten::add.out",
       "aten::sub.out"},
      Linear::kAllOperands);
  reg({"aten::add.Scalar", "aten::add_.Scalar", "aten::sub.Scalar", "aten::sub_.Scalar"}, Linear::kNone);
  // max/min of two tensors (elementwise; the bare names are reductions, reduction_rules.cpp).
  reg({"aten::max.other", "aten::min.other", "aten::max.out", "aten::min.out"}, Linear::kNone);
  reg({"aten::mul.Tensor", "aten::mul_.Tensor", "aten::mul.out"}, Linear::kAnyOne);
  reg({"aten::mul.Scalar", "aten::mul_.Scalar", "aten::div.Tensor", "aten::div_.Tensor", "aten::div.Scalar",
       "aten::div_.Scalar", "aten::neg", "aten::neg_", "aten::clone", "aten::detach", "aten::detach_", "aten::deg2rad",
       "aten::deg2rad_", "aten::rad2deg", "aten::rad2deg_", "aten::alias", "aten::positive",
       "aten::threshold_backward", "aten::gelu_backward", "aten::tanh_backward", "aten::sigmoid_backward",
       "aten::silu_backward", "aten::hardtanh_backward", "aten::leaky_relu_backward", "aten::elu_backward",
       "aten::lift_fresh", "aten::_conj", "aten::conj_physical", "aten::conj_physical_", "aten::real",
       "aten::imag"},
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
      return pointwise_options(c, zero ? Linear::kFirst : Linear::kNone);
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
  // fill_ with a Scalar and zero_ keep whatever placement their input has, Partial included:
  // every rank's local tensor holds the value (PyTorch registers aten.fill_.Scalar and
  // aten.zero_ with the single-input strategy, so a Partial(sum) tensor filled with v has the
  // value v * ranks once reduced, and a Partial(max) one v).
  const Rule keep_placement = [](const OpCall& c) {
    std::vector<DimOption> opts;
    opts.push_back({{Replicate{}}, {Replicate{}}});
    for (int64_t d = 0; d < static_cast<int64_t>(c.inputs[0]->tensor_meta.shape.size()); ++d)
      opts.push_back({{Shard{d}}, {Shard{d}}});
    for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG, comm::ReduceOp::MIN, comm::ReduceOp::MAX})
      opts.push_back({{Partial(op)}, {Partial(op)}});
    return opts;
  };
  register_rule("aten::fill_.Scalar", keep_placement);
  for (const char* n : {"aten::zero_", "aten::zero"}) register_rule(n, keep_placement);
  // A cast is linear between floating dtypes; rounding to an integer dtype is not.
  register_rule("aten::_to_copy", [](const OpCall& c) {
    const bool floating = c.output_meta.empty() || at::isFloatingType(c.output_meta[0].dtype) ||
                          at::isComplexType(c.output_meta[0].dtype);
    return pointwise_options(c, floating ? Linear::kFirst : Linear::kNone);
  });
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
