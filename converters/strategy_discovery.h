// converters/strategy_discovery.h
//
// Strategy discovery by brute force, on one mesh dim (the counterpart of PyTorch's
// torch/distributed/tensor/_ops/strategy_validation.py, which runs on two ranks and even
// shards only): for one op sample and a mesh dim of `ranks` ranks, every placement of each
// tensor argument (Replicate, Shard on each dim of size > 1, uneven shards included, Partial of
// each reduce kind the dtype allows) is turned into the pieces each rank would hold, the op runs
// on each rank's pieces, and every candidate placement of each output is checked against the
// op's result on the whole tensors. A placement is valid when the pieces it implies equal the
// whole result: the same shapes (a shard's, empty ones included) and the values within the
// dtype's tolerance.
//
//   SampleDiscovery d = discover_strategies(op_handle, sample, {/*ranks=*/4});
//   for (const auto& c : d.combinations) ...  // c.inputs -> c.valid_outputs[o]
//
// Nothing is distributed: the ranks are simulated in this thread, with no group and no
// collective, so every combination of every sample costs a few local op calls.
//
// NOTE: [Partial pieces that catch non-linear ops]
// A Partial input's pieces are not "the value on one rank, zeros elsewhere" (an op with
// f(0) = 0, relu, would then pass Partial -> Partial): as PyTorch's validator builds them,
// rank 0 holds a share of the value plus an offset of |x| + 1 whose sign follows a
// checkerboard, and the other ranks the rest, so the pieces have mixed signs and magnitudes
// unlike the value's. Min and max pieces hold the value on one rank and the value moved away
// on the others (by 2 x range + 1, and in the second pass by (|x| + 1) / 2, so that abs does
// not pass max -> min), the rank holding it alternating on the checkerboard. The
// checkerboard of each argument is shifted by its index, so that two Partial arguments are not
// split alike (with the same holders, max(a) + max(b) would pass as max(a + b)). A combination
// with a Partial input is valid only if it is valid for the checkerboard and for its complement.
#pragma once

#include "converters/op_db.h"
#include "dtensor/placement/placement.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace c10 {
class OperatorHandle;
}

namespace dtensor {
namespace testing {

struct DiscoveryOptions {
  int64_t ranks = 2;     // the mesh dim's size (at least 2)
  bool partial = true;   // Partial inputs and outputs
  // Above this many input combinations, only those with at most two non-Replicate inputs.
  size_t max_input_combinations = 4096;
};

// One input combination and what it gives.
struct DiscoveredCombination {
  std::vector<Placement> inputs;                      // one per tensor argument, in stack order
  std::vector<std::vector<Placement>> valid_outputs;  // per output: every valid placement
  std::string error;  // the op raised on some rank's pieces ("" otherwise): nothing is valid
};

struct SampleDiscovery {
  std::string op;  // "aten::add.Tensor"
  std::string variant;
  int64_t ranks = 0;
  std::string skipped;  // non-empty: why the sample was not examined
  size_t tensor_inputs = 0, outputs = 0;
  std::vector<DiscoveredCombination> combinations;
};

// The placements discovery tries for a tensor like `t`: Replicate, Shard(d) for every dim of
// size > 1, then, with `partial`, Partial sum (not for bool), avg (floating and complex), min
// and max (not complex).
std::vector<Placement> candidate_placements(const at::Tensor& t, bool partial);

// The piece of `t` each of `ranks` ranks holds under `p` (NOTE: [Partial pieces that catch
// non-linear ops]; `mask_shift` 1: the complementary checkerboard, and min and max pieces
// moved near the value instead of beyond every value; `tensor_index` varies the shares and
// the checkerboard between arguments). Shard pieces are torch.chunk's (dtensor's), empty ones included.
std::vector<at::Tensor> local_pieces(const at::Tensor& t, const Placement& p, int64_t ranks, int mask_shift = 0,
                                     int tensor_index = 0);

// Whether the ranks' `pieces` are `expected` laid out as `p`. `rtol`/`atol`: nullopt takes the
// dtype's tolerance; integer and bool values compare exactly.
bool pieces_match(const std::vector<at::Tensor>& pieces, const Placement& p, const at::Tensor& expected,
                  std::optional<double> rtol = std::nullopt, std::optional<double> atol = std::nullopt);

// Every input combination of one sample of `op` (Partial only for floating and complex
// arguments: the pieces of an integer Partial are not valid indices). Skipped (with the reason): samples of random
// ops or without values to compare, ops that write an argument (in-place and out=), samples
// without a tensor argument, with a non-tensor output, or whose result is empty, all zero or
// all NaN (any Partial would pass).
SampleDiscovery discover_strategies(const c10::OperatorHandle& op, const OpSample& sample,
                                    const DiscoveryOptions& options = {});

// How an op's sharding rule compares with what discovery found for a sample (one mesh dim).
struct RuleJudgement {
  struct Strategy {
    std::vector<Placement> inputs, outputs;
    std::string to_string() const;  // "(S(0), R) -> (P(sum))"
  };
  bool has_rule = false;
  // The rule runs its own local computation (a kernel or an argument rewrite): its options are
  // not judged by the op on the pieces.
  bool own_local_computation = false;
  // Offered by the rule and not valid (the op raises on their pieces, or gives other values).
  std::vector<Strategy> wrong;
  // Valid, not offered, and needing no redistribution of inputs the rule would redistribute
  // (the rule's choice for those inputs costs `saved` > 0, redistribute_cost's bytes;
  // infinity: the rule has no valid strategy for them and raises). Most saved first.
  struct Missing {
    Strategy strategy;
    double saved = 0;
  };
  std::vector<Missing> missing;
  // Valid and not offered, whatever the cost (PyTorch's validator's "missing").
  size_t unoffered = 0;
  // Offered and valid.
  size_t confirmed = 0;
  // What the rule chooses for each input combination of the discovery (propagate()'s choice,
  // as a DTensor call with those inputs would run it), in the discovery's order. An op without
  // a rule: every one "unsupported", or "unjudged" when the op decomposes (a
  // CompositeImplicitAutograd kernel) into ops that have rules.
  struct Choice {
    std::vector<Placement> inputs;
    // "ok": a valid strategy; "wrong": discovery finds the chosen strategy not valid;
    // "unsupported": the rule has no strategy for these inputs (it raises); "unjudged": the rule
    // runs its own local computation, or chooses placements discovery does not try, or the op
    // decomposes into ops with rules.
    std::string status;
    std::vector<Placement> outputs;  // one per output (on the mesh dim); empty when unsupported
    double cost = 0;                 // redistribute_cost's bytes of the inputs' redistribution
    // Inputs whose redistribution needs a collective (anything but keeping the placement or
    // splitting a Replicate locally into a Shard or a Partial).
    int collectives = 0;
    std::string message;  // why it is unsupported
  };
  std::vector<Choice> choices;
};

// The rule's choices on a mesh of several dims (2-D, 3-D): for input layouts drawn from every
// mesh dim's candidate placements, the full strategy the rule chooses (the engine's expansion
// of its single-dim options, RuleOptions::valid included) is run on simulated pieces and
// checked, as discovery checks one mesh dim (NOTE: [Judging choices on a mesh of several
// dims]).
struct MeshCheckOptions {
  std::vector<int64_t> mesh_shape{2, 2};
  // Input layouts per sample: every one when there are at most this many, else as many drawn
  // at random (seeded by `seed`).
  size_t combinations = 48;
  uint64_t seed = 0;
  bool partial = true;
  // Also strided layouts (FSDP over tensor parallel: NOTE: [Strided shards]), besides the
  // drawn ones: on the last two mesh dims (StridedShard(d, sf = the last mesh dim's size),
  // Shard(d)), the earlier ones Replicate; each tensor so laid out with the others
  // replicated, and every tensor of the first tensor's shape so laid out at once. What a DTensor
  // call chooses for them is propagate()'s, relabelling included (NOTE: [Ops on strided
  // shards]).
  bool strided = true;
};
struct MeshJudgement {
  std::string skipped;  // why the sample was not examined (as discover_strategies says)
  bool has_rule = false, own_local_computation = false;
  size_t checked = 0;      // layouts whose chosen strategy was run and checked
  size_t strided = 0;      // of those, layouts with strided shards
  size_t unsupported = 0;  // layouts the rule has no strategy for (a DTensor call raises)
  size_t unjudged = 0;     // chosen strategies with a tensor both strided and Partial (not simulated)
  // Chosen strategies whose pieces do not give the result: "([S(0), R], [R, R]) -> ([S(0), R])"
  // (per tensor, its placement on each mesh dim), with why.
  std::vector<std::string> wrong;
};
MeshJudgement judge_rule_on_mesh(const c10::OperatorHandle& op, const OpSample& sample,
                                 const MeshCheckOptions& options = {}, const std::string& rule_name = "");

// "R", "S(1)", "P(sum)", "_S(0, 2)": a placement on one mesh dim as the discovery's reports and
// PyTorch's side (tools/opcov/pytorch_strategies.py) write it.
std::string placement_label(const Placement& p);

// Judges the rule of `rule_name` (default: the op's own, as the dispatcher finds it) against
// `discovery` (discover_strategies of the same op and sample, all-Replicate included): each
// option the rule gives for each visited input combination, on a 1-D mesh of discovery.ranks
// over a fake world. Options for placements discovery does not try are not judged.
RuleJudgement judge_rule(const c10::OperatorHandle& op, const OpSample& sample, const SampleDiscovery& discovery,
                         const std::string& rule_name = "");

}  // namespace testing
}  // namespace dtensor
