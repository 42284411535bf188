// dtensor/ops/registry.h
//
// Sharding propagation (DESIGN.md D5). For each aten operator a rule lists candidate
// strategies for ONE mesh dim ("single-dim options": a placement for every tensor input and
// every tensor output); the engine expands them over all mesh dims, prices each full strategy
// by the redistribution its inputs would need, and picks the cheapest (zero communication
// first, then the rule's order). Results are cached per (op, input specs, other arguments).
//
//   register_rule("aten::mm", [](const OpCall& c) {
//     return std::vector<DimOption>{{{Shard{0}}, {Shard{0}, Replicate{}}}, ...};
//   });
//
// An op without a rule raises an error naming the op and its input placements.
#pragma once

#include "dtensor/placement/placement.h"

#include <ATen/core/Tensor.h>
#include <ATen/core/function_schema.h>
#include <ATen/core/ivalue.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace c10 {
class OperatorHandle;
}  // namespace c10

namespace dtensor {
namespace ops {

// One schema argument as the rule sees it.
struct ArgInfo {
  enum class Kind { kDTensor, kDTensorList, kOther } kind = Kind::kOther;
  std::optional<DTensorSpec> spec;  // kDTensor
  // kDTensorList: the specs of the list's tensors, and where each sits in the list. A Tensor[]
  // has every position; a Tensor?[] (index, index_put) skips its None entries.
  std::vector<DTensorSpec> list;
  std::vector<int64_t> list_index;
  int64_t list_size = 0;  // entries in the list, None included
  c10::IValue value;      // kOther: the argument itself (plain 0-dim tensors too)
};

struct OpCall {
  std::string name;  // "aten::add.Tensor"
  const c10::FunctionSchema* schema = nullptr;
  std::vector<ArgInfo> args;
  const DeviceMesh* mesh = nullptr;
  // Specs of the DTensor inputs, flattened in argument order (lists expanded).
  std::vector<const DTensorSpec*> inputs;
  // Output metadata (global), computed by running the op on meta tensors.
  std::vector<TensorMeta> output_meta;
  // Index (in `inputs`) of the DTensor the op writes into and returns (in-place and out=
  // variants), or -1.
  int written_input = -1;
  // Indices (in `inputs`) of the elements of Tensor(a!)[] arguments, which in-place list ops
  // (_foreach_add_, ...) write without returning them: each keeps its placements (NOTE:
  // [In-place list ops]).
  std::vector<size_t> written_list_inputs;
  // The written input stands for a plain tensor (replicated on the fly: NOTE: [Plain tensors
  // made by backward formulas]): the caller reads the write from that tensor, so it keeps its
  // layout even for a rule that may re-lay out what it writes (RuleOptions::relayout_written).
  bool written_keeps_layout = false;
};

// Placements for one mesh dim: one per tensor output, one per DTensor input (flattened).
struct DimOption {
  std::vector<Placement> outputs;
  std::vector<Placement> inputs;
};

using Rule = std::function<std::vector<DimOption>(const OpCall&)>;

// A rewrite of the local call: given the local inputs' stack (DTensors replaced by their local
// tensors, already redistributed), adjust non-tensor arguments (sizes...) for local shapes.
using LocalArgRewrite = std::function<void(std::vector<c10::IValue>& args, const OpCall& call,
                                           const std::vector<std::vector<Placement>>& outputs)>;

// Placements on every mesh dim of one full strategy (one list per input / output).
using FullPlacements = std::vector<std::vector<Placement>>;

struct OutputSharding;

// Replaces the local call (step 4 of NOTE: [DTensor fallback]) for a rule whose local
// computation is not the op on the local shards, e.g. a row-sharded embedding that masks the
// indices outside its rows (NOTE: [Row-sharded embedding]). `args` holds the op's arguments
// with DTensors replaced by their redistributed local tensors (after the LocalArgRewrite, if
// any); the kernel returns the op's returns (local tensors). It runs below the DTensor key and
// below autograd, so it may call other aten ops on plain tensors, or op.callBoxed itself.
using LocalKernel = std::function<std::vector<c10::IValue>(const c10::OperatorHandle& op,
                                                           std::vector<c10::IValue>& args, const OpCall& call,
                                                           const OutputSharding& sharding)>;

// How the engine treats an op beyond its placements.
struct RuleOptions {
  // The outputs' shapes depend on the input VALUES (masked_select, nonzero, ...): metadata
  // inferred from stand-in tensors would be wrong, so each call takes the global metadata
  // from the local result. Only valid when every output is Replicate (the rule must say so).
  bool output_shape_from_local = false;
  // The same decided per call (index.Tensor is data dependent with a bool mask only).
  std::function<bool(const OpCall&)> output_shape_from_local_if;
  // Rejects a full strategy that the single-dim options cannot rule out on their own: the
  // engine expands options mesh dim by mesh dim, but whether a view keeps a shard can depend
  // on how the other mesh dims split the same tensor dim (NOTE: [Views of uneven shards]).
  std::function<bool(const OpCall&, const FullPlacements& inputs, const FullPlacements& outputs)> valid;
  // An in-place view (squeeze_, unsqueeze_, transpose_, t_): the op changes the shape of the
  // tensor it writes, so the written DTensor takes the output's spec (its placements may then
  // differ from the input's: a Shard(2) becomes Shard(1) when dim 0 is squeezed away).
  bool inplace_view = false;
  // NOTE: [In-place indexing may re-lay out what it writes]
  // An in-place op normally keeps the placements of the tensor it writes (its inputs are
  // redistributed instead, and with no such strategy it raises, as PyTorch does). Autograd's
  // C++ formulas accumulate gradients into fresh buffers in place
  // (grad.new_zeros(sizes).index_add_(...), scatter_add_, _index_put_impl_), and the buffer
  // follows the gradient's layout, which may shard the very dim being indexed. For the
  // indexing ops marked so, the engine may then redistribute the written tensor too and the
  // DTensor takes the new layout (every handle of it sees it; a view taken from it before is
  // no longer an alias of it). Strategies that keep the layout still win when there are any.
  bool relayout_written = false;
  // The op draws random numbers (NOTE: [Random ops on DTensors], dtensor/tensor/random.h): the
  // dispatcher runs it on global stand-ins with the mesh's RNG tracker so that every placement
  // gives the single-device values, instead of on the local tensors. The rule's options must
  // place no output Partial unless it is linear in a Partial input (dropout).
  bool random = false;
  // Runs instead of the op on the local shards (see LocalKernel); empty: the op itself.
  LocalKernel kernel;
};

// Registers a rule for "aten::name.overload" (or "aten::name" for every overload without a
// rule of its own).
void register_rule(const std::string& op, Rule rule, LocalArgRewrite rewrite = nullptr,
                   RuleOptions options = {});
bool has_rule(const std::string& op);
std::vector<std::string> ops_with_rules();

struct OutputSharding {
  std::vector<std::vector<Placement>> inputs;   // desired input placements (flattened)
  std::vector<std::vector<Placement>> outputs;  // output placements
  std::vector<TensorMeta> output_meta;          // global metadata of the outputs
  double cost = 0;
  LocalArgRewrite rewrite;
  bool replicate_fallback = false;  // NOTE: [Replicate fallback]
  bool output_shape_from_local = false;  // RuleOptions
  bool inplace_view = false;             // RuleOptions
  bool relayout_written = false;         // RuleOptions
  bool random = false;                   // RuleOptions
  LocalKernel kernel;                    // RuleOptions
};

// NOTE: [Replicate fallback]
// An op without a rule raises (naming the op). While a ReplicateFallbackGuard is alive on the
// calling thread it runs instead on replicated inputs (every input is gathered in full) and
// its outputs are Replicate: correct for deterministic ops, at the price of whole-tensor
// communication, and hiding the missing rule; hence opt-in. A random op under the fallback
// gives each rank different values. An op that writes into a non-replicated DTensor still
// raises. replicate_fallback_uses() counts the op calls that used it (this thread), so that
// tests and reports can tell "covered by a rule" from "works through the fallback".
class ReplicateFallbackGuard {
 public:
  ReplicateFallbackGuard();
  ~ReplicateFallbackGuard();
  ReplicateFallbackGuard(const ReplicateFallbackGuard&) = delete;
  ReplicateFallbackGuard& operator=(const ReplicateFallbackGuard&) = delete;

 private:
  bool prev_;
};
bool replicate_fallback_enabled();
int64_t replicate_fallback_uses();
// Called by the dispatcher fallback each time an op runs through the replicate fallback.
void note_replicate_fallback_use();

// Chooses the strategy for `call` (cached). On a cache miss `infer_meta` fills
// call.output_meta before the rule runs. Throws c10::Error naming op and placements when no
// rule exists or no candidate is valid.
OutputSharding propagate(OpCall& call, const std::function<std::vector<TensorMeta>()>& infer_meta);

// Estimated bytes moved to take `from` to `to` (0 when equal).
double redistribute_cost(const DTensorSpec& from, const std::vector<Placement>& to);

// The propagation cache is a least-recently-used map of at most this many strategies (NOTE:
// [Propagation cache keys are exact]): a training loop's calls fit many times over (the
// Transformer's step makes a few hundred), while a job whose shapes keep changing (a new
// sequence length every step) holds a bounded amount, the least recently used dropped first.
constexpr size_t kPropagationCacheCapacity = 4096;

// Cache statistics (for tests and benchmarks); clear_propagation_cache() resets them.
struct CacheStats {
  int64_t hits = 0, misses = 0, evictions = 0;
  size_t size = 0, capacity = kPropagationCacheCapacity;
};
CacheStats propagation_cache_stats();
void clear_propagation_cache();
// Sets the capacity (at least 1; entries beyond it are evicted now) and returns the previous
// one. For tests; the default is kPropagationCacheCapacity.
size_t set_propagation_cache_capacity(size_t capacity);

// An op without a meta kernel in this libtorch computes its outputs' global metadata on CPU
// stand-ins of its global inputs (NOTE: [Output metadata without the data]), once per op and
// input metadata. Those stand-ins may take at most this many bytes on each rank; beyond, the op
// raises, naming itself, instead of allocating the unsharded tensors a sharded op avoids.
constexpr int64_t kStandInLimitBytes = int64_t{256} << 20;
// Sets that limit (at least 0) and returns the previous one.
int64_t set_stand_in_limit_bytes(int64_t bytes);

// ---- helpers for rules -----------------------------------------------------------------------
// Shard(d) maps for a broadcasting input: the input dim that lines up with output dim d, or
// -1 when the input has no such dim or broadcasts it (size 1 vs > 1).
int64_t broadcast_input_dim(const std::vector<int64_t>& in_shape,
                            const std::vector<int64_t>& out_shape, int64_t out_dim);
// The out= arguments of `schema` (keyword-only arguments it writes), as positions in its
// argument list, in order.
std::vector<size_t> out_arguments(const c10::FunctionSchema& schema);
// Positions (in OpCall::inputs) of the out= arguments: keyword-only arguments the op writes.
// They are not operands: rules give them the output's placement.
std::vector<size_t> out_inputs(const OpCall& c);
int64_t arg_int(const OpCall& c, size_t i, int64_t fallback);
std::vector<int64_t> arg_int_list(const OpCall& c, size_t i);
bool arg_bool(const OpCall& c, size_t i, bool fallback);
// One placement per DTensor input, in argument order: by_arg(i) for schema argument i (for
// rules whose inputs include optional tensors, so that input positions vary).
std::vector<Placement> inputs_by_arg(const OpCall& c, const std::function<Placement(size_t arg)>& by_arg);

}  // namespace ops
}  // namespace dtensor
