// converters/samples/random_samples.cpp: samples of the random ops. Every sample is seeded
// (NOTE: [Seeded random samples] in converters/op_check.h), so the values are compared
// exactly with the single-device op (NOTE: [Random ops on DTensors]). Shapes: one that
// divides the mesh, one that does not (float64), and, for normal_, one under 16 elements
// (libtorch draws normals for small tensors differently). Some samples pass an explicit
// generator (made here, so every rank has its own), the others draw from the RNG tracker.
#include "converters/samples/samples.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

namespace dtensor {
namespace testing {
namespace samples {

namespace {

constexpr uint64_t kSeed = 20231;

// A generator argument; the driver reseeds it before every call.
c10::IValue generator() { return at::detail::createCPUGenerator(0); }

// Samples of an op drawing into `self`: (self, extra arguments...).
SampleFn in_place(std::vector<c10::IValue> extra, at::ScalarType dtype = at::kFloat,
                  at::ScalarType uneven_dtype = at::kDouble) {
  return [extra, dtype, uneven_dtype](SampleGen& g) {
    auto args = [&](at::Tensor self) {
      std::vector<c10::IValue> a{std::move(self)};
      a.insert(a.end(), extra.begin(), extra.end());
      return a;
    };
    return Samples{OpSample("even", args(g.tensor({8, 4}, dtype))).seeded(kSeed),
                   OpSample("uneven", args(g.tensor({5, 6}, uneven_dtype))).seeded(kSeed),
                   OpSample("generator", args(g.tensor({8, 6}, dtype))).kw("generator", generator()).seeded(kSeed)};
  };
}

}  // namespace

void add_random_samples(OpDb& db) {
  db.add("aten::uniform_", "random", in_place({-1.0, 3.0}));
  db.add("aten::normal_", "random", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), 1.0, 2.0}).seeded(kSeed),
                   OpSample("uneven", {g.tensor({5, 6}, at::kDouble)}).seeded(kSeed),
                   OpSample("small", {g.tensor({3, 4})}).seeded(kSeed),
                   OpSample("generator", {g.tensor({8, 6})}).kw("generator", generator()).seeded(kSeed)};
  });
  db.add("aten::bernoulli_.float", "random", in_place({0.3}));
  db.add("aten::bernoulli_.Tensor", "random", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4}, at::kFloat, 0, 1)}).seeded(kSeed),
                   OpSample("broadcast_p", {g.tensor({8, 4}), g.tensor({4}, at::kDouble, 0, 1)}).seeded(kSeed),
                   OpSample("uneven_generator", {g.tensor({5, 6}, at::kDouble), g.tensor({5, 6}, at::kDouble, 0, 1)})
                       .kw("generator", generator())
                       .seeded(kSeed)};
  });
  db.add("aten::exponential_", "random", in_place({1.5}));
  db.add("aten::cauchy_", "random", in_place({0.5, 2.0}));
  db.add("aten::log_normal_", "random", in_place({0.5, 0.5}));
  db.add("aten::geometric_", "random", in_place({0.3}));
  db.add("aten::random_", "random", in_place({}, at::kFloat, at::kLong));
  db.add("aten::random_.from", "random", in_place({-3, 7}, at::kLong, at::kDouble));
  db.add("aten::random_.to", "random", in_place({9}, at::kLong, at::kInt));
  // Functional: probabilities / means / stds parametrise the draws.
  db.add("aten::bernoulli", "random", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}, at::kFloat, 0, 1)}).seeded(kSeed),
                   OpSample("uneven_generator", {g.tensor({5, 6}, at::kDouble, 0, 1)})
                       .kw("generator", generator())
                       .seeded(kSeed)};
  });
  db.add("aten::bernoulli.Tensor", "random", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4}, at::kFloat, 0, 1)}).seeded(kSeed),
                   OpSample("broadcast_p", {g.tensor({5, 6}, at::kDouble), g.tensor({6}, at::kDouble, 0, 1)})
                       .seeded(kSeed)};
  });
  db.add("aten::bernoulli.p", "random", [](SampleGen& g) {  // composite: empty_like + bernoulli_.float
    return Samples{OpSample("even", {g.tensor({8, 4}), 0.3}).seeded(kSeed),
                   OpSample("uneven_generator", {g.tensor({5, 6}, at::kDouble), 0.6})
                       .kw("generator", generator())
                       .seeded(kSeed)};
  });
  db.add("aten::normal.Tensor_float", "random", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), 0.5}).seeded(kSeed),
                   OpSample("uneven_generator", {g.tensor({5, 6}, at::kDouble)}).kw("generator", generator()).seeded(kSeed)};
  });
  db.add("aten::normal.float_Tensor", "random", [](SampleGen& g) {
    return Samples{OpSample("even", {1.0, g.positive({8, 4})}).seeded(kSeed),
                   OpSample("uneven", {-1.0, g.positive({5, 6}, at::kDouble)}).seeded(kSeed)};
  });
  db.add("aten::normal.Tensor_Tensor", "random", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.positive({8, 4})}).seeded(kSeed),
                   OpSample("broadcast_std", {g.tensor({5, 6}, at::kDouble), g.positive({6}, at::kDouble)})
                       .kw("generator", generator())
                       .seeded(kSeed)};
  });
  db.add("aten::normal_functional", "random", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), 1.0, 0.5}).seeded(kSeed),
                   OpSample("uneven", {g.tensor({5, 6}, at::kDouble)}).seeded(kSeed)};
  });
  for (const char* op : {"aten::rand_like", "aten::randn_like"})
    db.add(op, "random", [](SampleGen& g) {
      return Samples{OpSample("even", {g.tensor({8, 4})}).seeded(kSeed),
                     OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble)}).seeded(kSeed),
                     OpSample("to_f64", {g.tensor({8, 4})}).kw("dtype", at::kDouble).seeded(kSeed)};
    });
  // randint_like(self, high) and (self, low, high): integer values drawn in self's shape.
  db.add("aten::randint_like", "random", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), 10}).seeded(kSeed),
                   OpSample("uneven_long", {g.tensor({5, 6}), 7}).kw("dtype", at::kLong).seeded(kSeed)};
  });
  db.add("aten::randint_like.low_dtype", "random", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), -3, 5}).seeded(kSeed)};
  });
  db.add("aten::native_dropout", "random", [](SampleGen& g) {
    return Samples{OpSample("train", {g.tensor({8, 4}), 0.4, true}).seeded(kSeed),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), 0.5, true}).seeded(kSeed),
                   OpSample("eval", {g.tensor({8, 4}), 0.4, false}).seeded(kSeed)};
  });
  db.add("aten::native_dropout_backward", "random", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.boolean({8, 4}), 2.0}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), g.boolean({5, 6}), 1.25})};
  });
  // dropout is composite: on CPU, empty_like + bernoulli_.float + div_ + mul.
  db.add("aten::dropout", "random", [](SampleGen& g) {
    return Samples{OpSample("train", {g.tensor({8, 4}), 0.4, true}).seeded(kSeed),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), 0.5, true}).seeded(kSeed),
                   OpSample("eval", {g.tensor({8, 4}), 0.4, false}).seeded(kSeed)};
  });
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
