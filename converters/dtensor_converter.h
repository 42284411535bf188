// converters/dtensor_converter.h
//
// DTensorConverter: turns the plain tensors of an operator's boxed argument stack into
// DTensors, once for every combination of placements, so that a test can check that an op
// gives the same answer on every sharding it accepts. The C++ counterpart of PyTorch's
// torch.testing._internal.distributed._tensor.common_dtensor.DTensorConverter.
//
//   // In every rank (collective: see the class comment):
//   DeviceMesh mesh = init_device_mesh("cpu", {4});
//   DTensorConverter converter(mesh, {at::randn({8, 4}), at::randn({8, 4}), c10::IValue(1)});
//   std::vector<c10::IValue> stack;
//   while (converter.next(stack)) {          // 3 x 3 = 9 combinations
//     // stack[0] and stack[1] are DTensors, stack[2] is the int 1.
//     SCOPED_TRACE(converter.current_placements_string());  // "arg0=Shard(dim=0), arg1=..."
//   }
//   EXPECT_TRUE(converter.successful());
//
// NOTE: [Converter sharding choices]
// Every tensor found in the stack (positional arguments, elements of TensorList and
// List<Tensor?>, tuple elements; None stands for an absent optional) gets a list of
// choices, each a full placement list (one Placement per mesh dim):
//   - 0-dim tensors: Replicate only; bool tensors: no Partial (c10d collectives do not
//     reduce bool), Shard as any other tensor;
//   - unsupported tensors (sparse, quantized, mkldnn, nested, lazy/meta, neg/conj views,
//     tensors that already are DTensors): Replicate only, and they are left plain, which
//     makes each combination a miss (as in PyTorch);
//   - otherwise Replicate, then Shard(i) for every tensor dim i with size > 1 that divides
//     evenly by the mesh size (Options::uneven: every dim with size > 1), then
//     Partial(sum) with Options::partial.
// On a mesh of several dims, a choice without Options::mesh_2d applies the same placement
// on every mesh dim (Shard(i) then splits dim i over all ranks, hence "divisible by the
// mesh size"). With Options::mesh_2d the choices are per mesh dim: the product over mesh
// dims d of {Replicate, Shard(i) for size > 1 divisible by mesh.size(d), Partial}, keeping
// only the lists where every tensor dim divides evenly by the product of the mesh sizes
// that shard it (all of them with Options::uneven).
// The combinations are the cartesian product of the tensors' choices, in itertools.product
// order (the last tensor's choice varies fastest).
//
// NOTE: [Converter covering design]
// With Options::max_combinations = cap > 0 and a product larger than the cap, next() visits a
// covering design instead of the product: the all-Replicate combination, then rows chosen
// greedily until EVERY PAIR of tensors has been seen in EVERY PAIR of their choices (hence
// every tensor in every one of its choices), then combinations drawn at random (seeded with
// Options::seed, so every rank and every run visits the same ones) until the cap. The
// covering alone may exceed the cap (two tensors of 16 choices need all 256 pairs): the cap
// bounds the random extras, never the coverage. plan() lists the combination indices visited.
#pragma once

#include "dtensor/mesh/device_mesh.h"
#include "dtensor/placement/placement.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dtensor {
namespace testing {

// Choices beyond PyTorch's (NOTE: [Converter sharding choices]); all off by default.
struct DTensorConverterOptions {
  // Choose a placement per mesh dim (the product over mesh dims) instead of one placement
  // for the whole mesh.
  bool mesh_2d = false;
  // Add Partial(sum): the tensor is distributed as Replicate, then the ranks at mesh
  // coordinate 0 (of every Partial mesh dim) keep their values and the others hold zeros,
  // wrapped with from_local; the sum over the mesh is the original tensor.
  bool partial = false;
  // Also shard dims (size > 1) that do not divide evenly (NOTE: [Uneven shards]).
  bool uneven = false;
  // When > 0 and there are more combinations than this, next() visits a pairwise covering
  // design topped up with seeded random combinations to this many (NOTE: [Converter covering
  // design]); the covering may exceed it.
  int64_t max_combinations = 0;
  // Seed of the random combinations of the covering design.
  uint64_t seed = 0x5eed;
  // false: above the cap, all Replicate and seeded random combinations only (a quick probe,
  // e.g. whether an op works through the replicate fallback), no pairwise coverage.
  bool cover_pairs = true;
};

// Not thread-safe; one converter per rank. The constructor and the accessors are local;
// next() is COLLECTIVE over the mesh (it calls distribute_tensor / from_local): every rank
// of the mesh must construct the converter with the same mesh, argument shapes, dtypes and
// options, and call next() the same number of times. The values of the mesh's first rank
// are the ones distributed.
class DTensorConverter {
 public:
  using Options = DTensorConverterOptions;

  // `args`: a boxed argument stack in the op's schema order (e.g. for aten::add.Tensor:
  // self, other, alpha). Kept by value; its tensors are read at every next().
  DTensorConverter(const DeviceMesh& mesh, std::vector<c10::IValue> args,
                   Options options = Options());

  // Collective. Converts the next combination into `converted` (a copy of the stack with
  // every tensor replaced by its DTensor; requires_grad is kept) and returns true, or
  // returns false when every combination has been produced. A combination whose conversion
  // throws is skipped and counted as a miss (its message is kept in errors()); a
  // comm::CollectiveError is rethrown (the group is broken, going on would hang).
  bool next(std::vector<c10::IValue>& converted);

  // Combinations converted in full so far.
  int64_t hits() const { return hits_; }
  // Combinations that threw, or that hold an unsupported tensor left plain.
  int64_t misses() const { return misses_; }
  // No miss so far. (PyTorch also requires hits > 0; here an op without tensor arguments
  // has one, empty, combination that counts as a hit.)
  bool successful() const { return misses_ == 0; }
  // Why each miss happened: "<combination>: <message>" for a conversion that threw,
  // "<combination>: <tensor> left plain (...)" for an unsupported tensor.
  const std::vector<std::string>& errors() const { return errors_; }

  // Tensors found in the stack, in stack order (depth first).
  int64_t num_tensors() const { return static_cast<int64_t>(slots_.size()); }
  // Name of tensor i: "arg<stack position>", then "[<index>]" per level of list / tuple,
  // e.g. "arg1[0]" for the first tensor of a TensorList passed second.
  const std::string& tensor_name(int64_t i) const;
  // The choices of tensor i, each one placement per mesh dim.
  const std::vector<std::vector<Placement>>& choices(int64_t i) const;
  // Product of the numbers of choices (1 when there is no tensor).
  int64_t num_combinations() const { return num_combinations_; }
  // How many combinations next() produces (num_combinations() unless max_combinations cuts).
  int64_t num_visited() const { return static_cast<int64_t>(plan_.size()); }
  // The combination indices next() visits, in order.
  const std::vector<int64_t>& plan() const { return plan_; }
  // "full product" or "pairwise covering (N) + M seeded random" (NOTE: [Converter covering
  // design]).
  const std::string& design() const { return design_; }
  // The placement list of every tensor in combination `index` (0 <= index <
  // num_combinations()).
  std::vector<std::vector<Placement>> combination(int64_t index) const;
  // "arg0=Shard(dim=0), arg1=Replicate()": one placement on a 1-D mesh, a tuple
  // "(Shard(dim=0), Replicate())" on a mesh of several dims; "" when there is no tensor.
  std::string combination_string(int64_t index) const;
  // combination_string of the combination the last next() produced ("" before the first).
  std::string current_placements_string() const;
  // Index of the combination the last next() produced (-1 before the first).
  int64_t current_index() const { return current_index_; }

  const DeviceMesh& mesh() const { return mesh_; }
  const Options& options() const { return options_; }

 private:
  struct Slot {
    std::string name;
    bool supported = true;
    std::vector<std::vector<Placement>> choices;
  };

  std::vector<std::vector<Placement>> gen_choices(const at::Tensor& t) const;
  at::Tensor to_dist_tensor(const at::Tensor& t, const std::vector<Placement>& placements) const;

  DeviceMesh mesh_;
  std::vector<c10::IValue> args_;
  Options options_;
  std::vector<Slot> slots_;
  void make_plan();

  int64_t num_combinations_ = 1;
  std::vector<int64_t> plan_;
  std::string design_;
  int64_t next_index_ = 0;
  int64_t current_index_ = -1;
  int64_t hits_ = 0;
  int64_t misses_ = 0;
  std::vector<std::string> errors_;
};

// False for tensors a DTensor cannot wrap (see NOTE: [Converter sharding choices]).
bool is_supported_tensor(const at::Tensor& t);

// Helpers over boxed values, shared with the test fixtures.
namespace detail {
// Every tensor in `values`, depth first through lists and tuples.
std::vector<at::Tensor> flatten_tensors(const std::vector<c10::IValue>& values);
// A copy of `values` where every tensor t is replaced by fn(t); lists and tuples holding a
// tensor are rebuilt (c10::List has reference semantics: the input is never modified).
std::vector<c10::IValue> map_tensors(const std::vector<c10::IValue>& values,
                                     const std::function<at::Tensor(const at::Tensor&)>& fn);
}  // namespace detail

}  // namespace testing
}  // namespace dtensor
