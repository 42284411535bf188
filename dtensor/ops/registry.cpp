// dtensor/ops/registry.cpp: rule registry, strategy expansion, costs and the propagation cache.
#include "dtensor/ops/registry.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <c10/util/hash.h>

#include <limits>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace dtensor {
namespace ops {

namespace {
struct Entry {
  Rule rule;
  LocalArgRewrite rewrite;
  LocalKernel kernel;
};
std::unordered_map<std::string, Entry>& rules() {
  static std::unordered_map<std::string, Entry> r;
  return r;
}
std::mutex g_cache_mu;
std::unordered_map<size_t, OutputSharding> g_cache;
CacheStats g_stats;

size_t combine(size_t a, size_t b) { return c10::hash_combine(a, b); }

size_t ivalue_hash(const c10::IValue& v) {
  if (v.isNone()) return 0x9e37;
  if (v.isInt()) return std::hash<int64_t>()(v.toInt());
  if (v.isBool()) return std::hash<bool>()(v.toBool()) + 7;
  if (v.isDouble()) return std::hash<double>()(v.toDouble());
  if (v.isIntList()) {
    size_t h = 0x1234;
    for (auto x : v.toIntVector()) h = combine(h, std::hash<int64_t>()(x));
    return h;
  }
  if (v.isTensor()) {  // plain tensor argument (0-dim): its shape and dtype matter, not values
    const auto& t = v.toTensor();
    if (!t.defined()) return 0x77;
    size_t h = std::hash<int>()(static_cast<int>(t.scalar_type()));
    for (auto s : t.sizes()) h = combine(h, std::hash<int64_t>()(s));
    return h;
  }
  std::ostringstream os;
  os << v;
  return std::hash<std::string>()(os.str());
}

const Entry* find_rule(const std::string& name) {
  auto& r = rules();
  auto it = r.find(name);
  if (it != r.end()) return &it->second;
  auto dot = name.find('.');
  if (dot != std::string::npos) {
    it = r.find(name.substr(0, dot));
    if (it != r.end()) return &it->second;
  }
  return nullptr;
}

std::string describe_inputs(const OpCall& c) {
  std::ostringstream os;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    os << (i ? ", " : "") << to_string(c.inputs[i]->placements) << c10::IntArrayRef(c.inputs[i]->tensor_meta.shape);
  return os.str();
}
}  // namespace

void register_rule(const std::string& op, Rule rule, LocalArgRewrite rewrite, LocalKernel kernel) {
  rules()[op] = Entry{std::move(rule), std::move(rewrite), std::move(kernel)};
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

OutputSharding propagate(OpCall& call, const std::function<std::vector<TensorMeta>()>& infer_meta) {
  // 1. Cache lookup.
  size_t key = std::hash<std::string>()(call.name);
  for (auto* s : call.inputs) key = combine(key, hash_value(*s));
  for (auto& a : call.args)
    if (a.kind == ArgInfo::Kind::kOther) key = combine(key, ivalue_hash(a.value));
  {
    std::lock_guard<std::mutex> lk(g_cache_mu);
    auto it = g_cache.find(key);
    if (it != g_cache.end()) {
      ++g_stats.hits;
      return it->second;
    }
    ++g_stats.misses;
  }
  // 2. The rule's single-dim options.
  const Entry* entry = find_rule(call.name);
  TORCH_CHECK(entry != nullptr, "DTensor: operator ", call.name,
              " has no sharding rule (inputs: ", describe_inputs(call), " on ",
              call.mesh->to_string(),
              "). Call full_tensor() and run it on plain tensors, or add a rule in dtensor/ops");
  call.output_meta = infer_meta();
  std::vector<DimOption> options = entry->rule(call);
  TORCH_CHECK(!options.empty(), "DTensor: the rule of ", call.name, " gave no strategy for inputs ",
              describe_inputs(call));
  // 3. Expand over mesh dims, price, choose.
  const int64_t m = call.mesh->ndim();
  const size_t n_in = call.inputs.size();
  const size_t n_out = options[0].outputs.size();
  for (auto& o : options)
    TORCH_INTERNAL_ASSERT(o.inputs.size() == n_in && o.outputs.size() == n_out, "rule of ", call.name,
                          " gave an option with ", o.inputs.size(), " inputs and ", o.outputs.size(),
                          " outputs; expected ", n_in, " and ", n_out);
  std::vector<size_t> idx(static_cast<size_t>(m), 0);
  OutputSharding best;
  double best_cost = std::numeric_limits<double>::infinity();
  for (;;) {
    OutputSharding cand;
    cand.inputs.assign(n_in, std::vector<Placement>(static_cast<size_t>(m)));
    cand.outputs.assign(n_out, std::vector<Placement>(static_cast<size_t>(m)));
    for (int64_t d = 0; d < m; ++d) {
      const DimOption& o = options[idx[d]];
      for (size_t j = 0; j < n_in; ++j) cand.inputs[j][d] = o.inputs[j];
      for (size_t j = 0; j < n_out; ++j) cand.outputs[j][d] = o.outputs[j];
    }
    bool valid = true;
    if (call.written_input >= 0) {
      // An in-place or out= op cannot change the layout of the tensor it writes.
      const size_t w = static_cast<size_t>(call.written_input);
      valid = cand.inputs[w] == call.inputs[w]->placements && n_out > 0 && cand.outputs[0] == cand.inputs[w];
    }
    if (valid) {
      double cost = 0;
      for (size_t j = 0; j < n_in; ++j) cost += redistribute_cost(*call.inputs[j], cand.inputs[j]);
      if (cost < best_cost) {
        best_cost = cost;
        best = std::move(cand);
      }
    }
    int64_t d = m - 1;
    while (d >= 0 && ++idx[d] == options.size()) idx[d--] = 0;
    if (d < 0) break;
  }
  TORCH_CHECK(best_cost < std::numeric_limits<double>::infinity(), "DTensor: no valid sharding for ",
              call.name, " with inputs ", describe_inputs(call),
              call.written_input >= 0 ? " (an in-place op keeps the placements of the tensor it writes; "
                             "redistribute that tensor first)"
                           : "");
  best.cost = best_cost;
  best.rewrite = entry->rewrite;
  best.kernel = entry->kernel;
  best.output_meta = call.output_meta;
  std::lock_guard<std::mutex> lk(g_cache_mu);
  g_cache.emplace(key, best);
  return best;
}

CacheStats propagation_cache_stats() {
  std::lock_guard<std::mutex> lk(g_cache_mu);
  return g_stats;
}

void clear_propagation_cache() {
  std::lock_guard<std::mutex> lk(g_cache_mu);
  g_cache.clear();
  g_stats = {};
}

int64_t broadcast_input_dim(const std::vector<int64_t>& in_shape, const std::vector<int64_t>& out_shape,
                            int64_t out_dim) {
  const int64_t offset = static_cast<int64_t>(out_shape.size()) - static_cast<int64_t>(in_shape.size());
  const int64_t a = out_dim - offset;
  if (a < 0) return -1;
  if (in_shape[a] == 1 && out_shape[out_dim] != 1) return -1;
  return a;
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
