// dtensor/ops/registry.cpp: rule registry, strategy expansion and costs (the propagation cache is in
// propagation_cache.cpp).
#include "dtensor/ops/registry.h"
#include "dtensor/ops/strategy_query.h"

#include "dtensor/ops/propagation_cache_internal.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <list>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace dtensor {
namespace ops {

namespace {
struct Entry {
  Rule rule;
  LocalArgRewrite rewrite;
  RuleOptions options;
};
std::unordered_map<std::string, Entry>& rules() {
  static std::unordered_map<std::string, Entry> r;
  return r;
}
thread_local bool t_replicate_fallback = false;
thread_local int64_t t_replicate_fallback_uses = 0;
// NOTE: [Named-tensor overloads have no rule]
// DTensor, like PyTorch's, does not carry dim names: a rule registered under a bare name does
// not serve the overloads taking Dimname arguments (aten::sum.dim_DimnameList,
// aten::cumsum.dimname, aten::max.names_dim, ...), whose overload names say so.
bool named_tensor_overload(const std::string& overload) {
  return overload.find("imname") != std::string::npos || overload.find("names") != std::string::npos;
}

const Entry* find_rule(const std::string& name);
// Names without an exact registration, resolved (emptied by register_rule; a function-local
// static, since rules register from other files' static initializers).
struct Resolved {
  std::mutex mu;
  std::unordered_map<std::string, const Entry*> map;
};
Resolved& resolved() {
  static Resolved r;
  return r;
}

// NOTE: [Rules of functional ops serve their out= overloads]: the rule of an out= overload
// without one of its own is its functional overload's: the overload of the same name taking the
// same other arguments (names, types, and whether they are written) and returning one tensor
// per out= argument. None (nullptr) when there is no such overload, or it has no rule, or
//   - the out= overload returns nothing (unsafe_split_with_sizes.out: its outputs are not
//     described) or not one tensor per out= argument (several out= tensors, as max.dim_max or
//     sort.values, are fine: NOTE: [Out= overloads with several outputs] in dispatch.cpp);
//   - the functional's rule does more than place tensors -- a local kernel, a rewrite of the
//     local arguments, or options (random, in-place relayout, data-dependent shapes) -- which
//     would not write the out= tensor (embedding.out's masked kernel gave wrong values).
bool plain_placement_rule(const Entry& e) {
  const RuleOptions& o = e.options;
  return !e.rewrite && !o.kernel && !o.random && !o.relayout_written && !o.inplace_view &&
         !o.output_shape_from_local && !o.output_shape_from_local_if;
}

// Out= overloads whose functional rule does not fit, found by their derived samples (op_db.h):
// index_put's rule takes its last DTensor input for the values (the out= tensor here), and
// convolution.out redistributed the tensor it writes on a 2-D mesh (cause not found).
bool functional_rule_does_not_fit(const std::string& op) {
  return op == "aten::index_put.out" || op == "aten::convolution.out";
}

const Entry* out_overload_rule(const c10::FunctionSchema& schema, const std::vector<size_t>& outs) {
  if (outs.empty() || schema.returns().size() != outs.size()) return nullptr;
  if (functional_rule_does_not_fit(schema.name() + "." + schema.overload_name())) return nullptr;
  static const std::unordered_map<std::string, std::vector<c10::OperatorName>> by_name = [] {
    std::unordered_map<std::string, std::vector<c10::OperatorName>> m;
    for (const auto& n : c10::Dispatcher::singleton().getAllOpNames()) m[n.name].push_back(n);
    return m;
  }();
  auto it = by_name.find(schema.name());
  if (it == by_name.end()) return nullptr;
  const auto& o = schema.arguments();
  for (const auto& n : it->second) {
    auto h = c10::Dispatcher::singleton().findSchema(n);
    if (!h || !h->hasSchema()) continue;
    const c10::FunctionSchema& f = h->schema();
    if (!out_arguments(f).empty() || f.arguments().size() + outs.size() != o.size() ||
        f.returns().size() != outs.size())
      continue;
    bool same = true;
    for (size_t i = 0, j = 0; same && i < o.size(); ++i) {
      if (std::find(outs.begin(), outs.end(), i) != outs.end()) continue;
      const c10::Argument& a = f.arguments()[j++];
      // Written in both or in neither: rrelu_with_noise writes its noise in both overloads
      // (libtorch 2.x); that write is checked as for any written input of the functional.
      const bool written = a.alias_info() && a.alias_info()->isWrite();
      same = a.name() == o[i].name() && a.type()->str() == o[i].type()->str() &&
             written == (o[i].alias_info() && o[i].alias_info()->isWrite());
    }
    for (size_t k = 0; same && k < outs.size(); ++k)
      same = f.returns()[k].type()->str() == o[outs[k]].type()->str();
    if (!same) continue;
    const Entry* e = find_rule(n.overload_name.empty() ? n.name : n.name + "." + n.overload_name);
    return e != nullptr && plain_placement_rule(*e) ? e : nullptr;
  }
  return nullptr;
}

// A rule for a name without an exact registration (resolved once per name).
const Entry* resolve_rule(const std::string& name) {
  auto& r = rules();
  const auto dot = name.find('.');
  if (dot == std::string::npos) return nullptr;
  auto h = c10::Dispatcher::singleton().findSchema({name.substr(0, dot), name.substr(dot + 1)});
  if (h && h->hasSchema()) {
    const std::vector<size_t> outs = out_arguments(h->schema());
    // An out= overload takes its functional overload's rule, never the bare name's (which may
    // be another overload's: aten::max is a reduction, aten::max.out the elementwise max).
    if (!outs.empty()) return out_overload_rule(h->schema(), outs);
  }
  if (named_tensor_overload(name.substr(dot + 1))) return nullptr;
  auto it = r.find(name.substr(0, dot));
  return it == r.end() ? nullptr : &it->second;
}

const Entry* find_rule(const std::string& name) {
  auto& r = rules();
  auto it = r.find(name);
  if (it != r.end()) return &it->second;
  Resolved& cache = resolved();
  {
    std::lock_guard<std::mutex> lk(cache.mu);
    auto found = cache.map.find(name);
    if (found != cache.map.end()) return found->second;
  }
  const Entry* e = resolve_rule(name);  // may recurse into find_rule (not under the lock)
  std::lock_guard<std::mutex> lk(cache.mu);
  cache.map.emplace(name, e);
  return e;
}

std::string describe_inputs(const OpCall& c) {
  std::ostringstream os;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    os << (i ? ", " : "") << to_string(c.inputs[i]->placements) << c10::IntArrayRef(c.inputs[i]->tensor_meta.shape);
  return os.str();
}
}  // namespace

void register_rule(const std::string& op, Rule rule, LocalArgRewrite rewrite, RuleOptions options) {
  rules()[op] = Entry{std::move(rule), std::move(rewrite), options};
  std::lock_guard<std::mutex> lk(resolved().mu);
  resolved().map.clear();
}

bool has_rule(const std::string& op) { return find_rule(op) != nullptr; }

std::vector<std::string> ops_with_rules() {
  std::vector<std::string> out;
  for (auto& kv : rules()) out.push_back(kv.first);
  std::sort(out.begin(), out.end());
  return out;
}

double redistribute_cost(const DTensorSpec& from, const std::vector<Placement>& to) {
  int64_t numel = 1;
  for (auto s : from.tensor_meta.shape) numel *= s;
  const double bytes = static_cast<double>(numel) * c10::elementSize(from.tensor_meta.dtype) /
                       std::max<int64_t>(1, from.num_shards());
  double cost = 0;
  for (size_t i = 0; i < to.size(); ++i) {
    const Placement& a = from.placements[i];
    const Placement& b = to[i];
    if (a == b) continue;
    const double k = static_cast<double>(from.mesh.size(static_cast<int64_t>(i)));
    if (is_replicate(a) && is_shard(b)) cost += 1;              // local chunk
    else if (is_replicate(a) && is_partial(b)) cost += 1;       // local
    else if (is_shard(a) && is_replicate(b)) cost += bytes * k;  // all_gather
    else if (is_partial(a) && is_replicate(b)) cost += 2 * bytes;  // all_reduce
    else if (is_partial(a) && is_shard(b)) cost += bytes;       // reduce_scatter
    else if (is_shard(a) && is_shard(b)) cost += 2 * bytes * k;  // gather + chunk
    else cost += 4 * bytes * k + 1;                              // via Replicate
  }
  return cost;
}

namespace {
OutputSharding propagate_plain(OpCall& call, const std::function<std::vector<TensorMeta>()>& infer_meta);

bool has_strided(const DTensorSpec& s) {
  return std::any_of(s.placements.begin(), s.placements.end(), [](const Placement& p) { return is_strided_shard(p); });
}

// NOTE: [Ops on strided shards]
// Rules know Shard, not StridedShard (NOTE: [Strided shards] in placement.h). A strided layout
// differs from the plain one (same placements, split_factor 1) in WHICH box each rank holds --
// and, on an uneven split over a mesh that is not square, in the boxes' shapes (which ranks
// hold none) -- so an op whose local computation does not depend on that may run on it
// unchanged: when every DTensor input is either the strided tensor's layout (same placements
// and shape) or fully replicated, the op is propagated as if the strided inputs were plain,
// and the result is kept if it redistributes nothing, is not random, has no local kernel or
// argument rewrite (those read offsets or local sizes of the plain layout), and gives every
// output either the plain layout with the input's shape (relabelled strided) or, where the
// boxes' shapes are the plain layout's, no Shard at all (Replicate / Partial: the boxes still
// partition the tensor). Optimizer steps, pointwise ops, *_like and full reductions thus keep
// the layout with no communication, and in-place ops on a strided DTensor work. Anything else
// propagates with the strided specs as they are, so the inputs are redistributed to what the
// rule asks for.
//
// Whether every rank's box under `strided` has the shape it has under `plain`. Not on uneven
// splits over a mesh that is not square: 8 rows on a (3, 2) mesh are 3, 3, 2 rows split in two
// under (Shard(0), Shard(0)), but 4, 4 split in three -- one rank holding none -- under
// (StridedShard(0, 2), Shard(0)), and a rule reducing to Partial(max) where no plain shard is
// empty would have a rank take the max of nothing.
bool same_local_shapes(const DTensorSpec& strided, const std::vector<Placement>& plain) {
  const std::vector<int64_t> mesh_shape = strided.mesh.shape();
  std::vector<int64_t> coord(mesh_shape.size(), 0);
  for (;;) {
    if (compute_local_shape_and_global_offset(strided.tensor_meta.shape, mesh_shape, strided.placements, coord).first !=
        compute_local_shape_and_global_offset(strided.tensor_meta.shape, mesh_shape, plain, coord).first)
      return false;
    size_t m = mesh_shape.size();
    while (m > 0 && ++coord[m - 1] == mesh_shape[m - 1]) coord[--m] = 0;
    if (m == 0) return true;
  }
}

std::optional<OutputSharding> propagate_relabelled(OpCall& call,
                                                   const std::function<std::vector<TensorMeta>()>& infer_meta) {
  const DTensorSpec* strided = nullptr;
  for (auto* s : call.inputs)
    if (has_strided(*s)) strided = s;
  if (strided == nullptr) return std::nullopt;
  for (auto* s : call.inputs)
    if (!(s->placements == strided->placements && s->tensor_meta.shape == strided->tensor_meta.shape) &&
        !s->is_replicated())
      return std::nullopt;
  std::vector<Placement> plain = strided->placements;
  for (auto& p : plain)
    if (auto* sh = std::get_if<Shard>(&p)) sh->split_factor = 1;
  auto relabel = [&](const DTensorSpec& s) {
    return s.placements == strided->placements ? DTensorSpec(s.mesh, plain, s.tensor_meta) : s;
  };
  OpCall relabelled = call;
  relabelled.inputs.clear();
  for (auto& a : relabelled.args) {
    if (a.kind == ArgInfo::Kind::kDTensor) a.spec = relabel(*a.spec);
    for (auto& l : a.list) l = relabel(l);
  }
  for (auto& a : relabelled.args) {
    if (a.kind == ArgInfo::Kind::kDTensor) relabelled.inputs.push_back(&*a.spec);
    for (auto& l : a.list) relabelled.inputs.push_back(&l);
  }
  if (relabelled.inputs.size() != call.inputs.size()) return std::nullopt;
  OutputSharding r = propagate_plain(relabelled, infer_meta);
  call.output_meta = relabelled.output_meta;
  if (r.random || r.kernel || r.rewrite || r.replicate_fallback || r.output_shape_from_local || r.inplace_view)
    return std::nullopt;
  for (size_t j = 0; j < call.inputs.size(); ++j)
    if (r.inputs[j] != relabelled.inputs[j]->placements) return std::nullopt;
  for (size_t k = 0; k < r.outputs.size(); ++k) {
    const bool keeps = r.outputs[k] == plain && r.output_meta[k].shape == strided->tensor_meta.shape;
    const bool unsharded = std::none_of(r.outputs[k].begin(), r.outputs[k].end(), [](const Placement& p) { return is_shard(p); });
    // Asked only of an output that does not keep the layout: a walk over the whole mesh.
    if (!keeps && (!unsharded || !same_local_shapes(*strided, plain))) return std::nullopt;
    if (keeps) r.outputs[k] = strided->placements;
  }
  for (size_t j = 0; j < call.inputs.size(); ++j) r.inputs[j] = call.inputs[j]->placements;
  return r;
}
}  // namespace

OutputSharding propagate(OpCall& call, const std::function<std::vector<TensorMeta>()>& infer_meta) {
  if (auto r = propagate_relabelled(call, infer_meta)) return *r;
  return propagate_plain(call, infer_meta);
}

namespace {
// The propagation cache's key of a call (NOTE: [Propagation cache keys are exact]).
std::string cache_key(const OpCall& call, const Entry* entry) {
  CacheKey k;
  k.put_str(call.name);
  k.put(static_cast<int64_t>(call.inputs.size()));
  for (auto* s : call.inputs) k.put_spec(*s);
  k.put(static_cast<int64_t>(call.args.size()));
  for (auto& a : call.args) {
    k.put(static_cast<int64_t>(a.kind));
    if (a.kind == ArgInfo::Kind::kOther) k.put_value(a.value);
    if (a.kind == ArgInfo::Kind::kDTensorList) {  // where the None entries of a Tensor?[] are
      k.put(a.list_size);
      k.put_ints(a.list_index);
    }
  }
  if (entry == nullptr) k.put(int64_t{t_replicate_fallback ? 1 : 0});
  k.put(int64_t{call.written_keeps_layout ? 1 : 0});
  return std::move(k.bytes);
}

// NOTE: [Replicate fallback]: every input and output Replicate.
OutputSharding replicate_fallback_sharding(const OpCall& call) {
  OutputSharding fb;
  const std::vector<Placement> rep(static_cast<size_t>(call.mesh->ndim()), Replicate{});
  fb.inputs.assign(call.inputs.size(), rep);
  fb.outputs.assign(call.output_meta.size(), rep);
  fb.output_meta = call.output_meta;
  fb.replicate_fallback = true;
  std::vector<size_t> written = out_inputs(call);
  if (call.written_input >= 0) written.push_back(static_cast<size_t>(call.written_input));
  written.insert(written.end(), call.written_list_inputs.begin(), call.written_list_inputs.end());
  for (size_t j : written) {
    const DTensorSpec& w = *call.inputs[j];
    TORCH_CHECK(w.placements == rep, "DTensor: operator ", call.name,
                " has no sharding rule, and the replicate fallback cannot write into a DTensor with placements ",
                to_string(w.placements), "; redistribute it to Replicate first");
  }
  for (size_t j = 0; j < call.inputs.size(); ++j) fb.cost += redistribute_cost(*call.inputs[j], rep);
  return fb;
}

// NOTE: [Rules of functional ops serve their out= overloads]
// A rule registered as "aten::x" also serves "aten::x.out" and the like, whose out= tensors
// are extra DTensor inputs its options do not list: each takes the placement of the output
// it receives (the k-th out= argument is the k-th output).
void fit_options_to_call(const OpCall& call, const std::vector<size_t>& outs, std::vector<DimOption>& options) {
  const size_t n_in = call.inputs.size();
  const size_t n_out = options[0].outputs.size();
  for (auto& o : options) {
    if (outs.empty() || o.inputs.size() + outs.size() != n_in) continue;
    std::vector<Placement> full;
    size_t operand = 0;
    for (size_t j = 0; j < n_in; ++j) {
      const auto it = std::find(outs.begin(), outs.end(), j);
      if (it == outs.end()) {
        full.push_back(o.inputs[operand++]);
      } else {
        const auto k = static_cast<size_t>(it - outs.begin());
        TORCH_CHECK(k < o.outputs.size(), "DTensor: ", call.name, " writes ", outs.size(),
                    " out= tensors but its rule describes ", o.outputs.size(), " outputs");
        full.push_back(o.outputs[k]);
      }
    }
    o.inputs = std::move(full);
  }
  for (auto& o : options)
    TORCH_CHECK(o.inputs.size() == n_in && o.outputs.size() == n_out, "DTensor: the sharding rule of ", call.name,
                " gave an option for ", o.inputs.size(), " DTensor inputs and ", o.outputs.size(),
                " outputs, but the call has ", n_in, " and ", n_out,
                " (a rule registered for the functional op does not fit this overload; register one for it)");
}

// Whether `cand` may run: what an op writes keeps its layout, and the rule's own check.
bool valid_strategy(const OpCall& call, const Entry& entry, const std::vector<size_t>& outs,
                    const OutputSharding& cand) {
  bool valid = true;
  const size_t n_out = cand.outputs.size();
  if (!outs.empty()) {
    // An out= op writes each out= tensor in place: every one keeps its placements and
    // receives the output of its position (several for max.dim_max, sort.values, ...).
    for (size_t k = 0; k < outs.size() && valid; ++k)
      valid = k < n_out && cand.inputs[outs[k]] == call.inputs[outs[k]]->placements &&
              cand.outputs[k] == cand.inputs[outs[k]];
  } else if (call.written_input >= 0) {
    // An in-place or out= op cannot change the layout of the tensor it writes.
    const size_t w = static_cast<size_t>(call.written_input);
    // (An in-place view changes the shape, so its placements may move to other dims.)
    // NOTE: [In-place indexing may re-lay out what it writes]
    valid = ((entry.options.relayout_written && !call.written_keeps_layout) ||
             cand.inputs[w] == call.inputs[w]->placements) &&
            n_out > 0 &&
            (entry.options.inplace_view || cand.outputs[0] == cand.inputs[w]);
  }
  // NOTE: [In-place list ops]: every written element keeps its layout.
  for (size_t j : call.written_list_inputs) valid = valid && cand.inputs[j] == call.inputs[j]->placements;
  if (valid && entry.options.valid) valid = entry.options.valid(call, cand.inputs, cand.outputs);
  return valid;
}

// Every combination of the single-dim options over the mesh dims; the valid one that moves the
// fewest bytes (cost infinity when none is valid).
OutputSharding cheapest_strategy(const OpCall& call, const Entry& entry, const std::vector<DimOption>& options,
                                 const std::vector<size_t>& outs) {
  const int64_t m = call.mesh->ndim();
  const size_t n_in = call.inputs.size();
  const size_t n_out = options[0].outputs.size();
  std::vector<size_t> idx(static_cast<size_t>(m), 0);
  OutputSharding best;
  best.cost = std::numeric_limits<double>::infinity();
  for (;;) {
    OutputSharding cand;
    cand.inputs.assign(n_in, std::vector<Placement>(static_cast<size_t>(m)));
    cand.outputs.assign(n_out, std::vector<Placement>(static_cast<size_t>(m)));
    for (int64_t d = 0; d < m; ++d) {
      const DimOption& o = options[idx[d]];
      for (size_t j = 0; j < n_in; ++j) cand.inputs[j][d] = o.inputs[j];
      for (size_t j = 0; j < n_out; ++j) cand.outputs[j][d] = o.outputs[j];
    }
    if (valid_strategy(call, entry, outs, cand)) {
      double cost = 0;
      for (size_t j = 0; j < n_in; ++j) cost += redistribute_cost(*call.inputs[j], cand.inputs[j]);
      if (cost < best.cost) {
        best = std::move(cand);
        best.cost = cost;
      }
    }
    int64_t d = m - 1;
    while (d >= 0 && ++idx[d] == options.size()) idx[d--] = 0;
    if (d < 0) break;
  }
  return best;
}

OutputSharding propagate_plain(OpCall& call, const std::function<std::vector<TensorMeta>()>& infer_meta) {
  // 1. Cache lookup.
  const Entry* entry = find_rule(call.name);
  std::string key = cache_key(call, entry);
  if (auto hit = PropagationCache::instance().find(key)) return std::move(*hit);
  // 2. The rule's single-dim options (or NOTE: [Replicate fallback]).
  TORCH_CHECK(entry != nullptr || t_replicate_fallback, "DTensor: operator ", call.name,
              " has no sharding rule (inputs: ", describe_inputs(call), " on ",
              call.mesh->to_string(),
              "). Call full_tensor() and run it on plain tensors, add a rule in dtensor/ops, or run it "
              "inside a dtensor::ops::ReplicateFallbackGuard");
  call.output_meta = infer_meta();
  if (entry == nullptr) {
    OutputSharding fb = replicate_fallback_sharding(call);
    PropagationCache::instance().insert(std::move(key), fb);
    return fb;
  }
  std::vector<DimOption> options = entry->rule(call);
  TORCH_CHECK(!options.empty(), "DTensor: the rule of ", call.name, " gave no strategy for inputs ",
              describe_inputs(call));
  // 3. Expand over mesh dims, price, choose.
  const std::vector<size_t> outs = out_inputs(call);
  fit_options_to_call(call, outs, options);
  OutputSharding best = cheapest_strategy(call, *entry, options, outs);
  TORCH_CHECK(best.cost < std::numeric_limits<double>::infinity(), "DTensor: no valid sharding for ",
              call.name, " with inputs ", describe_inputs(call),
              call.written_input >= 0 || !outs.empty() || !call.written_list_inputs.empty()
                  ? " (an in-place op keeps the placements of the tensor it writes; "
                             "redistribute that tensor first)"
                           : "");
  best.rewrite = entry->rewrite;
  best.output_shape_from_local =
      entry->options.output_shape_from_local ||
      (entry->options.output_shape_from_local_if && entry->options.output_shape_from_local_if(call));
  best.inplace_view = entry->options.inplace_view;
  best.relayout_written = entry->options.relayout_written;
  best.random = entry->options.random;
  best.kernel = entry->options.kernel;
  if (best.output_shape_from_local)
    for (const auto& out : best.outputs)
      for (const auto& p : out)
        TORCH_INTERNAL_ASSERT(is_replicate(p), "rule of ", call.name,
                              " has data-dependent output shapes but chose a non-Replicate output");
  best.output_meta = call.output_meta;
  PropagationCache::instance().insert(std::move(key), best);
  return best;
}
}  // namespace

std::optional<StrategyQuery> query_strategies(OpCall& call,
                                              const std::function<std::vector<TensorMeta>()>& infer_meta) {
  const Entry* entry = find_rule(call.name);
  if (entry == nullptr) return std::nullopt;
  call.output_meta = infer_meta();
  StrategyQuery q;
  q.options = entry->rule(call);
  if (q.options.empty()) return q;
  const std::vector<size_t> outs = out_inputs(call);
  fit_options_to_call(call, outs, q.options);
  const size_t m = static_cast<size_t>(call.mesh->ndim());
  for (const DimOption& o : q.options) {
    OutputSharding every_dim;
    for (const auto& p : o.inputs) every_dim.inputs.emplace_back(m, p);
    for (const auto& p : o.outputs) every_dim.outputs.emplace_back(m, p);
    q.runnable.push_back(valid_strategy(call, *entry, outs, every_dim));
  }
  q.chosen = cheapest_strategy(call, *entry, q.options, outs);
  q.chosen.output_meta = call.output_meta;
  try {
    q.relabelled = propagate_relabelled(call, infer_meta);
  } catch (const c10::Error&) {
    // No valid strategy for the relabelled call (an in-place op whose written tensor could not
    // keep its layout): propagate() raises, as `chosen` would have it for such a call.
  }
  q.has_kernel = static_cast<bool>(entry->options.kernel);
  q.has_rewrite = static_cast<bool>(entry->rewrite);
  q.random = entry->options.random;
  return q;
}

ReplicateFallbackGuard::ReplicateFallbackGuard() : prev_(t_replicate_fallback) { t_replicate_fallback = true; }
ReplicateFallbackGuard::~ReplicateFallbackGuard() { t_replicate_fallback = prev_; }
bool replicate_fallback_enabled() { return t_replicate_fallback; }
int64_t replicate_fallback_uses() { return t_replicate_fallback_uses; }
void note_replicate_fallback_use() { ++t_replicate_fallback_uses; }

int64_t broadcast_input_dim(const std::vector<int64_t>& in_shape, const std::vector<int64_t>& out_shape,
                            int64_t out_dim) {
  const int64_t offset = static_cast<int64_t>(out_shape.size()) - static_cast<int64_t>(in_shape.size());
  const int64_t a = out_dim - offset;
  if (a < 0) return -1;
  if (in_shape[a] == 1 && out_shape[out_dim] != 1) return -1;
  return a;
}

std::vector<size_t> out_arguments(const c10::FunctionSchema& schema) {
  std::vector<size_t> out;
  const auto& formals = schema.arguments();
  for (size_t i = 0; i < formals.size(); ++i)
    if (formals[i].kwarg_only() && formals[i].alias_info() && formals[i].alias_info()->isWrite()) out.push_back(i);
  return out;
}

std::vector<size_t> out_inputs(const OpCall& c) {
  std::vector<size_t> out;
  size_t pos = 0;
  for (size_t i = 0; i < c.args.size(); ++i) {
    const auto& a = c.args[i];
    const size_t n = a.kind == ArgInfo::Kind::kDTensor ? 1 : a.kind == ArgInfo::Kind::kDTensorList ? a.list.size() : 0;
    const auto& formal = c.schema->arguments()[i];
    if (formal.kwarg_only() && formal.alias_info() && formal.alias_info()->isWrite())
      for (size_t k = 0; k < n; ++k) out.push_back(pos + k);
    pos += n;
  }
  return out;
}

int64_t arg_int(const OpCall& c, size_t i, int64_t fallback) {
  if (i >= c.args.size() || c.args[i].kind != ArgInfo::Kind::kOther) return fallback;
  const auto& v = c.args[i].value;
  return v.isInt() ? v.toInt() : fallback;
}

std::vector<int64_t> arg_int_list(const OpCall& c, size_t i) {
  if (i >= c.args.size() || c.args[i].kind != ArgInfo::Kind::kOther) return {};
  const auto& v = c.args[i].value;
  if (v.isIntList()) return v.toIntVector();
  if (v.isInt()) return {v.toInt()};
  return {};
}

bool arg_bool(const OpCall& c, size_t i, bool fallback) {
  if (i >= c.args.size() || c.args[i].kind != ArgInfo::Kind::kOther) return fallback;
  const auto& v = c.args[i].value;
  return v.isBool() ? v.toBool() : fallback;
}

std::vector<Placement> inputs_by_arg(const OpCall& c, const std::function<Placement(size_t arg)>& by_arg) {
  std::vector<Placement> out;
  for (size_t i = 0; i < c.args.size(); ++i) {
    if (c.args[i].kind == ArgInfo::Kind::kDTensor) out.push_back(by_arg(i));
    else if (c.args[i].kind == ArgInfo::Kind::kDTensorList)
      for (size_t k = 0; k < c.args[i].list.size(); ++k) out.push_back(by_arg(i));
  }
  return out;
}

}  // namespace ops
}  // namespace dtensor
