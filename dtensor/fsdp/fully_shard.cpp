// dtensor/fsdp/fully_shard.cpp: FSDP2's fully_shard and FSDPModule, and the registry of states
// (NOTE: [FSDP state registry]). The state is in fsdp_state.cpp, the hooks in fsdp_hooks.cpp.
#include "dtensor/fsdp/fully_shard.h"

#include "dtensor/comm/group.h"
#include "dtensor/fsdp/fsdp_state_internal.h"
#include "dtensor/nn/hooks.h"
#include "dtensor/nn/module_surgery.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"
#include "dtensor/utils/storage.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <functional>
#include <mutex>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace dtensor {
namespace fsdp {

StateRegistry& StateRegistry::instance() {
  static StateRegistry registry;
  return registry;
}

std::shared_ptr<FSDPState> StateRegistry::lookup(const torch::nn::Module& module) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_module_.find(&module);
  if (it == by_module_.end()) return nullptr;
  auto state = it->second.lock();
  if (!state || !state->is_group_module(&module)) return nullptr;
  return state;
}

std::vector<std::shared_ptr<FSDPState>> StateRegistry::live() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::shared_ptr<FSDPState>> out;
  for (const auto& kv : by_module_) {
    if (auto s = kv.second.lock()) out.push_back(s);
  }
  return out;
}

int64_t StateRegistry::add(const torch::nn::Module& module, const std::shared_ptr<FSDPState>& state) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = by_module_.begin(); it != by_module_.end();) it = it->second.expired() ? by_module_.erase(it) : std::next(it);
  for (auto it = by_id_.begin(); it != by_id_.end();) it = it->second.expired() ? by_id_.erase(it) : std::next(it);
  by_module_[&module] = state;
  const int64_t id = next_id_++;
  by_id_[id] = state;
  return id;
}

std::shared_ptr<FSDPState> StateRegistry::by_id(int64_t id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : it->second.lock();
}

// NOTE: [FSDP over tensor-parallel parameters]
// A parameter that is already a DTensor on a 1-D tensor-parallel mesh (parallelize_module on
// mesh["tp"]) is sharded by fully_shard on mesh["dp"] like PyTorch's FSDP2
// (_fsdp_param.py, _init_sharding_spec_tp) with the transforms of FSDP1's DTensorExtensions (tensor/parallel/fsdp.py):
//   1. pre_flatten_transform (the FSDP extension's, NOTE: [FSDP extensions]): the parameter's
//      local (TP) tensor and its spec (the param extension). FSDP chunks, pads, all-gathers and
//      reduce-scatters that local tensor over the dp group exactly as it does a plain parameter
//      (NOTE: [FSDP parameter layout]); the TP collectives of forward and backward are untouched.
//   2. The sharded parameter is a DTensor on the PARENT mesh of the dp and tp meshes (both must
//      be sliced from it, dp dims first) with placements (<FSDP placement>, <TP placement>)
//      (HSDP: (Replicate(), <FSDP placement>, <TP placement>)). The FSDP mesh may also be the
//      root's leading dims flattened into one (root[{"dp", "cp"}]._flatten("dp_cp"), torchtitan's
//      FSDP x CP): the parent is then root[{"dp_cp", "tp"}]. The FSDP placement is Shard(d),
//      or _StridedShard(d, split_factor) when tp also shards dim d (split_factor: the tp mesh
//      size), since the dim is then split by tp FIRST and by dp second, the reverse of what
//      (Shard(d), Shard(d)) means. Its full_tensor() is the original parameter.
//   3. post_unflatten_transform (the extension's): the unsharded parameter is the TP DTensor over
//      the unsharded local tensor, made at the first all-gather without autograd history (PyTorch
//      FSDP2's _from_local_no_grad) and kept: a leaf sharing the local's storage, which each
//      later all-gather fills (FSDP2 reuses its _unsharded_param the same way; FSDP1 calls the
//      transform at every unshard because it rebuilds its views each time). It is swapped into
//      the modules while unsharded. Its gradient is a DTensor: redistributed to the TP
//      placements (a Partial gradient is reduced over tp, as PyTorch's _get_grad_inner_tensor),
//      its local tensor takes the plain reduce-scatter path.
//
// NOTE: [FSDP extensions]
// fully_shard resolves the extension once (FullyShardOptions::extensions, else
// set_fsdp_extensions's, else DTensorExtensions when the FSDP mesh was sliced from a larger
// mesh, PyTorch's _init_extension; else none) and keeps it in the state. Its call points:
// pre_flatten_transform for every parameter at fully_shard; post_unflatten_transform once per
// DTensor parameter, at its first all-gather; all_gather_dtensor for each 2-D parameter in
// full_state_dict / unsharded_state_dict / sharded_tensor_state_dict; chunk_dtensor when
// load_state_dict lifts a TP DTensor to the parent mesh; chunk_tensor in
// sharded_tensor_state_dict and pre_load_state_dict_transform in load_sharded_tensor_state_dict
// (FSDP1's SHARDED_STATE_DICT form). A custom extension must return, from pre_flatten_transform,
// a plain local tensor and the DTensorSpec it is the local tensor of (or none for a plain
// tensor), and from post_unflatten_transform a tensor over the storage it was given.

// ---- fully_shard --------------------------------------------------------------------------

namespace {

[[noreturn]] void fail(const torch::nn::Module& module, const std::string& what) {
  TORCH_CHECK(false, "fully_shard(", module_type(module), "): ", what);
}

std::string dims_to_string(const std::vector<int64_t>& dims) {
  std::ostringstream os;
  os << c10::IntArrayRef(dims);
  return os.str();
}

// The placements of a tensor-parallel parameter sharded by FSDP on `parent` (the mesh of the
// FSDP and tensor-parallel dims, FSDP's first), or an error naming what is not supported.
TPSharding tp_layout(const torch::nn::Module& module, const std::string& what, const DTensorSpec& spec,
                     const DeviceMesh& parent, int64_t shard_dim, bool hsdp) {
  const Placement& tp_placement = spec.placements[0];
  if (is_partial(tp_placement)) {
    fail(module, what + "a Partial parameter cannot be sharded; redistribute it to Shard or Replicate first");
  }
  if (!is_shard(tp_placement) && !is_replicate(tp_placement)) {
    fail(module, what + "FSDP shards parameters whose tensor-parallel placement is Shard or Replicate, not " +
                     to_string(tp_placement));
  }
  // Tensor parallelism splits shard_dim first: dp then splits each tp piece (PyTorch's
  // split_factor = num_shards_map[shard_dim]).
  const int64_t split_factor = is_shard(tp_placement, shard_dim) ? spec.mesh.size(0) : 1;
  const Placement fsdp_placement = StridedShard(shard_dim, split_factor);  // a plain Shard when 1
  TPSharding out{spec, parent, {}};
  if (hsdp) out.spmd_placements.push_back(Replicate{});
  out.spmd_placements.push_back(fsdp_placement);
  out.spmd_placements.push_back(tp_placement);
  return out;
}

// An FSDP mesh made by _flatten of the root's leading dims (root[{"dp", "cp"}]._flatten(), as
// torchtitan shards over "dp_shard_cp") with the tensor-parallel mesh the root's last dim: the
// 2-D mesh root[{<flattened name>, <tp name>}] the parameters then live on. nullopt for any
// other FSDP mesh.
std::optional<DeviceMesh> flattened_dp_mesh(const DeviceMesh& dp_mesh, const DeviceMesh& root, const DeviceMesh& tp) {
  if (dp_mesh.ndim() != 1 || !dp_mesh.get_parent_mesh_dims().empty() || root.get_parent_mesh()) return std::nullopt;
  const auto& tp_dims = tp.get_parent_mesh_dims();
  if (tp.ndim() != 1 || tp_dims.size() != 1 || tp_dims[0] != root.ndim() - 1) return std::nullopt;
  if (dp_mesh.size() * tp.size() != root.size() || dp_mesh.mesh_dim_names().empty()) return std::nullopt;
  try {
    return root[{dp_mesh.mesh_dim_names()[0], tp.mesh_dim_names()[0]}];
  } catch (const c10::Error&) {
    return std::nullopt;  // not a flattened dim of the root, or not before the tp dim
  }
}

// The layout of a tensor-parallel parameter (NOTE: [FSDP over tensor-parallel parameters]),
// or an error naming the parameter, the meshes and what would work.
TPSharding tp_sharding(const torch::nn::Module& module, const std::string& fqn, const DeviceMesh& dp_mesh,
                       const DTensorSpec& spec, int64_t shard_dim) {
  const std::string what = "parameter '" + fqn + "' is a DTensor " + to_string(spec.placements) + " on " +
                           spec.mesh.to_string() + " and the FSDP mesh is " + dp_mesh.to_string() + ": ";
  const std::string how = " (slice both from one mesh: mesh = init_device_mesh(\"cpu\", {dp, tp}, {\"dp\", \"tp\"}); "
                          "parallelize on mesh[\"tp\"], fully_shard on mesh[\"dp\"]; or, with context parallel, fully_shard on "
                          "mesh[{\"dp\", \"cp\"}]._flatten() of a (dp, cp, tp) mesh)";
  auto dp_parent = dp_mesh.get_parent_mesh();
  auto tp_parent = spec.mesh.get_parent_mesh();
  if (!dp_parent || !tp_parent) {
    fail(module, what + "FSDP over tensor parallelism needs the FSDP mesh and the parameter's mesh to be sub-meshes "
                        "of one parent mesh, but " + std::string(!dp_parent ? "the FSDP mesh" : "the parameter's mesh") +
                        " has no parent mesh" + how);
  }
  if (!(*dp_parent == *tp_parent)) {
    fail(module, what + "the two meshes have different parent meshes, " + dp_parent->to_string() + " and " +
                     tp_parent->to_string() + how);
  }
  if (spec.mesh.ndim() != 1) {
    fail(module, what + "FSDP supports 1-D tensor parallelism only, but the parameter's mesh has " +
                     std::to_string(spec.mesh.ndim()) + " dims");
  }
  if (auto flat = flattened_dp_mesh(dp_mesh, *dp_parent, spec.mesh)) {
    return tp_layout(module, what, spec, *flat, shard_dim, /*hsdp=*/false);
  }
  std::vector<int64_t> dims = dp_mesh.get_parent_mesh_dims();
  for (int64_t d : spec.mesh.get_parent_mesh_dims()) dims.push_back(d);
  std::vector<int64_t> expected(static_cast<size_t>(dp_parent->ndim()));
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<int64_t>(i);
  if (dims != expected) {
    fail(module, what + "the FSDP mesh must be the leading dims of the parent mesh " + dp_parent->to_string() +
                     " and the tensor-parallel mesh its last dim, but they are the parent's dims " +
                     dims_to_string(dp_mesh.get_parent_mesh_dims()) + " and " +
                     dims_to_string(spec.mesh.get_parent_mesh_dims()) + how);
  }
  return tp_layout(module, what, spec, *dp_parent, shard_dim, dp_mesh.ndim() == 2);
}

}  // namespace

namespace {

// The mesh fully_shard shards over, after the checks made before anything changes; resolves
// the FSDP extension (NOTE: [FSDP extensions]) into `options`.
void check_module(torch::nn::Module& module) {
  if (StateRegistry::instance().lookup(module)) fail(module, "fully_shard was already applied to this module");
  try {
    (void)module.shared_from_this();
  } catch (const std::bad_weak_ptr&) {
    fail(module, "the module must be owned by a std::shared_ptr (a ModuleHolder or std::make_shared)");
  }
}

DeviceMesh checked_mesh(torch::nn::Module& module, FullyShardOptions& options) {
  check_module(module);
  DeviceMesh mesh = options.mesh ? *options.mesh : init_device_mesh("cpu", {comm::default_group()->size()});
  if (mesh.ndim() != 1 && mesh.ndim() != 2) {
    fail(module, "the mesh must have 1 dim (FSDP) or 2 dims (replicate, shard) for HSDP, got " +
                     std::to_string(mesh.ndim()) + " dims: " + mesh.to_string());
  }
  if (mesh.ndim() == 2 && mesh.mesh_dim_names().empty()) {
    // PyTorch's fully_shard: "Please init the 2D mesh for HSDP with mesh_dim_names specified".
    fail(module, "HSDP needs a 2-D mesh with dim names, e.g. init_device_mesh(\"cpu\", {replicate, shard}, "
                 "{\"replicate\", \"shard\"}), got " + mesh.to_string());
  }
  if (!mesh.get_coordinate().has_value()) fail(module, "the mesh " + mesh.to_string() + " does not contain this rank");
  if (!options.extensions) options.extensions = get_fsdp_extensions();
  if (!options.extensions && mesh.get_parent_mesh().has_value()) options.extensions = std::make_shared<DTensorExtensions>();
  const int64_t shard_size = mesh.size(mesh.ndim() - 1);
  if (options.reshard_after_forward && options.reshard_after_forward->is_int()) {
    const int64_t n = options.reshard_after_forward->value();
    if (n <= 0 || shard_size % n != 0) {
      fail(module, "reshard_after_forward=" + std::to_string(n) + " must be a positive divisor of the shard group size " +
                       std::to_string(shard_size));
    }
  }
  return mesh;
}

using Managed = std::vector<std::pair<std::string, torch::nn::Module*>>;

// The modules a group manages: `module` and its descendants, stopping at fully_shard-ed ones.
Managed managed_modules(torch::nn::Module& module) {
  Managed managed;
  std::function<void(const std::string&, torch::nn::Module&)> walk = [&](const std::string& prefix, torch::nn::Module& m) {
    managed.emplace_back(prefix, &m);
    for (const auto& item : m.named_children()) {
      if (StateRegistry::instance().lookup(*item.value())) continue;
      walk(prefix.empty() ? item.key() : prefix + "." + item.key(), *item.value());
    }
  };
  walk("", module);
  return managed;
}

// A parameter the new group will shard.
struct PendingParam {
  std::string fqn;
  std::vector<Registration> regs;
  at::Tensor tensor;  // the registered parameter
  at::Tensor flat;    // what FSDP shards: pre_flatten_transform's tensor
  int64_t shard_dim;
  std::optional<TPSharding> tp;
};

// The dim shard_placement_fn chooses for `t` (0 without one).
int64_t shard_dim_of(const torch::nn::Module& module, const FullyShardOptions& options, const std::string& fqn,
                     const at::Tensor& t) {
  if (!options.shard_placement_fn) return 0;
  auto s = options.shard_placement_fn(t);
  if (!s) return 0;
  const int64_t d = s->dim < 0 ? s->dim + t.dim() : s->dim;
  if (d < 0 || d >= t.dim()) {
    fail(module, "shard_placement_fn gave Shard(" + std::to_string(s->dim) + ") for parameter '" + fqn + "' with " +
                     std::to_string(t.dim()) + " dims");
  }
  return d;
}

// Checks one parameter of `owner` (registered there as `name`) and says how it is sharded.
PendingParam pending_param(const torch::nn::Module& module, const FullyShardOptions& options, const DeviceMesh& mesh,
                           torch::nn::Module* owner, const std::string& name, const std::string& fqn,
                           const at::Tensor& t) {
  if (t.dim() == 0) fail(module, "parameter '" + fqn + "' is a scalar; FSDP shards dim 0 and needs at least 1 dim");
  if (!t.is_contiguous() || (is_dtensor(t) && !local_tensor(t).is_contiguous())) {
    fail(module, "parameter '" + fqn + "' is not contiguous");
  }
  if (!nn::has_parameter_member(*owner, name)) {
    fail(module, "parameter '" + fqn + "' of " + module_type(*owner) +
                     " cannot be swapped: register its member with dtensor::nn::register_parameter_member");
  }
  const int64_t shard_dim = shard_dim_of(module, options, fqn, t);
  const FSDPExtensions* ext = options.extensions.get();
  if (is_dtensor(t) && ext == nullptr) {
    tp_sharding(module, fqn, mesh, get_spec(t), shard_dim);  // throws: the FSDP mesh has no parent
    fail(module, "parameter '" + fqn + "' is a DTensor and no FSDP extension handles it (set one with "
                     "FullyShardOptions::extensions or set_fsdp_extensions)");
  }
  auto flat = ext_pre_flatten_transform(t, ext);
  std::optional<TPSharding> tp;
  if (flat.second.has_value()) {
    if (is_dtensor(flat.first)) {
      fail(module, "the FSDP extension's pre_flatten_transform of parameter '" + fqn +
                       "' gave a DTensor; it must give the plain local tensor of the spec it gives");
    }
    tp = tp_sharding(module, fqn, mesh, *flat.second, shard_dim);
    tp->requires_grad = t.requires_grad();
  } else if (is_dtensor(t) || is_dtensor(flat.first)) {
    fail(module, "parameter '" + fqn + "' is a DTensor but the FSDP extension's pre_flatten_transform gave no "
                     "DTensorSpec for it");
  }
  return {fqn, {{owner, name}}, t, flat.first, shard_dim, std::move(tp)};
}

// The parameters of the managed modules (a tied one once, with every registration), checked.
std::vector<PendingParam> pending_params(const torch::nn::Module& module, const FullyShardOptions& options,
                                         const DeviceMesh& mesh, const Managed& managed) {
  const auto others = StateRegistry::instance().live();  // groups below, or siblings
  std::unordered_set<const c10::TensorImpl*> ignored;
  for (const auto& t : options.ignored_params) ignored.insert(t.unsafeGetTensorImpl());
  std::vector<PendingParam> pending;
  std::unordered_map<const c10::TensorImpl*, size_t> index;
  for (const auto& entry : managed) {
    for (const auto& item : entry.second->named_parameters(/*recurse=*/false)) {
      const at::Tensor& t = item.value();
      const c10::TensorImpl* impl = t.defined() ? t.unsafeGetTensorImpl() : nullptr;
      if (impl == nullptr || ignored.count(impl)) continue;
      const std::string fqn = entry.first.empty() ? item.key() : entry.first + "." + item.key();
      auto found = index.find(impl);
      if (found != index.end()) {
        pending[found->second].regs.push_back({entry.second, item.key()});
        continue;
      }
      for (const auto& s : others) {
        if (s->holds_original(impl)) {
          fail(module, "parameter '" + fqn + "' is shared with another fully_shard-ed module (one group per parameter)");
        }
      }
      index[impl] = pending.size();
      pending.push_back(pending_param(module, options, mesh, entry.second, item.key(), fqn, t));
    }
  }
  for (const auto& p : pending) {
    const at::ScalarType dt = pending.front().tensor.scalar_type();
    if (p.tensor.scalar_type() == dt) continue;
    std::ostringstream msg;
    msg << "parameters of one group must share a dtype (one flat all-gather";
    if (options.mp_policy.param_dtype) msg << " under the mixed-precision policy";
    msg << "): '" << pending.front().fqn << "' is " << dt << " but '" << p.fqn << "' is " << p.tensor.scalar_type();
    fail(module, msg.str());
  }
  return pending;
}

// A new group over `modules` with the parameters `pending` (no communication).
std::shared_ptr<FSDPState> make_state(const std::vector<torch::nn::Module*>& modules, FullyShardOptions options,
                                      const DeviceMesh& mesh, std::vector<PendingParam> pending) {
  auto state = std::make_shared<FSDPState>(*modules.front(), std::move(options), mesh);
  for (size_t i = 1; i < modules.size(); ++i) state->add_module(*modules[i]);
  state->set_orig_dtype(pending.empty() ? at::kFloat : pending.front().tensor.scalar_type());
  for (auto& p : pending) {
    state->remember_original(p.tensor);
    state->add_param(p.fqn, std::move(p.regs), p.flat, p.shard_dim, std::move(p.tp));
  }
  return state;
}

// NOTE: [FSDP over several modules]
// fully_shard over a list of modules (PyTorch's fully_shard([m1, m2]) and its
// _register_group_forward_hooks) makes one group of all their parameters: one all-gather before
// the first of them runs forward (its inputs carry the post-backward), one reshard after the last
// of them has run (its output carries the pre-backward), one reduce-scatter in backward. A
// forward must run each of them once, in any order; get_fsdp_module of any of them is the group.
void register_hooks(const std::vector<torch::nn::Module*>& modules, const std::shared_ptr<FSDPState>& state) {
  std::weak_ptr<FSDPState> weak = state;
  if (modules.size() == 1) {
    // The hooks hold the state (alive as long as the module).
    nn::register_forward_pre_hook(*modules[0], [state](torch::nn::Module&, nn::ForwardInputs& inputs) {
      state->pre_forward(inputs);
    });
    nn::register_forward_hook(*modules[0], [weak](torch::nn::Module&, const nn::ForwardInputs&, c10::IValue& output) {
      if (auto s = weak.lock()) s->post_forward(output);
    });
  } else {
    // The modules of the group that have not run in the current forward. A module that is not
    // among them starts the next forward: this also recovers from a forward that raised
    // half-way (its set never emptied).
    auto to_run = std::make_shared<std::unordered_set<const torch::nn::Module*>>();
    const std::unordered_set<const torch::nn::Module*> all(modules.begin(), modules.end());
    for (torch::nn::Module* m : modules) {
      nn::register_forward_pre_hook(*m, [state, to_run, all](torch::nn::Module& self, nn::ForwardInputs& inputs) {
        if (to_run->count(&self) && to_run->size() < all.size()) return;  // another module began this forward
        *to_run = all;
        state->pre_forward(inputs);
      });
      nn::register_forward_hook(*m, [weak, to_run](torch::nn::Module& self, const nn::ForwardInputs&,
                                                   c10::IValue& output) {
        to_run->erase(&self);
        if (!to_run->empty()) return;
        if (auto s = weak.lock()) s->post_forward(output);
      });
    }
  }
  state->set_id(StateRegistry::instance().add(*modules.front(), state));
  for (size_t i = 1; i < modules.size(); ++i) StateRegistry::instance().add(*modules[i], state);
}

// The modules of a list given to fully_shard, checked: none null, repeated, or inside another.
std::vector<torch::nn::Module*> checked_modules(const std::vector<std::shared_ptr<torch::nn::Module>>& list) {
  TORCH_CHECK(!list.empty(), "fully_shard: the list of modules is empty");
  std::vector<torch::nn::Module*> out;
  for (size_t i = 0; i < list.size(); ++i) {
    TORCH_CHECK(list[i], "fully_shard: module ", i, " of the list is null");
    for (size_t j = 0; j < i; ++j) {
      TORCH_CHECK(list[j] != list[i], "fully_shard: module ", i, " of the list is module ", j, " again");
      for (const auto* outer : {list[i].get(), list[j].get()}) {
        const auto* inner = outer == list[i].get() ? list[j].get() : list[i].get();
        for (const auto& d : outer->modules(/*include_self=*/false)) {
          TORCH_CHECK(d.get() != inner, "fully_shard: module ", outer == list[i].get() ? j : i, " of the list (",
                      module_type(*inner), ") is inside module ", outer == list[i].get() ? i : j, " (",
                      module_type(*outer), "); give the list modules that do not contain each other");
        }
      }
    }
    out.push_back(list[i].get());
  }
  return out;
}

}  // namespace

FSDPModule fully_shard(torch::nn::Module& module, FullyShardOptions options) {
  // Checks, before anything changes.
  DeviceMesh mesh = checked_mesh(module, options);
  std::vector<PendingParam> pending = pending_params(module, options, mesh, managed_modules(module));
  auto state = make_state({&module}, std::move(options), mesh, std::move(pending));
  register_hooks({&module}, state);
  return FSDPModuleAccess::make(state);
}

FSDPModule fully_shard(const std::vector<std::shared_ptr<torch::nn::Module>>& modules, FullyShardOptions options) {
  const std::vector<torch::nn::Module*> list = checked_modules(modules);
  DeviceMesh mesh = checked_mesh(*list.front(), options);
  Managed managed;
  for (size_t i = 0; i < list.size(); ++i) {
    if (i > 0) check_module(*list[i]);
    for (auto& entry : managed_modules(*list[i])) {
      const std::string prefix = "modules[" + std::to_string(i) + "]";
      managed.emplace_back(entry.first.empty() ? prefix : prefix + "." + entry.first, entry.second);
    }
  }
  std::vector<PendingParam> pending = pending_params(*list.front(), options, mesh, managed);
  auto state = make_state(list, std::move(options), mesh, std::move(pending));
  register_hooks(list, state);
  return FSDPModuleAccess::make(state);
}

std::optional<FSDPModule> get_fsdp_module(const torch::nn::Module& module) {
  if (auto s = StateRegistry::instance().lookup(module)) return FSDPModuleAccess::make(s);
  return std::nullopt;
}

// ---- FSDPModule ---------------------------------------------------------------------------

namespace {

// Applies `set` to the state of `module` and, with `recurse`, of the fully_shard-ed modules below it.
void for_states(FSDPState& state, bool recurse, const std::function<void(FSDPState&)>& set) {
  if (!recurse) return set(state);
  for (auto& s : state.states_below(true)) set(*s);
}

std::vector<std::weak_ptr<FSDPState>> states_of(const std::vector<FSDPModule>& modules) {
  std::vector<std::weak_ptr<FSDPState>> out;
  for (const auto& m : modules) out.push_back(FSDPModuleAccess::state(m));
  return out;
}

}  // namespace

void FSDPModule::unshard() {
  state_->unshard();
  state_->wait_for_unshard();
}
void FSDPModule::reshard() { state_->reshard(/*after_forward=*/false); }

void FSDPModule::set_requires_gradient_sync(bool value, bool recurse) {
  for_states(*state_, recurse, [value](FSDPState& s) { s.set_requires_gradient_sync(value); });
}
void FSDPModule::set_reshard_after_forward(ReshardAfterForward value, bool recurse) {
  const int64_t shard_size = state_->shard_size();
  if (value.is_int() && (value.value() <= 0 || shard_size % value.value() != 0)) {
    TORCH_CHECK(false, "set_reshard_after_forward: ", value.value(), " must be a positive divisor of the shard group size ",
                shard_size);
  }
  for_states(*state_, recurse, [value](FSDPState& s) { s.set_reshard_after_forward(value); });
}
void FSDPModule::set_reshard_after_backward(bool value, bool recurse) {
  for_states(*state_, recurse, [value](FSDPState& s) { s.set_reshard_after_backward(value); });
}
void FSDPModule::set_is_last_backward(bool value) {
  for_states(*state_, /*recurse=*/true, [value](FSDPState& s) { s.set_is_last_backward(value); });
}
void FSDPModule::set_modules_to_forward_prefetch(const std::vector<FSDPModule>& modules) {
  state_->set_forward_prefetch(states_of(modules));
}
void FSDPModule::set_modules_to_backward_prefetch(const std::vector<FSDPModule>& modules) {
  state_->set_backward_prefetch(states_of(modules));
}
void FSDPModule::set_gradient_divide_factor(double factor) {
  TORCH_CHECK(factor > 0, "set_gradient_divide_factor: the factor must be positive, got ", factor);
  state_->set_divide_factor(factor);
}
void FSDPModule::set_force_sum_reduction_for_comms(bool enable) { state_->set_force_sum(enable); }
void FSDPModule::set_unshard_in_backward(bool unshard_in_backward) {
  state_->set_unshard_in_backward(unshard_in_backward);
}
void FSDPModule::set_requires_all_reduce(bool requires_all_reduce, bool recurse) {
  for_states(*state_, recurse, [requires_all_reduce](FSDPState& s) { s.set_requires_all_reduce(requires_all_reduce); });
}
void FSDPModule::set_all_reduce_hook(std::function<void(at::Tensor& reduce_output)> hook) {
  state_->set_all_reduce_hook(std::move(hook));
}
torch::nn::Module& FSDPModule::module() const { return state_->module(); }
const DeviceMesh& FSDPModule::mesh() const { return state_->mesh(); }
std::vector<at::Tensor> FSDPModule::sharded_parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& p : state_->current_params()) out.push_back(p.sharded);
  return out;
}
bool FSDPModule::is_root() const { return state_->is_root(); }
bool FSDPModule::is_unsharded() const { return state_->status() == FSDPState::Status::kUnsharded; }
const FSDPExtensions* FSDPModule::extensions() const { return state_->ext(); }
void FSDPModule::set_trace(bool enabled) { state_->set_trace(enabled); }
std::vector<FSDPTraceEvent> FSDPModule::trace() const { return state_->trace(); }

}  // namespace fsdp
}  // namespace dtensor
