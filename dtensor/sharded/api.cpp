// dtensor/sharded/api.cpp: shard_tensor, shard_parameter, shard_module and its hooks, and the
// load-time process group.
#include "dtensor/sharded/api.h"

#include "dtensor/comm/object_collectives.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/nn/module_surgery.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/utils/containers.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <functional>

#include <algorithm>
#include <map>
#include <set>
#include <sstream>

namespace dtensor {
namespace sharded {

namespace {

thread_local comm::GroupPtr t_current_process_group;

std::string sizes_str(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << c10::IntArrayRef(v);
  return os.str();
}

}  // namespace

namespace detail {

// shard_tensor with the caller's own local checks folded into the one all_gather: a rank whose
// `local_error` is not empty makes every rank raise it. `what` names the tensor in messages
// ("input tensor", "param: weight").
ShardedTensor shard_tensor_checked(const at::Tensor& tensor, const ShardingSpec& spec, int src_rank,
                                   comm::GroupPtr group, const std::string& op, const std::string& what,
                                   const std::string& local_error) {
  if (!group) group = comm::default_group();
  comm::Group& g = *group;
  nlohmann::json mine;
  mine["src_rank"] = src_rank;
  mine["spec"] = spec.to_json();
  mine["spec_str"] = spec.to_string();
  if (!local_error.empty()) {
    mine["error"] = local_error;
  } else if (!tensor.defined()) {
    mine["error"] = what + " is undefined";
  } else {
    mine["sizes"] = tensor.sizes().vec();
    mine["dtype"] = std::string(c10::toString(tensor.scalar_type()));
    mine["contiguous"] = tensor.is_contiguous();
  }
  const auto all = comm::all_gather_object(g, mine);
  const int current_rank = g.rank();
  for (size_t idx = 0; idx < all.size(); ++idx)
    TORCH_CHECK(!all[idx].contains("error"), op, ": rank ", g.global_ranks()[idx], ": ",
                all[idx]["error"].get<std::string>());
  for (size_t idx = 0; idx < all.size(); ++idx)
    TORCH_CHECK(all[idx]["contiguous"].get<bool>(), what, " is not a contiguous Tensor (on rank ",
                g.global_ranks()[idx], ")");
  for (size_t idx = 0; idx < all.size(); ++idx) {
    const nlohmann::json& entry = all[idx];
    TORCH_CHECK(entry["src_rank"].get<int>() == src_rank, "src_rank=", src_rank, " on rank: ", current_rank,
                " does not match with src_rank=", entry["src_rank"].get<int>(), " on rank: ", idx);
    TORCH_CHECK(entry["spec"] == mine["spec"], "sharding_spec=", spec.to_string(), " on rank: ", current_rank,
                " does not match with sharding_spec=", entry["spec_str"].get<std::string>(), " on rank: ", idx);
  }
  for (size_t idx = 1; idx < all.size(); ++idx)
    TORCH_CHECK(all[idx]["sizes"] == all[0]["sizes"] && all[idx]["dtype"] == all[0]["dtype"], op, ": ", what,
                " has size ", sizes_str(all[idx]["sizes"].get<std::vector<int64_t>>()), " and dtype ",
                all[idx]["dtype"].get<std::string>(), " on rank: ", idx, ", but size ",
                sizes_str(all[0]["sizes"].get<std::vector<int64_t>>()), " and dtype ",
                all[0]["dtype"].get<std::string>(), " on rank: 0 (every rank passes a tensor of the same size and ",
                "dtype; the values of src_rank are used)");
  return spec.shard(tensor, src_rank, group);
}

}  // namespace detail

ShardedTensor shard_tensor(const at::Tensor& tensor, const ShardingSpec& sharding_spec, int src_rank,
                           comm::GroupPtr group) {
  return detail::shard_tensor_checked(tensor, sharding_spec, src_rank, std::move(group), "shard_tensor",
                                      "input tensor", "");
}

// ---- modules ---------------------------------------------------------------------------------------

namespace {

// "a.b.c" -> {"a.b", "c"}; "c" -> {"", "c"} (Python's str.rpartition).
std::pair<std::string, std::string> rpartition(const std::string& name) {
  const auto pos = name.rfind('.');
  if (pos == std::string::npos) return {"", name};
  return {name.substr(0, pos), name.substr(pos + 1)};
}

// True when `path` is `root` or inside it ("net.0" is inside "net", "net1" is not).
bool inside(const std::string& path, const std::string& root) {
  return path == root ||
         (path.size() > root.size() && path.compare(0, root.size(), root) == 0 && path[root.size()] == '.');
}

// The error shard_parameter raises for parameter `name` of `module`, or "" when it can be sharded.
std::string check_parameter(torch::nn::Module& module, const std::string& name) {
  if (const at::Tensor* p = module.named_parameters(/*recurse=*/false).find(name)) {
    if (is_dtensor(*p))
      return "param: " + name + " of " + module.name() + " is a DTensor already (sharded or distributed before)";
    if (!nn::has_parameter_member(module, name))
      return "no member of " + module.name() + " is known to hold parameter '" + name +
             "'; register it once with dtensor::nn::register_parameter_member<YourModuleImpl>(\"" + name +
             "\", &YourModuleImpl::member) so that forward() sees the sharded tensor";
    return "";
  }
  if (module.named_buffers(/*recurse=*/false).find(name))
    return "Expected " + module.name() + "." + name + " to be a Tensor parameter, but found a buffer";
  if (module.named_children().find(name))
    return "Expected " + module.name() + "." + name + " to be a Tensor parameter, but found a module";
  return module.name() + " has no attribute `" + name + "`";
}

std::shared_ptr<torch::nn::Module> child_of(torch::nn::Module& module, const std::string& name) {
  auto children = module.named_children();
  const auto* child = children.find(name);
  if (child) return *child;
  const bool is_tensor = module.named_parameters(false).find(name) || module.named_buffers(false).find(name);
  TORCH_CHECK(!is_tensor, "`", name, "` is not an nn.Module (it is a tensor of ", module.name(), ")");
  TORCH_CHECK(false, module.name(), " has no attribute `", name, "`");
}

// Meshes built by one shard_module, by placement order (group ranks), so that parameters with
// the same placements share one DeviceMesh (building one is collective).
using MeshCache = std::map<std::vector<int>, DeviceMesh>;

at::Tensor to_dtensor_cached(const ShardedTensor& st, MeshCache* cache) {
  if (!cache) return st.to_dtensor();
  const std::vector<int> order = placement_group_ranks(st.metadata().shards_metadata, *st.process_group());
  auto it = cache->find(order);
  if (it != cache->end()) return st.to_dtensor(&it->second);
  at::Tensor dt = st.to_dtensor();
  cache->emplace(order, get_spec(dt).mesh);
  return dt;
}

void shard_parameter_impl(torch::nn::Module& module, const std::string& param_name, const ShardingSpec& spec,
                          int src_rank, const comm::GroupPtr& group, MeshCache* cache) {
  const std::string error = check_parameter(module, param_name);
  at::Tensor tensor = error.empty() ? module.named_parameters(false)[param_name].detach() : at::Tensor();
  ShardedTensor st = detail::shard_tensor_checked(tensor, spec, src_rank, group, "shard_parameter",
                                                  "param: " + param_name, error);
  nn::swap_parameter(module, param_name, to_dtensor_cached(st, cache));
}

// The parameters of `module` that shard_module turns into Replicate DTensors next to its
// sharded ones.
std::vector<std::string> plain_parameters(torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& kv : module.named_parameters(false))
    if (!is_dtensor(kv.value())) names.push_back(kv.key());
  return names;
}

// Step 1 of shard_module: everything that can be checked without moving data. Returns a
// description of the plan for the cross-rank comparison.
nlohmann::json validate_plan(torch::nn::Module& module, const ShardingPlan& plan) {
  nlohmann::json fingerprint = nlohmann::json::array();
  std::vector<std::string> sharder_paths;
  std::set<std::string> names;
  for (const auto& [name, entry] : plan.plan) {
    TORCH_CHECK(names.insert(name).second, "ShardingPlan has '", name, "' twice");
    if (const auto* sharder = std::get_if<std::shared_ptr<Sharder>>(&entry); sharder && *sharder)
      sharder_paths.push_back(name);
  }
  std::set<std::string> parameters_of_plan;
  for (const auto& [name, entry] : plan.plan)
    if (const auto* spec = std::get_if<std::shared_ptr<const ShardingSpec>>(&entry); spec && *spec)
      parameters_of_plan.insert(name);
  for (const auto& [name, entry] : plan.plan) {
    const auto* spec = std::get_if<std::shared_ptr<const ShardingSpec>>(&entry);
    const auto* sharder = std::get_if<std::shared_ptr<Sharder>>(&entry);
    if (spec && *spec) {
      fingerprint.push_back({name, (*spec)->to_json()});
      const auto [module_path, param_name] = rpartition(name);
      for (const std::string& sharder_path : sharder_paths)
        TORCH_CHECK(!inside(module_path, sharder_path), "ShardingPlan is in-valid, trying to shard a parameter: ", name,
                    ", but there's already a Sharder entry for module ", sharder_path,
                    ", parameter sharding should not conflict with the submodule tree that a Sharder is working with!");
      torch::nn::Module& mod = get_submodule(module, module_path);
      const std::string error = check_parameter(mod, param_name);
      TORCH_CHECK(error.empty(), error);
      // Its other plain parameters will become Replicate DTensors (step 3).
      for (const std::string& other : plain_parameters(mod)) {
        const std::string full = module_path.empty() ? other : module_path + "." + other;
        TORCH_CHECK(parameters_of_plan.count(full) || nn::has_parameter_member(mod, other), "shard_module: ",
                    mod.name(), ".", other, " must become a Replicate DTensor next to the sharded ", param_name,
                    ", but no member of ", mod.name(), " is known to hold it; register it once with ",
                    "dtensor::nn::register_parameter_member");
      }
    } else if (sharder && *sharder) {
      fingerprint.push_back({name, "Sharder"});
      TORCH_CHECK(!name.empty(), "Module path must not be empty for custom sharder!");
      get_submodule(module, name);
    } else {
      TORCH_CHECK(false, "Only `ShardingSpec` and `Sharder` are supported to shard '", name, "'");
    }
  }
  if (plan.output_plan) {
    for (const auto& [path, spec] : *plan.output_plan) {
      TORCH_CHECK(spec != nullptr, "Only `ShardingSpec` is supported as output_plan for '", path, "'");
      TORCH_CHECK(dynamic_cast<const ChunkShardingSpec*>(spec.get()), "output_plan for '", path,
                  "': only ChunkShardingSpec outputs can be resharded, got ", spec->to_string());
      get_submodule(module, path);
      fingerprint.push_back({"output:" + path, spec->to_json()});
    }
  }
  if (plan.return_local_tensor) {
    for (const std::string& path : *plan.return_local_tensor) {
      get_submodule(module, path);
      fingerprint.push_back({"local:" + path});
    }
  }
  return fingerprint;
}

}  // namespace

torch::nn::Module& get_submodule(torch::nn::Module& module, const std::string& path) {
  if (path.empty()) return module;
  torch::nn::Module* current = &module;
  std::shared_ptr<torch::nn::Module> keep;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    keep = child_of(*current, path.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    current = keep.get();
    if (dot == std::string::npos) return *current;
    start = dot + 1;
  }
}

void shard_parameter(torch::nn::Module& module, const std::string& param_name, const ShardingSpec& sharding_spec,
                     int src_rank, comm::GroupPtr process_group) {
  if (!process_group) process_group = comm::default_group();
  shard_parameter_impl(module, param_name, sharding_spec, src_rank, process_group, nullptr);
}

namespace {

// The shards `spec` places on this rank, each made by `make(sizes, options)`.
ShardedTensor make_sharded(const ShardingSpec& spec, std::vector<int64_t> size, at::TensorOptions options,
                           comm::GroupPtr group, const char* what,
                           const std::function<at::Tensor(c10::IntArrayRef, const at::TensorOptions&)>& make) {
  if (!group) group = comm::default_group();
  for (int64_t s : size)
    TORCH_CHECK(s >= 0, "sharded::", what, ": negative size in ", c10::IntArrayRef(size));
  const bool requires_grad = options.requires_grad();
  const at::TensorOptions local_options = options.requires_grad(c10::nullopt);
  TensorProperties props;
  props.dtype = c10::typeMetaToScalarType(local_options.dtype());
  props.requires_grad = requires_grad;
  ShardedTensorMetadata meta = spec.build_metadata(size, props);
  placement_group_ranks(meta.shards_metadata, *group);  // every placement is a rank of the group
  const int me = group->global_ranks()[static_cast<size_t>(group->rank())];
  std::vector<Shard> local;
  for (const auto& m : meta.shards_metadata) {
    if (m.placement()->rank() != me) continue;
    at::Tensor t = make(m.shard_sizes(), local_options.device(m.placement()->device()));
    if (requires_grad) t.requires_grad_(true);
    local.emplace_back(t, m);
  }
  return ShardedTensor::init_from_local_shards_and_global_metadata(std::move(local), std::move(meta), group,
                                                                   spec.clone());
}

at::TensorOptions options_of(const ShardedTensor& like) {
  return at::TensorOptions().dtype(like.dtype()).requires_grad(like.metadata().tensor_properties.requires_grad);
}

// The options of a *_like factory: `like`'s, with dtype and requires_grad from `o` where set.
at::TensorOptions like_options(const ShardedTensor& like, const at::TensorOptions& o) {
  at::TensorOptions out = options_of(like);
  if (o.has_dtype()) out = out.dtype(o.dtype());
  if (o.has_requires_grad()) out = out.requires_grad(o.requires_grad());
  return out;
}

}  // namespace

ShardedTensor empty(const ShardingSpec& spec, std::vector<int64_t> size, at::TensorOptions options, comm::GroupPtr group) {
  return make_sharded(spec, std::move(size), options, std::move(group), "empty",
                      [](c10::IntArrayRef s, const at::TensorOptions& o) { return at::empty(s, o); });
}
ShardedTensor zeros(const ShardingSpec& spec, std::vector<int64_t> size, at::TensorOptions options, comm::GroupPtr group) {
  return make_sharded(spec, std::move(size), options, std::move(group), "zeros",
                      [](c10::IntArrayRef s, const at::TensorOptions& o) { return at::zeros(s, o); });
}
ShardedTensor ones(const ShardingSpec& spec, std::vector<int64_t> size, at::TensorOptions options, comm::GroupPtr group) {
  return make_sharded(spec, std::move(size), options, std::move(group), "ones",
                      [](c10::IntArrayRef s, const at::TensorOptions& o) { return at::ones(s, o); });
}
ShardedTensor full(const ShardingSpec& spec, std::vector<int64_t> size, const at::Scalar& fill_value,
                   at::TensorOptions options, comm::GroupPtr group) {
  return make_sharded(spec, std::move(size), options, std::move(group), "full",
                      [&](c10::IntArrayRef s, const at::TensorOptions& o) { return at::full(s, fill_value, o); });
}
ShardedTensor rand(const ShardingSpec& spec, std::vector<int64_t> size, at::TensorOptions options, comm::GroupPtr group) {
  return make_sharded(spec, std::move(size), options, std::move(group), "rand",
                      [](c10::IntArrayRef s, const at::TensorOptions& o) { return at::rand(s, o); });
}
ShardedTensor randn(const ShardingSpec& spec, std::vector<int64_t> size, at::TensorOptions options, comm::GroupPtr group) {
  return make_sharded(spec, std::move(size), options, std::move(group), "randn",
                      [](c10::IntArrayRef s, const at::TensorOptions& o) { return at::randn(s, o); });
}
ShardedTensor empty_like(const ShardedTensor& l, at::TensorOptions o) {
  return empty(*l.sharding_spec(), l.size(), like_options(l, o), l.process_group());
}
ShardedTensor zeros_like(const ShardedTensor& l, at::TensorOptions o) {
  return zeros(*l.sharding_spec(), l.size(), like_options(l, o), l.process_group());
}
ShardedTensor ones_like(const ShardedTensor& l, at::TensorOptions o) {
  return ones(*l.sharding_spec(), l.size(), like_options(l, o), l.process_group());
}
ShardedTensor full_like(const ShardedTensor& l, const at::Scalar& v, at::TensorOptions o) {
  return full(*l.sharding_spec(), l.size(), v, like_options(l, o), l.process_group());
}
ShardedTensor rand_like(const ShardedTensor& l, at::TensorOptions o) {
  return rand(*l.sharding_spec(), l.size(), like_options(l, o), l.process_group());
}
ShardedTensor randn_like(const ShardedTensor& l, at::TensorOptions o) {
  return randn(*l.sharding_spec(), l.size(), like_options(l, o), l.process_group());
}

nn::RemovableHandle reshard_output(torch::nn::Module& module, std::shared_ptr<const ShardingSpec> resharding_spec) {
  TORCH_CHECK(resharding_spec != nullptr, "reshard_output: the spec is null");
  auto chunk = std::dynamic_pointer_cast<const ChunkShardingSpec>(resharding_spec);
  TORCH_CHECK(chunk, "reshard_output: only ChunkShardingSpec outputs can be resharded, got ",
              resharding_spec->to_string());
  // The mesh of the spec's order, built at the first call that needs it.
  auto spec_mesh = std::make_shared<std::optional<DeviceMesh>>();
  return nn::register_forward_hook(
      module, [chunk, spec_mesh](torch::nn::Module& m, const nn::ForwardInputs&, c10::IValue& output) {
        if (!output.isTensor() || !is_dtensor(output.toTensor())) return;
        const at::Tensor out = output.toTensor();
        const DeviceMesh& mesh = get_spec(out).mesh;
        // A ChunkShardingSpec places shards on a 1-D list of ranks: an output on an N-D mesh
        // has no 1-D layout to move from, so say so instead of passing it on unchanged.
        TORCH_CHECK(mesh.ndim() == 1, "reshard_output of ", m.name(), ": the output is a DTensor on the ",
                    mesh.ndim(), "-D mesh ", mesh.to_string(), " with placements ", to_string(get_spec(out).placements),
                    ", but ", chunk->to_string(), " describes shards on a 1-D list of ranks; only outputs on "
                    "1-D meshes can be resharded. Redistribute the output yourself (dtensor::redistribute) or "
                    "produce it on a 1-D mesh");
        const auto meta = chunk->build_metadata(out.sizes().vec(), {});
        const std::vector<int> order = placement_group_ranks(meta.shards_metadata, *mesh.world());
        const at::Tensor mesh_ranks = mesh.mesh().flatten();
        std::vector<int> mesh_order(mesh_ranks.data_ptr<int64_t>(),
                                    mesh_ranks.data_ptr<int64_t>() + mesh_ranks.numel());
        std::vector<int> sorted_order = order, sorted_mesh = mesh_order;
        std::sort(sorted_order.begin(), sorted_order.end());
        std::sort(sorted_mesh.begin(), sorted_mesh.end());
        TORCH_CHECK(sorted_order == sorted_mesh, "reshard_output of ", m.name(), ": ", chunk->to_string(),
                    " must place one shard on each rank of the output's ", mesh.to_string());
        const int64_t d = chunk->dim() < 0 ? chunk->dim() + out.dim() : chunk->dim();
        at::Tensor sharded = redistribute(out, mesh, {dtensor::Shard{d}});
        if (order == mesh_order) {
          output = sharded;
          return;
        }
        TORCH_CHECK(!(sharded.requires_grad() && at::GradMode::is_enabled()), "reshard_output of ", m.name(),
                    ": placing the output's shards in another order than its mesh's (", mesh.to_string(),
                    ") moves them as a ShardedTensor, which autograd cannot follow; use the mesh's order in ",
                    chunk->to_string(), " or run without grad");
        ShardedTensor st = ShardedTensor::from_dtensor(sharded);
        st.reshard(*chunk);
        if (!spec_mesh->has_value()) {
          at::Tensor dt = st.to_dtensor();
          *spec_mesh = get_spec(dt).mesh;
          output = dt;
        } else {
          output = st.to_dtensor(&**spec_mesh);
        }
      });
}

nn::RemovableHandle collect_local_shard(torch::nn::Module& module) {
  return nn::register_forward_hook(module, [](torch::nn::Module&, const nn::ForwardInputs&, c10::IValue& output) {
    if (!output.isTensor() || !is_dtensor(output.toTensor())) return;
    const at::Tensor out = output.toTensor();
    const DTensorSpec& spec = get_spec(out);
    if (spec.mesh.ndim() != 1 || !is_shard(spec.placements[0])) return;
    const int64_t d = std::get<dtensor::Shard>(spec.placements[0]).dim;
    at::Tensor local = to_local(out);
    if (local.size(d) == 1) local = local.squeeze(d);
    output = local;
  });
}

void shard_module(torch::nn::Module& module, const ShardingPlan& plan, int src_rank, comm::GroupPtr process_group) {
  if (!process_group) process_group = comm::default_group();
  comm::Group& g = *process_group;
  // 1. The whole plan, checked on every rank; any rank's problem is every rank's error.
  nlohmann::json mine;
  try {
    mine["plan"] = validate_plan(module, plan);
  } catch (const c10::Error& e) {
    mine["error"] = e.what_without_backtrace();
  }
  mine["src_rank"] = src_rank;
  const auto all = comm::all_gather_object(g, mine);
  for (size_t r = 0; r < all.size(); ++r)
    TORCH_CHECK(!all[r].contains("error"), "shard_module: rank ", g.global_ranks()[r], ": ",
                all[r]["error"].get<std::string>());
  for (size_t r = 1; r < all.size(); ++r) {
    TORCH_CHECK(all[r]["plan"] == all[0]["plan"], "shard_module: the plan of rank ", g.global_ranks()[r],
                " differs from the plan of rank ", g.global_ranks()[0], " (every rank must pass the same plan)");
    TORCH_CHECK(all[r]["src_rank"] == all[0]["src_rank"], "shard_module: src_rank=", all[r]["src_rank"].get<int>(),
                " on rank ", g.global_ranks()[r], " does not match src_rank=", all[0]["src_rank"].get<int>(),
                " on rank ", g.global_ranks()[0]);
  }

  // 2. Parameters and sharders, in plan order.
  MeshCache meshes;
  std::vector<std::pair<torch::nn::Module*, DeviceMesh>> sharded_modules;
  for (const auto& [name, entry] : plan.plan) {
    if (const auto* spec = std::get_if<std::shared_ptr<const ShardingSpec>>(&entry)) {
      const auto [module_path, param_name] = rpartition(name);
      torch::nn::Module& mod = get_submodule(module, module_path);
      shard_parameter_impl(mod, param_name, **spec, src_rank, process_group, &meshes);
      const bool known = std::any_of(sharded_modules.begin(), sharded_modules.end(),
                                     [&](const auto& sm) { return sm.first == &mod; });
      if (!known) sharded_modules.emplace_back(&mod, get_spec(mod.named_parameters(false)[param_name]).mesh);
    } else {
      const auto& sharder = std::get<std::shared_ptr<Sharder>>(entry);
      const auto [parent_path, mod_name] = rpartition(name);
      torch::nn::Module& parent = get_submodule(module, parent_path);
      std::shared_ptr<torch::nn::Module> child = child_of(parent, mod_name);
      std::shared_ptr<torch::nn::Module> sharded = sharder->shard(child);
      TORCH_CHECK(sharded != nullptr, "shard_module: the Sharder of '", name, "' returned no module");
      if (sharded != child) parent.replace_module(mod_name, sharded);
    }
  }

  // 3. Modules with sharded parameters run on DTensors.
  for (auto& [mod, mesh] : sharded_modules) {
    for (const std::string& other : plain_parameters(*mod)) {
      at::Tensor value = mod->named_parameters(false)[other].detach();
      nn::swap_parameter(*mod, other, from_local(value, mesh, {Replicate{}}));
    }
    nn::register_forward_pre_hook(*mod, [mesh = mesh](torch::nn::Module&, nn::ForwardInputs& inputs) {
      const utils::TensorFn replicate = [&mesh](const at::Tensor& t) {
        return is_dtensor(t) ? t : from_local(t, mesh, {Replicate{}});
      };
      inputs = utils::apply_to_tensors(replicate, inputs);
    });
  }

  // 4. Output hooks.
  if (plan.output_plan)
    for (const auto& [path, spec] : *plan.output_plan) reshard_output(get_submodule(module, path), spec);
  if (plan.return_local_tensor)
    for (const std::string& path : *plan.return_local_tensor) collect_local_shard(get_submodule(module, path));
}

LoadWithProcessGroupGuard::LoadWithProcessGroupGuard(comm::GroupPtr group) : group_(std::move(group)) {
  TORCH_CHECK(group_ != nullptr, "load_with_process_group: the process group is null");
  TORCH_CHECK(t_current_process_group == nullptr,
              "ProcessGroup already set by previous \"load_with_process_group\" context manager");
  t_current_process_group = group_;
}

LoadWithProcessGroupGuard::~LoadWithProcessGroupGuard() { t_current_process_group = nullptr; }

comm::GroupPtr get_current_process_group() {
  return t_current_process_group ? t_current_process_group : comm::default_group();
}

}  // namespace sharded
}  // namespace dtensor
