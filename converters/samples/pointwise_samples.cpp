// converters/samples/pointwise_samples.cpp: samples of the elementwise ops (unary, binary with
// broadcasting, ternary, casts, fills, and the *_backward ops autograd calls). Each op gets an
// even shape ([8, 4]: both dims divide 4 and 2x2), an uneven one ([5, 6] in float64), and
// binary ops also a broadcast and a 0-dim operand. In-place variants (name_) get the same
// samples whenever the dispatcher has them.
#include "converters/samples/samples.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

namespace dtensor {
namespace testing {
namespace samples {
namespace {

// Value domain of an op's inputs.
enum class Dom {
  kAny,     // [-2, 2)
  kPos,     // [0.5, 2): log, sqrt, reciprocal...
  kUnit,    // [-0.9, 0.9): acos, asin, atanh, erfinv
  kProb,    // [0.1, 0.9): logit, ndtri
  kAbove1,  // [1.5, 3): acosh
  kSmall,   // [-1, 1): tan
  kInt,     // int64 in [0, 8): bitwise ops, gcd
  kBool,    // bool: logical ops
};

at::Tensor make(SampleGen& g, std::vector<int64_t> shape, Dom d, at::ScalarType dt = at::kFloat) {
  switch (d) {
    case Dom::kAny: return g.tensor(std::move(shape), dt);
    case Dom::kPos: return g.positive(std::move(shape), dt);
    case Dom::kUnit: return g.tensor(std::move(shape), dt, -0.9, 0.9);
    case Dom::kProb: return g.tensor(std::move(shape), dt, 0.1, 0.9);
    case Dom::kAbove1: return g.tensor(std::move(shape), dt, 1.5, 3.0);
    case Dom::kSmall: return g.tensor(std::move(shape), dt, -1.0, 1.0);
    case Dom::kInt: return g.tensor(std::move(shape), at::kLong, 0.0, 8.0);
    case Dom::kBool: return g.boolean(std::move(shape));
  }
  return {};
}

bool in_dispatcher(const std::string& op) {
  const auto dot = op.find('.');
  const std::string name = op.substr(0, dot);
  const std::string overload = dot == std::string::npos ? "" : op.substr(dot + 1);
  return c10::Dispatcher::singleton().findSchema({name, overload}).has_value();
}

// "aten::abs" -> "aten::abs_"; "aten::add.Tensor" -> "aten::add_.Tensor".
std::string inplace_of(const std::string& op) {
  const auto dot = op.find('.');
  if (dot == std::string::npos) return op + "_";
  return op.substr(0, dot) + "_" + op.substr(dot);
}

// Registers `op` and, when the dispatcher has it, its in-place variant with the same samples.
void add_with_inplace(OpDb& db, const std::string& op, const SampleFn& fn) {
  db.add(op, "pointwise", fn);
  const std::string inplace = inplace_of(op);
  if (in_dispatcher(inplace) && db.find(inplace) == nullptr) db.add(inplace, "pointwise", fn);
}

Samples unary(SampleGen& g, Dom d) {
  // Integer and bool domains have no float64 variant.
  const bool floating = d != Dom::kInt && d != Dom::kBool;
  return {OpSample("even", {make(g, {8, 4}, d)}),
          OpSample(floating ? "uneven_f64" : "uneven", {make(g, {5, 6}, d, floating ? at::kDouble : at::kFloat)}),
          OpSample("3d", {make(g, {2, 4, 6}, d)})};
}

Samples binary(SampleGen& g, Dom d, Dom d2) {
  const bool floating = d != Dom::kInt && d != Dom::kBool;
  const at::ScalarType f64 = floating ? at::kDouble : at::kFloat;
  return {OpSample("even", {make(g, {8, 4}, d), make(g, {8, 4}, d2)}),
          OpSample("broadcast_row", {make(g, {8, 4}, d), make(g, {4}, d2)}),
          OpSample("broadcast_col", {make(g, {8, 4}, d), make(g, {8, 1}, d2)}),
          OpSample("uneven_f64", {make(g, {5, 6}, d, f64), make(g, {5, 6}, d2, f64)}),
          OpSample("0dim_other", {make(g, {8, 4}, d), make(g, {}, d2)})};
}

Samples tensor_scalar(SampleGen& g, Dom d, c10::Scalar s) {
  return {OpSample("even", {make(g, {8, 4}, d), s}), OpSample("uneven_f64", {make(g, {5, 6}, d, at::kDouble), s})};
}

void unary_ops(OpDb& db, const std::vector<std::string>& names, Dom d, const Kwargs& kw = {}) {
  for (const auto& n : names)
    add_with_inplace(db, "aten::" + n, [d, kw](SampleGen& g) { return with_kwargs(unary(g, d), kw); });
}

void binary_ops(OpDb& db, const std::vector<std::string>& names, Dom d, Dom d2, const Kwargs& kw = {}) {
  for (const auto& n : names)
    add_with_inplace(db, "aten::" + n, [d, d2, kw](SampleGen& g) { return with_kwargs(binary(g, d, d2), kw); });
}

void tensor_scalar_ops(OpDb& db, const std::vector<std::string>& names, Dom d, c10::Scalar s) {
  for (const auto& n : names)
    add_with_inplace(db, "aten::" + n, [d, s](SampleGen& g) { return tensor_scalar(g, d, s); });
}

}  // namespace

void add_special_families(OpDb& db) {
  // Polynomials p_n(x): x in [-1, 1), n a tensor of small integer degrees (libtorch 2.x only).
  for (const char* n : {"chebyshev_polynomial_t", "chebyshev_polynomial_u", "chebyshev_polynomial_v",
                        "chebyshev_polynomial_w", "shifted_chebyshev_polynomial_t", "shifted_chebyshev_polynomial_u",
                        "shifted_chebyshev_polynomial_v", "shifted_chebyshev_polynomial_w", "hermite_polynomial_h",
                        "hermite_polynomial_he", "laguerre_polynomial_l", "legendre_polynomial_p"}) {
    const std::string op = std::string("aten::special_") + n;
    if (!in_dispatcher(op)) continue;
    db.add(op, "pointwise", [](SampleGen& g) {
      auto degree = [&](std::vector<int64_t> shape) { return g.tensor(std::move(shape), at::kFloat, 0.0, 6.0).floor(); };
      return Samples{OpSample("even", {make(g, {8, 4}, Dom::kSmall), degree({8, 4})}),
                     OpSample("broadcast_row", {make(g, {8, 4}, Dom::kSmall), degree({4})}),
                     OpSample("uneven_f64", {make(g, {5, 6}, Dom::kSmall, at::kDouble), degree({5, 6}).to(at::kDouble)})};
    });
    // One operand a Scalar: x (x_scalar) or the degree n (n_scalar).
    if (in_dispatcher(op + ".x_scalar"))
      db.add(op + ".x_scalar", "pointwise", [](SampleGen& g) {
        return Samples{OpSample("even", {0.375, g.tensor({8, 4}, at::kFloat, 0.0, 6.0).floor()})};
      });
    if (in_dispatcher(op + ".n_scalar"))
      db.add(op + ".n_scalar", "pointwise", [](SampleGen& g) { return Samples{OpSample("even", {make(g, {8, 4}, Dom::kSmall), 3})}; });
  }
  for (const char* n : {"bessel_j0", "bessel_j1", "bessel_y0", "bessel_y1", "modified_bessel_i0", "modified_bessel_i1",
                        "modified_bessel_k0", "modified_bessel_k1", "scaled_modified_bessel_k0",
                        "scaled_modified_bessel_k1", "spherical_bessel_j0", "airy_ai"}) {
    const std::string op = std::string("aten::special_") + n;
    if (!in_dispatcher(op)) continue;
    db.add(op, "pointwise", [](SampleGen& g) { return unary(g, Dom::kPos); });
  }
}

void add_pointwise_samples(OpDb& db) {
  add_special_families(db);
  // ---- unary ----
  unary_ops(db, {"abs", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor", "frac", "neg", "relu",
                 "round", "sigmoid", "sign", "sgn", "sin", "sinh", "tanh", "trunc", "atan", "asinh", "exp2",
                 "sinc", "silu", "mish", "hardswish", "hardsigmoid", "hardtanh", "leaky_relu", "softplus", "elu",
                 "nan_to_num", "positive", "deg2rad", "rad2deg", "signbit", "isnan", "isneginf",
                 "isposinf", "angle", "conj_physical", "i0", "special_i0e", "special_i1", "special_i1e",
                 "special_erfcx", "special_ndtr", "special_log_ndtr", "special_entr", "clone", "detach",
                 "alias", "celu", "isfinite", "isinf", "fix", "square", "relu6", "selu", "hardshrink",
                 "softshrink", "log_sigmoid", "special_expit", "lift_fresh"},
            Dom::kAny);
  unary_ops(db, {"tan"}, Dom::kSmall);
  unary_ops(db, {"log", "log10", "log1p", "log2", "reciprocal", "rsqrt", "sqrt", "digamma", "lgamma"}, Dom::kPos);
  unary_ops(db, {"acos", "asin", "atanh", "erfinv"}, Dom::kUnit);
  unary_ops(db, {"logit", "special_ndtri"}, Dom::kProb);
  unary_ops(db, {"acosh"}, Dom::kAbove1);
  unary_ops(db, {"bitwise_not"}, Dom::kInt);
  unary_ops(db, {"logical_not"}, Dom::kBool);
  add_with_inplace(db, "aten::gelu", [](SampleGen& g) {
    Samples s = unary(g, Dom::kAny);
    s.push_back(OpSample("tanh", {g.tensor({8, 4})}).kw("approximate", std::string("tanh")));
    return s;
  });
  unary_ops(db, {"round.decimals"}, Dom::kAny, {{"decimals", 1}});
  db.add("aten::polygamma", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {1, g.positive({8, 4})}), OpSample("uneven_f64", {2, g.positive({5, 6}, at::kDouble)})};
  });
  unary_ops(db, {"mvlgamma"}, Dom::kAbove1, {{"p", 2}});
  unary_ops(db, {"clamp"}, Dom::kAny, {{"min", -0.5}, {"max", 0.5}});
  unary_ops(db, {"_to_copy"}, Dom::kAny, {{"dtype", at::kDouble}});
  unary_ops(db, {"zero_", "zero"}, Dom::kAny);

  // ---- binary (tensor, tensor) ----
  for (const char* op : {"aten::add.Tensor", "aten::sub.Tensor"}) {
    add_with_inplace(db, op, [](SampleGen& g) {
      Samples s = binary(g, Dom::kAny, Dom::kAny);
      s.push_back(OpSample("alpha", {g.tensor({8, 4}), g.tensor({8, 4})}).kw("alpha", 2));
      return s;
    });
  }
  binary_ops(db, {"mul.Tensor", "maximum", "minimum", "fmax", "fmin", "atan2",
                  "eq.Tensor", "ne.Tensor", "lt.Tensor", "le.Tensor", "gt.Tensor", "ge.Tensor", "copysign.Tensor",
                  "hypot", "rsub.Tensor", "nextafter", "logaddexp", "logaddexp2", "heaviside", "xlogy.Tensor",
                  "special_xlog1py", "fmod.Tensor", "remainder.Tensor", "floor_divide", "true_divide.Tensor",
                  "clamp_min.Tensor", "clamp_max.Tensor", "greater.Tensor", "less_equal.Tensor",
                  "not_equal.Tensor", "multiply.Tensor", "subtract.Tensor", "ldexp.Tensor", "float_power.Tensor_Tensor"},
             Dom::kAny, Dom::kPos);
  binary_ops(db, {"div.Tensor", "divide.Tensor"}, Dom::kAny, Dom::kPos);
  binary_ops(db, {"pow.Tensor_Tensor"}, Dom::kPos, Dom::kAny);
  binary_ops(db, {"igamma", "igammac"}, Dom::kPos, Dom::kPos);
  binary_ops(db, {"logical_and", "logical_or", "logical_xor"}, Dom::kBool, Dom::kBool);
  binary_ops(db, {"bitwise_and.Tensor", "bitwise_or.Tensor", "bitwise_xor.Tensor", "gcd", "lcm",
                  "bitwise_left_shift.Tensor", "bitwise_right_shift.Tensor"},
             Dom::kInt, Dom::kInt);
  binary_ops(db, {"div.Tensor_mode"}, Dom::kAny, Dom::kPos, {{"rounding_mode", std::string("floor")}});

  // ---- binary (tensor, scalar) ----
  tensor_scalar_ops(db, {"add.Scalar", "sub.Scalar", "mul.Scalar", "div.Scalar", "rsub.Scalar", "eq.Scalar",
                         "ne.Scalar", "lt.Scalar", "le.Scalar", "gt.Scalar", "ge.Scalar", "fmod.Scalar",
                         "remainder.Scalar", "copysign.Scalar", "clamp_min", "clamp_max", "xlogy.Scalar_Other",
                         "fill.Scalar", "floor_divide.Scalar"},
                    Dom::kAny, 0.75);
  tensor_scalar_ops(db, {"pow.Tensor_Scalar", "float_power.Tensor_Scalar"}, Dom::kPos, 3);
  tensor_scalar_ops(db, {"__lshift__.Scalar", "__rshift__.Scalar"}, Dom::kInt, 2);
  for (const char* op : {"aten::div.Scalar_mode", "aten::div_.Scalar_mode"})
    db.add(op, "pointwise", [](SampleGen& g) {
      return with_kwargs(tensor_scalar(g, Dom::kAny, 0.75), {{"rounding_mode", std::string("trunc")}});
    });
  // out= variants: the out tensor is written, not an operand (a Partial out must not make
  // the op take a replicated product as Partial: ldexp_ runs mul.out(self, 2^other, out=self)).
  for (const char* op : {"aten::mul.out", "aten::add.out"})
    db.add(op, "pointwise", [](SampleGen& g) {
      return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4})}).kw("out", g.tensor({8, 4})),
                     OpSample("broadcast", {g.tensor({8, 4}), g.tensor({4})}).kw("out", g.tensor({8, 4}))};
    });
  db.add("aten::ldexp_", "pointwise", [](SampleGen& g) { return binary(g, Dom::kAny, Dom::kSmall); });
  db.add("aten::pow_.Scalar", "pointwise", [](SampleGen& g) { return tensor_scalar(g, Dom::kPos, 2); });
  db.add("aten::pow_.Tensor", "pointwise", [](SampleGen& g) { return binary(g, Dom::kPos, Dom::kAny); });
  db.add("aten::polygamma_", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.positive({8, 4}), 1})};
  });
  for (const char* op : {"aten::rrelu", "aten::rrelu_"})
    db.add(op, "pointwise", [](SampleGen& g) { return unary(g, Dom::kAny); });  // training=False: deterministic
  for (const char* op : {"aten::rrelu_with_noise", "aten::rrelu_with_noise_"})
    db.add(op, "pointwise", [](SampleGen& g) {
      return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4}), 0.125, 0.25})};
    });
  db.add("aten::rrelu_with_noise_backward", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4}), g.tensor({8, 4}), 0.125, 0.25, false, false})};
  });
  // Complex inputs: real/imag views and the lazy conjugate.
  for (const char* op : {"aten::real", "aten::imag", "aten::_conj"})
    db.add(op, "pointwise", [](SampleGen& g) {
      return Samples{OpSample("even", {g.tensor({8, 4}, at::kComplexFloat)}).no_backward(),
                     OpSample("uneven", {g.tensor({5, 6}, at::kComplexDouble)}).no_backward()};
    });
  // resolve_conj / resolve_neg materialise a lazy conjugate / negation: on a conjugate view
  // (resolve_conj) the result differs from its input's storage; otherwise it is the input.
  db.add("aten::resolve_conj", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("conj_view", {g.tensor({8, 4}, at::kComplexFloat).conj()}).no_backward(),
                   OpSample("complex", {g.tensor({8, 4}, at::kComplexFloat)}).no_backward(),
                   OpSample("real_uneven_f64", {g.tensor({5, 6}, at::kDouble)})};
  });
  db.add("aten::resolve_neg", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("complex", {g.tensor({8, 4}, at::kComplexFloat)}).no_backward(),
                   OpSample("real_uneven_f64", {g.tensor({5, 6}, at::kDouble)})};
  });
  tensor_scalar_ops(db, {"bitwise_and.Scalar", "bitwise_or.Scalar", "bitwise_xor.Scalar"}, Dom::kInt, 5);
  tensor_scalar_ops(db, {"bitwise_left_shift.Tensor_Scalar", "bitwise_right_shift.Tensor_Scalar"}, Dom::kInt, 2);
  binary_ops(db, {"__lshift__.Tensor", "__rshift__.Tensor"}, Dom::kInt, Dom::kInt);
  tensor_scalar_ops(db, {"__ilshift__.Scalar", "__irshift__.Scalar", "__xor__.Scalar", "__ixor__.Scalar"}, Dom::kInt, 2);
  binary_ops(db, {"__xor__.Tensor", "__ixor__.Tensor"}, Dom::kInt, Dom::kInt);
  // clip: clamp's alias (it decomposes into clamp); float_power_ needs a float64 base.
  unary_ops(db, {"clip"}, Dom::kAny, {{"min", -0.5}, {"max", 0.5}});
  for (const char* op : {"aten::clip.Tensor", "aten::clip_.Tensor"})
    db.add(op, "pointwise", [](SampleGen& g) {
      return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4}, at::kFloat, -1.0, 0.0), g.tensor({4}, at::kFloat, 0.0, 1.0)})};
    });
  // The out= overloads of composites PyTorch's DTensor registers: they decompose above DTensor
  // into out= overloads with rules (clamp.out, pow.*_out, div.out).
  db.add("aten::clip.out", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), -0.5, 0.5}).kw("out", g.tensor({8, 4}))};
  });
  db.add("aten::clip.Tensor_out", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4}, at::kFloat, -1.0, 0.0), g.tensor({4}, at::kFloat, 0.0, 1.0)})
                       .kw("out", g.tensor({8, 4}))};
  });
  db.add("aten::float_power.Tensor_Tensor_out", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.positive({8, 4}), g.tensor({8, 4})}).kw("out", g.tensor({8, 4}, at::kDouble))};
  });
  db.add("aten::float_power.Tensor_Scalar_out", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.positive({8, 4}), 2.5}).kw("out", g.tensor({8, 4}, at::kDouble))};
  });
  db.add("aten::float_power.Scalar_out", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {1.5, g.tensor({8, 4})}).kw("out", g.tensor({8, 4}, at::kDouble))};
  });
  db.add("aten::square.out", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4})}).kw("out", g.tensor({8, 4}))};
  });
  db.add("aten::true_divide.out", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.positive({4})}).kw("out", g.tensor({8, 4}))};
  });
  db.add("aten::float_power_.Scalar", "pointwise",
         [](SampleGen& g) { return Samples{OpSample("f64", {g.positive({8, 4}, at::kDouble), 2.5})}; });
  db.add("aten::float_power_.Tensor", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("f64", {g.positive({8, 4}, at::kDouble), g.tensor({8, 4}, at::kDouble)})};
  });
  binary_ops(db, {"__ilshift__.Tensor", "__irshift__.Tensor"}, Dom::kInt, Dom::kInt);
  // linalg_cross(self, other, dim): size 3 along dim; broadcasting.
  db.add("aten::linalg_cross", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("last", {g.tensor({8, 3}), g.tensor({8, 3})}),
                   OpSample("dim0_broadcast", {g.tensor({3, 4}), g.tensor({3, 1})}).kw("dim", 0),
                   OpSample("3d_f64", {g.tensor({2, 3, 5}, at::kDouble), g.tensor({2, 3, 5}, at::kDouble)}).kw("dim", 1)};
  });
  // frexp: (mantissa, exponent); the exponent is an int tensor.
  db.add("aten::frexp.Tensor", "pointwise", [](SampleGen& g) { return unary(g, Dom::kAny); });
  // Hurwitz zeta(x, q): finite for x > 1, q > 0; no derivative in x.
  db.add("aten::special_zeta", "pointwise", [](SampleGen& g) {
    Samples s = binary(g, Dom::kAbove1, Dom::kPos);
    for (auto& sample : s) sample.no_backward();
    return s;
  });
  for (const char* op : {"aten::special_zeta.self_scalar", "aten::special_zeta.other_scalar"})
    db.add(op, "pointwise", [op](SampleGen& g) {
      const bool self_scalar = std::string(op).find("self_scalar") != std::string::npos;
      at::Tensor t = make(g, {8, 4}, self_scalar ? Dom::kPos : Dom::kAbove1);
      return Samples{OpSample("even", self_scalar ? std::vector<c10::IValue>{2.5, t} : std::vector<c10::IValue>{t, 1.5})
                         .no_backward()};
    });
  binary_ops(db, {"max.other", "min.other"}, Dom::kAny, Dom::kAny);
  // (Scalar self, Tensor other) and (Tensor self, Scalar other) overloads.
  for (const char* op : {"aten::remainder.Scalar_Tensor", "aten::xlogy.Scalar_Self", "aten::special_xlog1py.self_scalar"})
    if (in_dispatcher(op))
      db.add(op, "pointwise", [](SampleGen& g) { return Samples{OpSample("even", {1.5, make(g, {8, 4}, Dom::kPos)})}; });
  if (in_dispatcher("aten::special_xlog1py.other_scalar"))
    db.add("aten::special_xlog1py.other_scalar", "pointwise",
           [](SampleGen& g) { return Samples{OpSample("even", {make(g, {8, 4}, Dom::kAny), 0.5})}; });
  // (Scalar self, Tensor other).
  for (const char* op : {"aten::bitwise_and.Scalar_Tensor", "aten::bitwise_or.Scalar_Tensor",
                         "aten::bitwise_xor.Scalar_Tensor", "aten::bitwise_left_shift.Scalar_Tensor",
                         "aten::bitwise_right_shift.Scalar_Tensor"})
    db.add(op, "pointwise", [](SampleGen& g) {
      return Samples{OpSample("even", {5, make(g, {8, 4}, Dom::kInt)}), OpSample("uneven", {3, make(g, {5, 6}, Dom::kInt)})};
    });
  db.add("aten::pow.Scalar", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {2.5, make(g, {8, 4}, Dom::kAny)})};
  });
  db.add("aten::where.self", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.boolean({8, 4}), g.tensor({8, 4}), g.tensor({8, 4})}),
                   OpSample("broadcast", {g.boolean({8, 1}), g.tensor({8, 4}), g.tensor({4})}),
                   OpSample("uneven_f64", {g.boolean({5, 6}), g.tensor({5, 6}, at::kDouble), g.tensor({5, 6}, at::kDouble)})};
  });
  db.add("aten::where.ScalarOther", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.boolean({8, 4}), g.tensor({8, 4}), 0.5})};
  });
  db.add("aten::where.ScalarSelf", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.boolean({8, 4}), 0.5, g.tensor({8, 4})}),
                   OpSample("uneven_f64", {g.boolean({5, 6}), -1.5, g.tensor({5, 6}, at::kDouble)})};
  });
  db.add("aten::where.Scalar", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.boolean({8, 4}), 1.5, -0.5}), OpSample("uneven", {g.boolean({5, 6}), 2.0, 0.25})};
  });

  // ---- ternary ----
  for (const char* op : {"aten::addcmul", "aten::addcdiv"}) {
    add_with_inplace(db, op, [](SampleGen& g) {
      return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4}), g.positive({8, 4})}).kw("value", 0.5),
                     OpSample("broadcast", {g.tensor({8, 4}), g.tensor({4}), g.positive({8, 1})}),
                     OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), g.tensor({5, 6}, at::kDouble),
                                             g.positive({5, 6}, at::kDouble)})};
    });
  }
  add_with_inplace(db, "aten::lerp.Scalar", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4}), 0.3}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), g.tensor({5, 6}, at::kDouble), 0.3})};
  });
  add_with_inplace(db, "aten::lerp.Tensor", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4}), g.tensor({8, 4}, at::kFloat, 0, 1)}),
                   OpSample("broadcast", {g.tensor({8, 4}), g.tensor({4}), g.tensor({8, 1}, at::kFloat, 0, 1)})};
  });
  add_with_inplace(db, "aten::masked_fill.Scalar", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.boolean({8, 4}), -1.5}),
                   OpSample("broadcast_mask", {g.tensor({8, 4}), g.boolean({4}), 0.0}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), g.boolean({5, 6}), 3})};
  });
  add_with_inplace(db, "aten::masked_fill.Tensor", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.boolean({8, 4}), g.tensor({})})};
  });
  add_with_inplace(db, "aten::clamp.Tensor", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4}, at::kFloat, -2, 0), g.tensor({8, 4}, at::kFloat, 0, 2)}),
                   OpSample("broadcast", {g.tensor({8, 4}), g.tensor({4}, at::kFloat, -2, 0), g.tensor({8, 1}, at::kFloat, 0, 2)})};
  });
  add_with_inplace(db, "aten::fill.Tensor", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({})})};
  });

  // ---- the backward ops autograd calls for the activations above ----
  auto grad_and = [](Dom d, Kwargs kw) {
    return [d, kw](SampleGen& g) {
      return with_kwargs(Samples{OpSample("even", {g.tensor({8, 4}), make(g, {8, 4}, d)}),
                                 OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), make(g, {5, 6}, d, at::kDouble)})},
                         kw);
    };
  };
  db.add("aten::threshold_backward", "pointwise", grad_and(Dom::kAny, {{"threshold", 0.0}}));
  db.add("aten::gelu_backward", "pointwise", grad_and(Dom::kAny, {}));
  db.add("aten::tanh_backward", "pointwise", grad_and(Dom::kUnit, {}));
  db.add("aten::sigmoid_backward", "pointwise", grad_and(Dom::kProb, {}));
  db.add("aten::silu_backward", "pointwise", grad_and(Dom::kAny, {}));
  db.add("aten::hardtanh_backward", "pointwise", grad_and(Dom::kAny, {{"min_val", -1}, {"max_val", 1}}));
  db.add("aten::leaky_relu_backward", "pointwise",
         grad_and(Dom::kAny, {{"negative_slope", 0.01}, {"self_is_result", false}}));
  db.add("aten::hardsigmoid_backward", "pointwise", grad_and(Dom::kAny, {}));
  db.add("aten::hardswish_backward", "pointwise", grad_and(Dom::kAny, {}));
  db.add("aten::mish_backward", "pointwise", grad_and(Dom::kAny, {}));
  db.add("aten::logit_backward", "pointwise", grad_and(Dom::kProb, {}));
  db.add("aten::softplus_backward", "pointwise", grad_and(Dom::kAny, {{"beta", 1}, {"threshold", 20}}));
  db.add("aten::hardshrink_backward", "pointwise", grad_and(Dom::kAny, {{"lambd", 0.5}}));
  db.add("aten::softshrink_backward", "pointwise", grad_and(Dom::kAny, {{"lambd", 0.5}}));
  db.add("aten::log_sigmoid_forward", "pointwise", [](SampleGen& g) { return unary(g, Dom::kAny); });
  db.add("aten::log_sigmoid_backward", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4}), g.tensor({8, 4})})};
  });
  add_with_inplace(db, "aten::threshold", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), 0.25, -3.0}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), 0.0, 1.0})};
  });
  db.add("aten::elu_backward", "pointwise", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), 1.0, 1.0, 1.0, false, g.tensor({8, 4})})};
  });
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
