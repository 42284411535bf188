// converters/op_check.h
//
// The op-check driver: runs an op on plain tensors, then on every sharding of its tensor
// arguments (DTensorConverter), and compares every output gathered with full_tensor() to the
// plain output; with `backward`, it also compares the gradients of every floating input
// (a fixed random gradient flows back through full_tensor and the op). The result is data
// (statuses, reasons, failing combinations, max error), so that a gtest fixture (test_op), the
// op suite (suites/ops) and the coverage tool (tools/opcov) share one implementation.
//
//   OpCheckResult r = check_op(mesh, op_handle, {x, y, c10::IValue(1)}, {});
//   if (r.forward.status != CheckStatus::kPass) std::cout << r.forward.reason;
//
// COLLECTIVE over the mesh: every rank must call it with the same op, argument shapes and
// dtypes, and options. The values of the mesh's first rank are used everywhere (they are
// broadcast first, so unseeded random arguments are fine), and the ranks agree on every
// verdict, so no rank takes another path (NOTE: [Op check verdicts agree]). A
// comm::CollectiveError is rethrown, since the group is then broken.
#pragma once

#include "converters/dtensor_converter.h"
#include "converters/op_db.h"
#include "dtensor/mesh/device_mesh.h"

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace c10 {
class OperatorHandle;
}

namespace dtensor {
namespace testing {

// Default tolerances (float32 reductions over shards reorder additions).
constexpr double kDefaultCheckRtol = 1e-5;
constexpr double kDefaultCheckAtol = 1e-6;

enum class CheckStatus {
  kPass,   // every combination matched the plain result
  kFail,   // some combination gave a wrong shape, dtype or value
  kError,  // some combination threw (no sharding rule, no valid strategy, ...)
  kSkip,   // not checked: the sample is invalid on plain tensors, or nothing is differentiable
};
std::string to_string(CheckStatus s);

struct CombinationFailure {
  std::string placements;  // DTensorConverter::combination_string
  std::string message;
};

struct DirectionResult {
  CheckStatus status = CheckStatus::kSkip;
  // Why it is not a pass (the first failure's message), or why it was skipped.
  std::string reason;
  int64_t combinations = 0;  // combinations run
  int64_t passed = 0;
  // Combinations the op refused as documented: an in-place op whose written argument is
  // Partial and that cannot keep it Partial raises (NOTE: [Partial and linearity]); that is
  // the library's contract, not a failure. Counted apart, never in `passed`.
  int64_t refused = 0;
  double max_error = 0;  // largest |actual - expected| among compared values
  std::vector<CombinationFailure> failures;  // the first few
  // {passed, run} per placement of the first tensor argument ("Shard(dim=0)" on a 1-D mesh,
  // "(Shard(dim=0), Replicate())" on a 2-D one): the op x placement grid of tools/opcov.
  std::map<std::string, std::pair<int64_t, int64_t>> by_placement;
  // NOTE: [Trivial cases]: why a passing check verified nothing ("" when it did).
  std::string trivial;
};

// NOTE: [Trivial cases]
// A check whose plain outputs are all empty, or whose floating outputs are all NaN (NaN
// compares equal), or (OpCheckOptions::identity_is_trivial) whose every output equals one of
// its inputs unchanged, passes without testing the op: DirectionResult::trivial says so, and
// reports do not count such a case as verified.

struct OpCheckOptions {
  // Passes when |actual - expected| <= atol + rtol * |expected| for floating outputs; other
  // dtypes must be equal.
  double rtol = kDefaultCheckRtol;
  double atol = kDefaultCheckAtol;
  DTensorConverterOptions converter;
  // Check gradients of the floating inputs too (skipped for ops that write an input).
  bool backward = false;
  // Compare values; false compares shapes and dtypes only (empty_like, ...).
  bool compare_values = true;
  // Failures kept per direction.
  size_t max_failures_kept = 4;
  // Ops without a sharding rule run through the replicate fallback (gather, run, replicate);
  // OpCheckResult::used_fallback tells whether it was needed.
  bool replicate_fallback = false;
  // Seed of the random output gradients used for backward.
  uint64_t grad_seed = 20240;
  // Stop at the first combination that fails for want of a sharding rule (every other one
  // would fail alike): for surveys of ops without rules (tools/opcov).
  bool stop_on_missing_rule = false;
  // For random ops: seed every generator before every call (NOTE: [Seeded random samples]).
  std::optional<uint64_t> rng_seed;
  // An output equal to an input unchanged makes the case trivial (NOTE: [Trivial cases]); off
  // for hand-written samples of ops whose result is their input (clone, contiguous, ...).
  bool identity_is_trivial = false;
  // The written argument is an out= argument (keyword-only): set by check_op on an operator
  // handle (NOTE: [Out= and in-place combinations refused]).
  bool written_is_out = false;
};

// NOTE: [Out= and in-place combinations refused]
// An in-place or out= op keeps the placements of the tensor it writes and raises when no
// strategy can produce them (as PyTorch's DTensor does for in-place ops). A combination is
// refused as documented -- counted apart in DirectionResult::refused, never as a pass -- when
// the op raises so and the written tensor is Partial (an in-place op), or the written tensor is
// an out= argument (whose placements the driver varies like an operand's: an out= Shard(1) of a
// reduction over dim 1 cannot be written). A case where every combination was refused verified
// nothing (NOTE: [Trivial cases]).

// NOTE: [Seeded random samples]
// A random op gives the single-device values on DTensors when both start from the same
// generator state (NOTE: [RNG tracker] in dtensor/tensor/random.h). With
// OpCheckOptions::rng_seed set, the driver seeds with it
//   - before the plain call: every at::Generator argument (set_current_seed) and libtorch's
//     default CPU generator (at::manual_seed), holding one process-wide lock over seeding and
//     call, since rank threads share the default generator;
//   - before each DTensor call: every at::Generator argument and the mesh's RNG tracker
//     (dtensor::manual_seed(seed, mesh), collective).
// Forward values and gradients are then compared as for any op. A Generator argument must be
// a distinct object on every rank (samples are made per rank, so one made in the sample
// function is).

struct OpCheckResult {
  std::string op;
  DirectionResult forward;
  DirectionResult backward;
  int64_t total_combinations = 0;  // before DTensorConverterOptions::max_combinations
  // DTensorConverter::design() and plan(): which combinations ran (NOTE: [Converter covering
  // design]).
  std::string design;
  std::vector<int64_t> plan;
  bool used_fallback = false;
  double duration_ms = 0;
  // libtorch warnings raised during the check, each once (NOTE: [Warnings go into the
  // records] in op_check.cpp): kept here instead of printed.
  std::vector<std::string> warnings;
};

// While alive, libtorch warnings raised on this thread are appended (each once) to `into`
// instead of printed (NOTE: [Warnings go into the records] in op_check.cpp). check_op uses
// one; nest freely: an inner collector's warnings reach the enclosing one too.
class ScopedWarningCollector {
 public:
  explicit ScopedWarningCollector(std::vector<std::string>* into);
  ~ScopedWarningCollector();
  ScopedWarningCollector(const ScopedWarningCollector&) = delete;
  ScopedWarningCollector& operator=(const ScopedWarningCollector&) = delete;

 private:
  std::vector<std::string>* into_;
  std::vector<std::string>* prev_;
};

// An op called boxed: the full argument stack in, the returned values out.
using BoxedOp = std::function<std::vector<c10::IValue>(std::vector<c10::IValue>)>;

// Collective. `written_arg`: the stack position of the argument the op mutates (in-place /
// out=), or -1: the plain run gets clones, and backward is not checked.
OpCheckResult check_op(const DeviceMesh& mesh, const std::string& op_name, const BoxedOp& op,
                       int written_arg, const std::vector<c10::IValue>& args,
                       const OpCheckOptions& options);
OpCheckResult check_op(const DeviceMesh& mesh, const c10::OperatorHandle& op,
                       const std::vector<c10::IValue>& args, const OpCheckOptions& options);
// A database sample: its arguments completed with boxed_args, its tolerances and flags
// applied over `options`.
OpCheckResult check_sample(const DeviceMesh& mesh, const OpInfo& op, const OpSample& sample,
                           const OpCheckOptions& options);

}  // namespace testing
}  // namespace dtensor
