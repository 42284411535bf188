// dtensor/fsdp/state_dict.cpp
#include "dtensor/fsdp/state_dict.h"

#include "dtensor/fsdp/extensions.h"
#include "dtensor/fsdp/fsdp_state_internal.h"
#include "dtensor/nn/module_surgery.h"
#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <algorithm>
#include <map>
#include <unordered_map>

namespace dtensor {
namespace fsdp {

namespace {

// Unsharded parameter -> its sharded DTensor, for every fully_shard-ed module in the tree.
std::unordered_map<const c10::TensorImpl*, at::Tensor> sharded_of(const torch::nn::Module& module) {
  std::unordered_map<const c10::TensorImpl*, at::Tensor> out;
  auto add = [&](const torch::nn::Module& m) {
    if (auto f = get_fsdp_module(m)) {
      for (const auto& p : FSDPModuleAccess::state(*f)->current_params()) {
        out[p.unsharded.unsafeGetTensorImpl()] = p.sharded;
        if (p.unsharded_param.defined()) out[p.unsharded_param.unsafeGetTensorImpl()] = p.sharded;
      }
    }
  };
  add(module);
  for (const auto& m : module.modules(/*include_self=*/false)) add(*m);
  return out;
}

// A sharded parameter and the state managing it.
struct Managed {
  const FSDPState* state;
  const FSDPParam* param;
};

// Sharded DTensor -> its FSDPParam and state, for every fully_shard-ed module in the tree.
std::unordered_map<const c10::TensorImpl*, Managed> params_of(const torch::nn::Module& module) {
  std::unordered_map<const c10::TensorImpl*, Managed> out;
  auto add = [&](const torch::nn::Module& m) {
    if (auto f = get_fsdp_module(m)) {
      FSDPState* s = FSDPModuleAccess::state(*f).get();
      for (const auto& p : s->current_params()) out[p.sharded.unsafeGetTensorImpl()] = {s, &p};
    }
  };
  add(module);
  for (const auto& m : module.modules(/*include_self=*/false)) add(*m);
  return out;
}

// A 2-D parameter as the tensor-parallel DTensor it was before fully_shard (collective over the
// FSDP dims): the extension's all_gather_dtensor gives the TP-local tensor.
at::Tensor to_tp_dtensor(const Managed& m) {
  at::NoGradGuard no_grad;
  const DTensorSpec& tp = *m.param->tp_spec;
  const at::Tensor sharded = m.param->sharded.detach();
  at::Tensor local = ext_all_gather_dtensor(sharded, get_spec(sharded).mesh, m.state->ext());
  FromLocalOptions o;
  o.shape = tp.tensor_meta.shape;
  o.stride = tp.tensor_meta.stride;
  return from_local(local.contiguous(), tp.mesh, tp.placements, o);
}

// A DTensor value for the 2-D parameter `target`, laid out like it. `value` lives on the
// parent mesh (any placements), or is a tensor-parallel DTensor on its tp mesh (TP -> FSDP x
// TP: the extension's chunk_dtensor lifts it to the parent mesh, DTensorExtensions with
// (Shard(0), <tp placement>)), then it is redistributed.
at::Tensor to_2d_layout(const std::string& name, const at::Tensor& value, const at::Tensor& target, const Managed* m) {
  const DTensorSpec& vs = get_spec(value);
  const DTensorSpec& ts = get_spec(target);
  at::Tensor v = value.detach();
  if (!(vs.mesh == ts.mesh)) {
    auto parent = vs.mesh.get_parent_mesh();
    TORCH_CHECK(m != nullptr && m->param->tp_spec && parent && *parent == ts.mesh && vs.mesh.ndim() == 1 &&
                    vs.mesh.get_parent_mesh_dims().back() == ts.mesh.ndim() - 1,
                "fsdp::load_state_dict: entry '", name, "' is a DTensor on ", vs.mesh.to_string(),
                " but the parameter lives on ", ts.mesh.to_string(),
                "; a DTensor value must be on the parameter's mesh or on its tensor-parallel (last) dim");
    const DeviceMesh& fsdp_mesh = m->state->mesh();
    v = ext_chunk_dtensor(v, static_cast<int>(m->state->shard_rank()), fsdp_mesh, m->state->ext());
    TORCH_CHECK(is_dtensor(v) && get_spec(v).mesh == ts.mesh, "fsdp::load_state_dict: entry '", name,
                "': the FSDP extension's chunk_dtensor did not give a DTensor on ", ts.mesh.to_string());
  }
  return redistribute(v, ts.mesh, ts.placements);
}

// The registered tensors by name (parameters with the sharded DTensor of an unsharded one).
std::vector<std::pair<std::string, at::Tensor>> entries(const torch::nn::Module& module) {
  const auto sharded = sharded_of(module);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& kv : nn::named_parameters(module)) {
    auto it = sharded.find(kv.second.unsafeGetTensorImpl());
    out.emplace_back(kv.first, it == sharded.end() ? kv.second : it->second);
  }
  for (const auto& kv : module.named_buffers()) out.emplace_back(kv.key(), kv.value());
  return out;
}

}  // namespace

StateDict sharded_state_dict(const torch::nn::Module& module) {
  StateDict out;
  for (auto& kv : entries(module)) out.emplace_back(kv.first, kv.second.detach());
  return out;
}

StateDict unsharded_state_dict(const torch::nn::Module& module) {
  const auto params = params_of(module);
  StateDict out;
  for (auto& kv : entries(module)) {
    at::NoGradGuard no_grad;
    auto it = params.find(kv.second.unsafeGetTensorImpl());
    if (it == params.end()) {
      out.emplace_back(kv.first, kv.second.detach());
    } else if (it->second.param->tp_spec) {
      out.emplace_back(kv.first, to_tp_dtensor(it->second));
    } else {
      out.emplace_back(kv.first, full_tensor(kv.second.detach()));
    }
  }
  return out;
}

StateDict full_state_dict(const torch::nn::Module& module, bool rank0_only) {
  const auto params = params_of(module);
  StateDict out;
  bool keep = true;
  for (auto& kv : entries(module)) {
    at::NoGradGuard no_grad;
    if (is_dtensor(kv.second)) {
      if (rank0_only) keep = get_spec(kv.second).mesh.get_rank() == 0;
      auto it = params.find(kv.second.unsafeGetTensorImpl());
      // A 2-D parameter: all-gathered over dp (all_gather_dtensor), then over tp.
      const at::Tensor value =
          it != params.end() && it->second.param->tp_spec ? to_tp_dtensor(it->second) : kv.second.detach();
      out.emplace_back(kv.first, full_tensor(value));
    } else {
      out.emplace_back(kv.first, kv.second.detach().clone());
    }
  }
  if (rank0_only && !keep) out.clear();
  return out;
}

at::Tensor shard_like(const at::Tensor& full, const at::Tensor& like) {
  TORCH_CHECK(!is_dtensor(full), "shard_like: `full` must be a plain tensor, got a DTensor");
  const DTensorSpec& spec = get_spec(like);
  TORCH_CHECK(full.sizes().vec() == spec.tensor_meta.shape, "shard_like: the full tensor has shape ", full.sizes(),
              " but the DTensor's global shape is ", c10::IntArrayRef(spec.tensor_meta.shape));
  TORCH_CHECK(spec.mesh.get_coordinate().has_value(), "shard_like: this rank is not on the DTensor's mesh");
  for (const Placement& p : spec.placements) {
    TORCH_CHECK(!is_partial(p), "shard_like: Partial placements have no shard of a full tensor");
  }
  // This rank's piece (strided shards included), without communication.
  at::Tensor piece = _shard_tensor(full.detach(), spec.placements, spec.mesh);
  return make_dtensor(local_tensor(piece).to(spec.tensor_meta.dtype).contiguous().clone(), spec);
}

namespace {

// Copies `value` into the registered tensor `target` (collective only for a DTensor value into a
// sharded parameter).
void load_entry(const std::string& name, const at::Tensor& value, const at::Tensor& target, const Managed* m) {
  at::NoGradGuard no_grad;
  if (is_dtensor(target)) {
    at::Tensor shard = is_dtensor(value) ? to_2d_layout(name, value, target, m) : shard_like(value, target);
    local_tensor(target).copy_(local_tensor(shard));
  } else {
    target.copy_(is_dtensor(value) ? full_tensor(value.detach()) : value);
  }
}

template <class Value, class SizesOf>
void check_names(const std::vector<std::pair<std::string, at::Tensor>>& targets,
                 const std::map<std::string, Value>& values, bool strict, const char* fn, const SizesOf& sizes_of) {
  for (const auto& kv : targets) {
    auto it = values.find(kv.first);
    if (it == values.end()) {
      TORCH_CHECK(!strict, fn, ": missing entry '", kv.first, "'");
      continue;
    }
    const std::vector<int64_t> sizes = sizes_of(it->second);
    TORCH_CHECK(c10::IntArrayRef(sizes) == kv.second.sizes(), fn, ": entry '", kv.first, "' has shape ",
                c10::IntArrayRef(sizes), " but the module's has ", kv.second.sizes());
  }
  if (strict) {
    for (const auto& kv : values) {
      bool found = false;
      for (const auto& t : targets) found = found || t.first == kv.first;
      TORCH_CHECK(found, fn, ": unexpected entry '", kv.first, "'");
    }
  }
}

int devices_per_node(const c10::Device& device) {
  if (device.is_cpu()) return 0;
  return static_cast<int>(c10::impl::VirtualGuardImpl(device.type()).deviceCount());
}

}  // namespace

void load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict) {
  auto targets = entries(module);
  const auto params = params_of(module);
  std::map<std::string, at::Tensor> values(state.begin(), state.end());
  check_names(targets, values, strict, "fsdp::load_state_dict", [](const at::Tensor& t) { return t.sizes().vec(); });
  for (auto& kv : targets) {
    auto it = values.find(kv.first);
    if (it == values.end()) continue;
    auto m = params.find(kv.second.unsafeGetTensorImpl());
    load_entry(kv.first, it->second, kv.second, m == params.end() ? nullptr : &m->second);
  }
}

// NOTE: [ShardedTensor state dicts]
// FSDP1's SHARDED_STATE_DICT without a device mesh (_sharded_post_state_dict_hook): FSDP1
// unshards, then each parameter is chunked along dim 0 over the FSDP (shard) group by the
// extension's chunk_tensor. A plain parameter gives a ShardedTensor over the shard group whose
// shards are torch.chunk's pieces; a 2-D (FSDP x TP) parameter gives DTensorExtensions's nested
// form: a ShardedTensor over the tp group covering the parameter (this rank's TP box here, the
// other boxes on the scapegoat rank, NOTE: [Scapegoat rank]) whose one local shard is the
// ShardedTensor of this rank's TP shard chunked over the shard group (NOTE: [Nested
// ShardedTensors]). Loading (_sharded_pre_load_state_dict_hook) takes the extension's
// pre_load_state_dict_transform (the inner ShardedTensor and its shards for the nested form),
// all-gathers the chunks over the shard group (FSDP1 all-gathers them into its flat parameter)
// and keeps this rank's rows of the result, so any shard_placement_fn dim loads.
ShardedTensorStateDict sharded_tensor_state_dict(const torch::nn::Module& module) {
  const auto params = params_of(module);
  ShardedTensorStateDict out;
  for (auto& kv : entries(module)) {
    at::NoGradGuard no_grad;
    auto it = params.find(kv.second.unsafeGetTensorImpl());
    if (it == params.end()) {
      out.emplace_back(kv.first, kv.second.detach());
      continue;
    }
    const FSDPState& st = *it->second.state;
    const at::Tensor value = it->second.param->tp_spec ? to_tp_dtensor(it->second) : full_tensor(kv.second.detach());
    out.emplace_back(kv.first, ext_chunk_tensor(value, static_cast<int>(st.shard_rank()), static_cast<int>(st.shard_size()),
                                                devices_per_node(st.device()), st.shard_group(), st.ext()));
  }
  return out;
}

void load_sharded_tensor_state_dict(torch::nn::Module& module, const ShardedTensorStateDict& state, bool strict) {
  static const char* fn = "fsdp::load_sharded_tensor_state_dict";
  auto targets = entries(module);
  const auto params = params_of(module);
  std::map<std::string, ShardedTensorStateDict::value_type::second_type> values(state.begin(), state.end());
  check_names(targets, values, strict, fn, [](const std::variant<at::Tensor, sharded::ShardedTensor>& v) {
    return v.index() == 0 ? std::get<0>(v).sizes().vec() : std::get<1>(v).size();
  });
  // Checks of every ShardedTensor value first (the same on every rank for a state dict of a
  // model sharded alike).
  struct Load {
    const Managed* m;
    at::Tensor target;
    sharded::ShardedTensor inner;
    std::vector<sharded::Shard> shards;
  };
  std::vector<Load> loads;
  for (auto& kv : targets) {
    auto it = values.find(kv.first);
    if (it == values.end() || it->second.index() == 0) continue;
    auto m = params.find(kv.second.unsafeGetTensorImpl());
    TORCH_CHECK(m != params.end(), fn, ": entry '", kv.first, "' is a ShardedTensor but the module's '", kv.first,
                "' is not a parameter sharded by fully_shard");
    const FSDPParam& p = *m->second.param;
    auto transformed = ext_pre_load_state_dict_transform(std::get<1>(it->second), m->second.state->ext());
    const sharded::ShardedTensor& inner = transformed.first;
    TORCH_CHECK(c10::IntArrayRef(inner.size()) == c10::IntArrayRef(p.global_shape), fn, ": entry '", kv.first,
                "': the tensor to load on this rank has shape ", c10::IntArrayRef(inner.size()), " but FSDP shards ",
                c10::IntArrayRef(p.global_shape), p.tp_spec ? " (this rank's tensor-parallel shard)" : "");
    TORCH_CHECK(inner.dtype() == p.orig_dtype, fn, ": entry '", kv.first, "' has dtype ", inner.dtype(),
                " but the parameter's is ", p.orig_dtype);
    const int64_t n = p.global_shape[0], ws = m->second.state->shard_size(), r = m->second.state->shard_rank();
    const int64_t c = (n + ws - 1) / ws;
    const int64_t rows = std::max<int64_t>(0, std::min(c, n - r * c));
    const auto& shards = transformed.second;
    bool ok = shards.size() == (rows > 0 ? 1u : 0u) || (rows == 0 && shards.size() == 1 && shards[0].metadata.shard_sizes()[0] == 0);
    if (ok && !shards.empty()) {
      const auto& md = shards[0].metadata;
      std::vector<int64_t> offsets(p.global_shape.size(), 0), sizes = p.global_shape;
      offsets[0] = std::min(r * c, n);
      sizes[0] = rows;
      ok = !shards[0].is_nested() && md.shard_offsets() == offsets && md.shard_sizes() == sizes;
    }
    TORCH_CHECK(ok, fn, ": entry '", kv.first, "': this rank (shard-group rank ", r, " of ", ws,
                ") must hold exactly rows [", std::min(r * c, n), ", ", std::min(r * c, n) + rows,
                ") of dim 0 (torch.chunk over the FSDP shard group, as chunk_tensor makes them), but holds ",
                shards.size(), " shard(s)", shards.empty() ? std::string() : " at offsets " + c10::str(c10::IntArrayRef(shards[0].metadata.shard_offsets())));
    loads.push_back({&m->second, kv.second, inner, shards});
  }
  // Plain values, then the ShardedTensors (collective over each parameter's shard group).
  for (auto& kv : targets) {
    auto it = values.find(kv.first);
    if (it == values.end() || it->second.index() == 1) continue;
    auto m = params.find(kv.second.unsafeGetTensorImpl());
    load_entry(kv.first, std::get<0>(it->second), kv.second, m == params.end() ? nullptr : &m->second);
  }
  for (auto& l : loads) {
    at::NoGradGuard no_grad;
    const FSDPParam& p = *l.m->param;
    const FSDPState& st = *l.m->state;
    const int64_t n = p.global_shape[0], ws = st.shard_size();
    const int64_t c = (n + ws - 1) / ws;
    std::vector<int64_t> block = p.global_shape;
    block[0] = c;
    at::Tensor input = at::zeros(block, at::TensorOptions().dtype(p.orig_dtype).device(st.device()));
    if (!l.shards.empty() && l.shards[0].tensor.numel() > 0) {
      input.narrow(0, 0, l.shards[0].tensor.size(0)).copy_(l.shards[0].tensor);
    }
    block[0] = c * ws;
    at::Tensor gathered = at::empty(block, input.options());
    st.shard_group()->all_gather_into(gathered, input);
    const int64_t d = p.global_shape[static_cast<size_t>(p.shard_dim)];
    at::Tensor mine = gathered.narrow(0, 0, n).narrow(p.shard_dim, std::min(st.shard_rank() * p.chunk, d),
                                                      p.rows_of(st.shard_rank()));
    local_tensor(l.target).copy_(mine);
  }
}

}  // namespace fsdp
}  // namespace dtensor
