// converters/op_db.h
//
// The op sample database: for every aten operator overload we test, its family and a few
// sample argument lists (shapes that divide the mesh and shapes that do not, several dtypes,
// non-tensor arguments). The op-check driver (op_check.h) runs each sample on plain tensors
// and on every sharding of its tensors; suites/ops and tools/opcov iterate the database.
// The counterpart of PyTorch's OpInfo database as used by test_dtensor_ops.py.
//
//   // converters/samples/pointwise_samples.cpp
//   void add_pointwise_samples(OpDb& db) {
//     db.add("aten::add.Tensor", "pointwise", [](SampleGen& g) {
//       return std::vector<OpSample>{
//           OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4})}).kw("alpha", 2),
//           OpSample("broadcast", {g.tensor({8, 4}), g.tensor({4})}),
//       };
//     });
//   }
//
// Samples are deterministic: SampleGen is seeded from the op's name, so every rank (and
// every run) builds the same values. Arguments not given take the schema's defaults
// (boxed_args), so a sample names only what it sets.
//
// Besides the hand-written samples, generated_samples() derives one sample from an op's
// schema when the signature is simple (tensors, scalars, ints, int lists, bools, floats):
// ops nobody wrote samples for are still exercised (tools/opcov).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace dtensor {
namespace testing {

// Deterministic sample tensors. Floating tensors are uniform in [low, high); integer
// tensors uniform in [low, high) rounded down; bool tensors random.
class SampleGen {
 public:
  explicit SampleGen(uint64_t seed);

  at::Tensor tensor(std::vector<int64_t> shape, at::ScalarType dtype = at::kFloat,
                    double low = -2.0, double high = 2.0);
  // Floating values in [0.5, 2): for log, sqrt, reciprocal, division.
  at::Tensor positive(std::vector<int64_t> shape, at::ScalarType dtype = at::kFloat);
  // Integer values in [0, high): indices.
  at::Tensor index(std::vector<int64_t> shape, int64_t high);
  at::Tensor boolean(std::vector<int64_t> shape);
  uint64_t seed() const { return seed_; }

 private:
  uint64_t seed_;
  uint64_t counter_ = 0;
};

// One argument list for an op.
struct OpSample {
  OpSample() = default;
  OpSample(std::string variant, std::vector<c10::IValue> args)
      : variant(std::move(variant)), args(std::move(args)) {}

  // Sets a keyword argument (any argument, by its schema name). Chainable.
  OpSample& kw(const std::string& name, c10::IValue value) {
    kwargs.emplace_back(name, std::move(value));
    return *this;
  }
  OpSample& tol(double rtol_, double atol_) {
    rtol = rtol_;
    atol = atol_;
    return *this;
  }
  OpSample& no_backward() {
    backward = false;
    return *this;
  }
  // Only shapes and dtypes are compared (empty_like and other ops with unspecified values).
  OpSample& shape_only() {
    compare_values = false;
    backward = false;
    return *this;
  }
  // Checked on 1-D meshes only, `why` saying where the 2-D layouts are checked instead (a
  // backward op: as its forward op's backward; the op suite skips it on a 2-D mesh saying so).
  OpSample& only_1d(std::string why) {
    only_1d_because = std::move(why);
    return *this;
  }
  // A random op: the driver seeds every generator the op may draw from with `seed` before the
  // plain call and before each DTensor call, so that both start from the same state and the
  // values are compared exactly (NOTE: [Seeded random samples] in op_check.h). A Generator
  // argument must be made inside the sample function (each rank gets its own object).
  OpSample& seeded(uint64_t seed) {
    rng_seed = seed;
    return *this;
  }

  // Short name, unique within the op: "even", "uneven", "broadcast", "dim1_keepdim", "f64".
  std::string variant;
  // Positional arguments in schema order; the rest come from `kwargs` or the defaults.
  std::vector<c10::IValue> args;
  std::vector<std::pair<std::string, c10::IValue>> kwargs;
  // Tolerances for floating results (std::nullopt: the driver's defaults).
  std::optional<double> rtol, atol;
  // Check gradients too (when the op is differentiable in a floating input).
  bool backward = true;
  bool compare_values = true;
  // seeded(): the seed of every generator (std::nullopt: not a random op).
  std::optional<uint64_t> rng_seed;
  // only_1d(): why the sample is not run on 2-D meshes (empty: it is).
  std::string only_1d_because;
};

using SampleFn = std::function<std::vector<OpSample>(SampleGen&)>;

struct OpInfo {
  std::string op;      // "aten::add.Tensor"; "aten::relu" for the overload-less one
  std::string family;  // pointwise, reduction, matrix, view, tensor, embedding, norm, loss,
                       // random, conv, generated
  SampleFn samples;
  bool generated = false;  // samples come from generated_samples()

  // "aten::add" and "Tensor" ("" for the default overload).
  std::string name() const;
  std::string overload() const;
  // The samples, with a generator seeded from the op name.
  std::vector<OpSample> make_samples() const;
};

class OpDb {
 public:
  // Registers samples for `op` ("aten::name" or "aten::name.overload"). Throws if the op is
  // not in the dispatcher or is already registered.
  void add(const std::string& op, const std::string& family, SampleFn samples,
           bool generated = false);
  const std::vector<OpInfo>& ops() const { return ops_; }
  const OpInfo* find(const std::string& op) const;
  std::vector<std::string> families() const;

 private:
  std::vector<OpInfo> ops_;
  std::unordered_map<std::string, size_t> index_;
};

// The hand-written database (built once; thread-safe), with the out= samples derived from it.
// NOTE: [Out= samples from the functional overload]
// Every out= overload (keyword-only arguments it writes: aten::abs.out, aten::max.dim_max,
// aten::nll_loss_forward.output, ...) without samples of its own, whose functional overload
// (same name, the same other arguments, one return per out= argument) has hand-written ones,
// gets the functional's first sample that runs on plain tensors with out= tensors of
// the result's shapes and dtypes, in the functional's family. The driver then shards the out=
// tensors like any other: a placement no strategy can write in place is refused as documented
// (NOTE: [Out= and in-place combinations refused] in op_check.h).
const OpDb& op_db();

// Every aten operator in the dispatcher with samples generated from its schema, except
// those in op_db() (built once; thread-safe). Ops whose schema is not simple enough (see
// generated_samples) are not in it.
const OpDb& generated_op_db();

// One sample from `schema`, or nullopt when its signature is not simple: see the .cpp for
// the argument kinds handled. The sample may still be invalid for the op (the driver then
// reports "invalid sample").
std::optional<OpSample> generated_sample(const c10::FunctionSchema& schema, SampleGen& g);
// NOTE: [Generated samples that do work]
// Variant `k` (0 <= k < kGeneratedVariants) of the generated sample: 0 as above; the others
// change ints (2 instead of 1, int lists [2, 1], bools true), the domain of floating tensors
// ((0.1, 0.9), [1.1, 3)) or sizes ([4, 16], [2, 8, 8]). generated_op_db() runs the variants on
// plain tensors (once per process; rank threads share the choice) and keeps the first whose
// outputs are not empty, not all NaN, not an input unchanged, and NaN-free (else the first
// non-trivial one with NaN, else variant 0): `tile` then gets dims [2, 1], arccos a domain
// where it is defined, split more than one section.
constexpr int kGeneratedVariants = 6;
std::optional<OpSample> generated_sample(const c10::FunctionSchema& schema, SampleGen& g, int variant);

// The full boxed stack for `schema`: `args` positionally, then `kwargs` by name, then the
// schema defaults. Ints given for float arguments become doubles. Throws naming the op and
// the argument for a missing argument, an unknown keyword or too many positional ones.
std::vector<c10::IValue> boxed_args(const c10::FunctionSchema& schema,
                                    const std::vector<c10::IValue>& args,
                                    const std::vector<std::pair<std::string, c10::IValue>>& kwargs);

// "aten::add.Tensor" for a schema (the name tools and files use).
std::string op_key(const c10::FunctionSchema& schema);

}  // namespace testing
}  // namespace dtensor
