// dtensor/checkpoint/state_dict.cpp: model and optimizer state dicts (see state_dict.h).
#include "dtensor/checkpoint/state_dict.h"

#include "dtensor/checkpoint/dist_wrapper.h"
#include "dtensor/checkpoint/load_internal.h"
#include "dtensor/comm/object_collectives.h"
#include "dtensor/nn/module_surgery.h"
#include "dtensor/placement/placement.h"
#include "dtensor/tensor/dtensor.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>

namespace dtensor {
namespace checkpoint {

namespace {

bool distributed() { return comm::is_initialized(); }
int my_rank() { return distributed() ? comm::default_group()->rank() : 0; }

using detail::join_keys;

// The value a state dict shows for `t`.
at::Tensor export_tensor(const at::Tensor& t, const StateDictOptions& o) {
  at::Tensor v = t;
  if (o.full_state_dict && is_dtensor(v)) v = full_tensor(v.detach());
  if (o.cpu_offload && !is_dtensor(v) && !v.device().is_cpu()) v = v.detach().cpu();
  return v;
}

// Copies `src` (a DTensor of any layout, or the full tensor) into `target` (a DTensor or a
// plain tensor). Collective when a DTensor must be redistributed or gathered.
void import_tensor(const std::string& key, const at::Tensor& target, const at::Tensor& src) {
  TORCH_CHECK(target.sizes() == src.sizes(), "state dict key '", key, "': shape ", src.sizes(),
              " does not match the target's ", target.sizes());
  TORCH_CHECK(target.scalar_type() == src.scalar_type(), "state dict key '", key, "': dtype ",
              src.scalar_type(), " does not match the target's ", target.scalar_type());
  if (target.unsafeGetTensorImpl() == src.unsafeGetTensorImpl()) return;  // loaded in place already
  c10::AutoGradMode no_grad(false);
  if (!is_dtensor(target)) {
    at::Tensor full = is_dtensor(src) ? full_tensor(src.detach()) : src;
    target.copy_(full);
    return;
  }
  const DTensorSpec& spec = get_spec(target);
  at::Tensor local = local_tensor(target);
  if (is_dtensor(src)) {
    const DTensorSpec& s = get_spec(src);
    if (s.mesh == spec.mesh) {
      at::Tensor r = s.placements == spec.placements ? src : redistribute(src.detach(), spec.mesh, spec.placements);
      local.copy_(local_tensor(r));
      return;
    }
    import_tensor(key, target, full_tensor(src.detach()));
    return;
  }
  if (!spec.mesh.get_coordinate()) return;
  auto [shape, offset] = compute_local_shape_and_global_offset(target.sizes(), spec.mesh, spec.placements);
  at::Tensor piece = src;
  for (size_t d = 0; d < shape.size(); ++d) piece = piece.narrow(int64_t(d), offset[d], shape[d]);
  local.copy_(piece);
}

// IValues that travel as JSON (broadcast_from_rank0 of non-tensor values).
nlohmann::json ivalue_to_json(const c10::IValue& v) {
  if (v.isInt()) return v.toInt();
  if (v.isDouble()) return v.toDouble();
  if (v.isBool()) return v.toBool();
  if (v.isDoubleList()) return v.toDoubleVector();
  TORCH_CHECK(false, "broadcast_from_rank0: cannot send a ", v.tagKind());
}
c10::IValue json_to_ivalue(const nlohmann::json& j) {
  if (j.is_boolean()) return j.get<bool>();
  if (j.is_number_integer()) return j.get<int64_t>();
  if (j.is_number()) return j.get<double>();
  return c10::List<double>(j.get<std::vector<double>>());
}

// The values of `targets` (key -> tensor to fill, in the same order on every rank) from `sd`.
// With broadcast_from_rank0, rank 0's full values are broadcast. Returns missing/unexpected.
LoadResult import_all(const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::vector<std::string>& object_keys,
                      const std::function<void(const std::string&, const c10::IValue&)>& set_object, const StateDict& sd,
                      const StateDictOptions& o, const char* what) {
  const bool dist = distributed();
  const bool use_mine = !o.broadcast_from_rank0 || my_rank() == 0;
  // 1. Keys, checked on every rank (rank 0 only with broadcast_from_rank0), raised everywhere.
  DistWrapper dw(nullptr, dist, 0);
  auto keys = dw.all_reduce(
      std::string(what) + " keys",
      [&] {
        std::vector<std::string> missing, unexpected;
        if (!use_mine) return std::make_pair(missing, unexpected);
        std::set<std::string> known;
        for (const auto& [k, t] : tensors) {
          known.insert(k);
          if (!sd.count(k)) missing.push_back(k);
        }
        for (const auto& k : object_keys) {
          known.insert(k);
          if (!sd.count(k)) missing.push_back(k);
        }
        for (const auto& [k, v] : sd) {
          if (!known.count(k)) unexpected.push_back(k);
        }
        TORCH_CHECK(!o.strict || (missing.empty() && unexpected.empty()), what, " (strict): missing keys ",
                    join_keys(missing), ", unexpected keys ", join_keys(unexpected));
        return std::make_pair(missing, unexpected);
      },
      [](std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> all) {
        std::set<std::string> m, u;
        for (const auto& [mm, uu] : all) {
          m.insert(mm.begin(), mm.end());
          u.insert(uu.begin(), uu.end());
        }
        return std::make_pair(std::vector<std::string>(m.begin(), m.end()),
                              std::vector<std::string>(u.begin(), u.end()));
      });
  LoadResult res{keys.first, keys.second};
  std::set<std::string> skip(res.missing_keys.begin(), res.missing_keys.end());
  auto value_of = [&](const std::string& k) -> const StateDictValue* {
    auto it = sd.find(k);
    return it == sd.end() ? nullptr : &it->second;
  };
  // 2. Tensors, in the targets' order (collectives line up on every rank).
  for (const auto& [k, target] : tensors) {
    if (skip.count(k)) continue;
    if (o.broadcast_from_rank0 && dist) {
      at::Tensor full = at::empty(target.sizes(), at::TensorOptions().dtype(target.scalar_type()));
      if (my_rank() == 0) {
        const auto* v = value_of(k);
        const at::Tensor& src = std::get<at::Tensor>(*v);
        full.copy_(is_dtensor(src) ? full_tensor(src.detach()) : src);
      }
      comm::default_group()->broadcast(full, 0);
      import_tensor(k, target, full);
      continue;
    }
    const auto* v = value_of(k);
    const at::Tensor* src = std::get_if<at::Tensor>(v);
    if (!src && std::holds_alternative<c10::IValue>(*v) && std::get<c10::IValue>(*v).isTensor()) {
      import_tensor(k, target, std::get<c10::IValue>(*v).toTensor());
      continue;
    }
    TORCH_CHECK(src, what, ": key '", k, "' is not a tensor");
    import_tensor(k, target, *src);
  }
  // 3. Other values.
  for (const auto& k : object_keys) {
    if (skip.count(k)) continue;
    c10::IValue v;
    if (use_mine) v = std::get<c10::IValue>(*value_of(k));
    if (o.broadcast_from_rank0 && dist) {
      auto j = comm::broadcast_object(*comm::default_group(), use_mine ? ivalue_to_json(v) : nlohmann::json(), 0);
      v = json_to_ivalue(j);
    }
    set_object(k, v);
  }
  return res;
}

std::vector<std::pair<std::string, at::Tensor>> model_tensors(const torch::nn::Module& model) {
  auto out = nn::named_parameters(model);
  for (const auto& kv : model.named_buffers(/*recurse=*/true)) {
    if (kv.value().defined()) out.emplace_back(kv.key(), kv.value());
  }
  return out;
}

// ---- optimizers --------------------------------------------------------------------------------

using StateMap = std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>;
using StateKey = typename StateMap::key_type;

// libtorch keys optimizer state by the parameter's TensorImpl (a string in 1.x, a pointer in 2.x).
template <class Key>
Key state_key_as(c10::TensorImpl* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream os;  // what c10::guts::to_string(impl) gives (libtorch 1.x)
    os << static_cast<const void*>(impl);
    return os.str();
  } else {
    return static_cast<Key>(impl);
  }
}
StateKey state_key(const at::Tensor& p) { return state_key_as<StateKey>(p.unsafeGetTensorImpl()); }

enum class OptimKind { SGD, Adam, AdamW };

OptimKind kind_of(torch::optim::Optimizer& optim) {
  if (dynamic_cast<torch::optim::SGD*>(&optim)) return OptimKind::SGD;
  if (dynamic_cast<torch::optim::AdamW*>(&optim)) return OptimKind::AdamW;
  if (dynamic_cast<torch::optim::Adam*>(&optim)) return OptimKind::Adam;
  TORCH_CHECK(false, "optimizer state dict: only SGD, Adam and AdamW are supported");
}

at::Tensor zeros_like_param(const at::Tensor& p) {
  if (is_dtensor(p)) {
    const DTensorSpec& s = get_spec(p);
    return dtensor::zeros(p.sizes(), s.mesh, s.placements, at::TensorOptions().dtype(p.scalar_type()));
  }
  return at::zeros_like(p, at::MemoryFormat::Preserve);
}

// One parameter of the optimizer: its name, tensor and group.
struct OptParam {
  std::string fqn;
  at::Tensor param;
  torch::optim::OptimizerParamGroup* group;
};

std::vector<OptParam> optimizer_params(const torch::nn::Module& model, torch::optim::Optimizer& optim) {
  std::map<const void*, std::string> names;
  for (const auto& [n, p] : nn::named_parameters(model)) names.emplace(p.unsafeGetTensorImpl(), n);
  std::vector<OptParam> out;
  for (auto& g : optim.param_groups()) {
    for (auto& p : g.params()) {
      auto it = names.find(p.unsafeGetTensorImpl());
      TORCH_CHECK(it != names.end(), "optimizer state dict: the optimizer has a parameter of shape ", p.sizes(),
                  " that is not a parameter of the model");
      out.push_back({it->second, p, &g});
    }
  }
  return out;
}

// The state tensors of `p` (created as its first step would when missing), by name.
std::vector<std::pair<std::string, at::Tensor*>> state_tensors(torch::optim::Optimizer& optim, OptimKind kind,
                                                               const OptParam& op, int64_t** step) {
  auto& state = optim.state();
  auto key = state_key(op.param);
  auto it = state.find(key);
  std::vector<std::pair<std::string, at::Tensor*>> out;
  *step = nullptr;
  if (kind == OptimKind::SGD) {
    auto& opts = static_cast<torch::optim::SGDOptions&>(op.group->options());
    if (opts.momentum() == 0) return out;
    if (it == state.end()) {
      auto s = std::make_unique<torch::optim::SGDParamState>();
      s->momentum_buffer(zeros_like_param(op.param));
      it = state.emplace(key, std::move(s)).first;
    }
    auto& s = static_cast<torch::optim::SGDParamState&>(*it->second);
    out.emplace_back("momentum_buffer", &s.momentum_buffer());
    return out;
  }
  auto fill = [&](auto& s, bool amsgrad) {
    if (!s.exp_avg().defined()) s.exp_avg(zeros_like_param(op.param));
    if (!s.exp_avg_sq().defined()) s.exp_avg_sq(zeros_like_param(op.param));
    if (amsgrad && !s.max_exp_avg_sq().defined()) s.max_exp_avg_sq(zeros_like_param(op.param));
    out.emplace_back("exp_avg", &s.exp_avg());
    out.emplace_back("exp_avg_sq", &s.exp_avg_sq());
    if (amsgrad) out.emplace_back("max_exp_avg_sq", &s.max_exp_avg_sq());
    *step = &s.step();
  };
  if (kind == OptimKind::Adam) {
    bool amsgrad = static_cast<torch::optim::AdamOptions&>(op.group->options()).amsgrad();
    if (it == state.end()) it = state.emplace(key, std::make_unique<torch::optim::AdamParamState>()).first;
    fill(static_cast<torch::optim::AdamParamState&>(*it->second), amsgrad);
  } else {
    bool amsgrad = static_cast<torch::optim::AdamWOptions&>(op.group->options()).amsgrad();
    if (it == state.end()) it = state.emplace(key, std::make_unique<torch::optim::AdamWParamState>()).first;
    fill(static_cast<torch::optim::AdamWParamState&>(*it->second), amsgrad);
  }
  return out;
}

// The options of a group as named values, and how to set each.
std::vector<std::pair<std::string, c10::IValue>> group_options(OptimKind kind, torch::optim::OptimizerOptions& o) {
  auto betas = [](const std::tuple<double, double>& b) {
    return c10::IValue(c10::List<double>({std::get<0>(b), std::get<1>(b)}));
  };
  if (kind == OptimKind::SGD) {
    auto& s = static_cast<torch::optim::SGDOptions&>(o);
    return {{"lr", s.lr()}, {"momentum", s.momentum()}, {"dampening", s.dampening()},
            {"weight_decay", s.weight_decay()}, {"nesterov", s.nesterov()}};
  }
  auto adam_like = [&](auto& a) -> std::vector<std::pair<std::string, c10::IValue>> {
    return {{"lr", a.lr()}, {"betas", betas(a.betas())}, {"eps", a.eps()},
            {"weight_decay", a.weight_decay()}, {"amsgrad", a.amsgrad()}};
  };
  if (kind == OptimKind::Adam) return adam_like(static_cast<torch::optim::AdamOptions&>(o));
  return adam_like(static_cast<torch::optim::AdamWOptions&>(o));
}

void set_group_option(OptimKind kind, torch::optim::OptimizerOptions& o, const std::string& name,
                      const c10::IValue& v) {
  auto num = [&] { return v.isInt() ? double(v.toInt()) : v.toDouble(); };
  if (kind == OptimKind::SGD) {
    auto& s = static_cast<torch::optim::SGDOptions&>(o);
    if (name == "lr") s.lr(num());
    else if (name == "momentum") s.momentum(num());
    else if (name == "dampening") s.dampening(num());
    else if (name == "weight_decay") s.weight_decay(num());
    else if (name == "nesterov") s.nesterov(v.toBool());
    return;
  }
  auto adam_like = [&](auto& a) {
    if (name == "lr") a.lr(num());
    else if (name == "betas") {
      auto b = v.toDoubleVector();
      TORCH_CHECK(b.size() == 2, "optimizer state dict: betas must have 2 values");
      a.betas(std::make_tuple(b[0], b[1]));
    } else if (name == "eps") a.eps(num());
    else if (name == "weight_decay") a.weight_decay(num());
    else if (name == "amsgrad") a.amsgrad(v.toBool());
  };
  if (kind == OptimKind::Adam) adam_like(static_cast<torch::optim::AdamOptions&>(o));
  else adam_like(static_cast<torch::optim::AdamWOptions&>(o));
}

// ---- PyTorch's layout of optimizer state dicts (StateDictOptions::pytorch_layout) ----------------

// PyTorch's group options that libtorch's optimizers lack, with the values libtorch's behave as.
std::vector<std::pair<std::string, c10::IValue>> pytorch_only_options(OptimKind kind) {
  std::vector<std::pair<std::string, c10::IValue>> out = {
      {"maximize", false}, {"foreach", c10::IValue()}, {"differentiable", false}, {"fused", c10::IValue()}};
  if (kind != OptimKind::SGD) {
    out.emplace_back("capturable", false);
    out.emplace_back("decoupled_weight_decay", kind == OptimKind::AdamW);
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The tensor a state dict value holds, if it holds one.
std::optional<at::Tensor> tensor_of(const StateDictValue& v) {
  if (const auto* t = std::get_if<at::Tensor>(&v)) return *t;
  if (const auto* iv = std::get_if<c10::IValue>(&v); iv && iv->isTensor()) return iv->toTensor();
  return std::nullopt;
}

// A state dict in PyTorch's layout, in ours (see StateDictOptions::pytorch_layout).
StateDict from_pytorch_layout(const StateDict& sd, OptimKind kind) {
  StateDict out;
  std::map<std::string, std::map<std::string, c10::IValue>> groups;  // group index -> option -> value
  static const std::string kGroups = "param_groups.";
  for (const auto& [k, v] : sd) {
    if (k.compare(0, kGroups.size(), kGroups) != 0) {
      std::optional<at::Tensor> t = k.compare(0, 6, "state.") == 0 && ends_with(k, ".step") ? tensor_of(v) : std::nullopt;
      if (t) {
        TORCH_CHECK(t->numel() == 1, "optimizer state dict: '", k, "' has ", t->numel(), " elements, not one step count");
        const at::Tensor local = is_dtensor(*t) ? local_tensor(*t) : *t;  // a 0-dim DTensor is replicated
        out[k] = c10::IValue(int64_t(std::llround(local.item<double>())));
      } else {
        out[k] = v;
      }
      continue;
    }
    const std::string rest = k.substr(kGroups.size());
    const size_t dot = rest.find('.');
    const auto* iv = std::get_if<c10::IValue>(&v);
    TORCH_CHECK(dot != std::string::npos && iv, "optimizer state dict in PyTorch's layout: '", k,
                "' is not a group option (param_groups.<group>.<option>)");
    groups[rest.substr(0, dot)][rest.substr(dot + 1)] = *iv;
  }
  // The names group_options gives.
  const std::set<std::string> ours = kind == OptimKind::SGD
                                         ? std::set<std::string>{"lr", "momentum", "dampening", "weight_decay", "nesterov"}
                                         : std::set<std::string>{"lr", "betas", "eps", "weight_decay", "amsgrad"};
  for (const auto& [g, options] : groups) {
    const std::string where = "group " + g + " of PyTorch's optimizer state dict";
    auto params = options.find("params");
    TORCH_CHECK(params != options.end() && params->second.isList(), where, " has no 'params' list of parameter names");
    for (const auto& [name, value] : options) {
      if ((name == "maximize" || name == "differentiable") && value.isBool()) {
        TORCH_CHECK(!value.toBool(), where, " has ", name, "=True, which libtorch's optimizers do not do");
      }
      if (name == "decoupled_weight_decay" && value.isBool()) {
        TORCH_CHECK(value.toBool() == (kind == OptimKind::AdamW), where, " has decoupled_weight_decay=",
                    value.toBool() ? "True (AdamW's update)" : "False (Adam's update)", ", this optimizer is ",
                    kind == OptimKind::AdamW ? "AdamW" : "Adam");
      }
    }
    for (const auto& p : params->second.toListRef()) {
      TORCH_CHECK(p.isString(), where, ": 'params' holds a ", p.tagKind(), ", not a parameter name");
      for (const auto& [name, value] : options) {
        if (!ours.count(name)) continue;  // PyTorch's own (checked above), a scheduler's initial_lr, ...
        c10::IValue v = value;
        if (v.isTuple()) {  // betas
          c10::List<double> l;
          for (const auto& e : v.toTupleRef().elements()) l.push_back(e.isInt() ? double(e.toInt()) : e.toDouble());
          v = l;
        }
        out["param_groups." + p.toStringRef() + "." + name] = v;
      }
    }
  }
  return out;
}

bool rank0_only(const StateDictOptions& o) { return o.full_state_dict && o.cpu_offload && my_rank() != 0; }

}  // namespace

StateDict get_model_state_dict(const torch::nn::Module& model, const StateDictOptions& options) {
  StateDict sd;
  for (const auto& [k, t] : model_tensors(model)) sd[k] = export_tensor(t, options);
  if (rank0_only(options)) sd.clear();
  return sd;
}

LoadResult set_model_state_dict(torch::nn::Module& model, const StateDict& state_dict, const StateDictOptions& options) {
  return import_all(model_tensors(model), {}, {}, state_dict, options, "set_model_state_dict");
}

StateDict get_optimizer_state_dict(const torch::nn::Module& model, torch::optim::Optimizer& optim,
                                   const StateDictOptions& options) {
  OptimKind kind = kind_of(optim);
  StateDict sd;
  std::map<const torch::optim::OptimizerParamGroup*, c10::List<std::string>> group_params;
  for (const auto& op : optimizer_params(model, optim)) {
    int64_t* step = nullptr;
    for (const auto& [name, t] : state_tensors(optim, kind, op, &step)) {
      sd["state." + op.fqn + "." + name] = export_tensor(*t, options);
    }
    if (step) {
      if (options.pytorch_layout) {
        sd["state." + op.fqn + ".step"] = at::scalar_tensor(double(*step), at::kFloat);
      } else {
        sd["state." + op.fqn + ".step"] = c10::IValue(*step);
      }
    }
    if (options.pytorch_layout) {
      group_params[op.group].push_back(op.fqn);
      continue;
    }
    for (const auto& [name, v] : group_options(kind, op.group->options())) {
      sd["param_groups." + op.fqn + "." + name] = v;
    }
  }
  if (options.pytorch_layout) {
    auto& groups = optim.param_groups();
    for (size_t i = 0; i < groups.size(); ++i) {
      const std::string prefix = "param_groups." + std::to_string(i) + ".";
      auto options_of = group_options(kind, groups[i].options());
      for (auto& o : pytorch_only_options(kind)) options_of.push_back(std::move(o));
      for (const auto& [name, v] : options_of) {
        // PyTorch's betas are a tuple.
        sd[prefix + name] = name == "betas" ? c10::IValue(c10::ivalue::Tuple::create(
                                                  {v.toDoubleVector().at(0), v.toDoubleVector().at(1)}))
                                            : v;
      }
      auto it = group_params.find(&groups[i]);
      sd[prefix + "params"] = it != group_params.end() ? it->second : c10::List<std::string>();
    }
  }
  if (rank0_only(options)) sd.clear();
  return sd;
}

LoadResult set_optimizer_state_dict(const torch::nn::Module& model, torch::optim::Optimizer& optim,
                                    const StateDict& state_dict, const StateDictOptions& options) {
  OptimKind kind = kind_of(optim);
  if (options.pytorch_layout) {
    StateDictOptions ours = options;
    ours.pytorch_layout = false;
    return set_optimizer_state_dict(model, optim, from_pytorch_layout(state_dict, kind), ours);
  }
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::vector<std::string> objects;
  std::map<std::string, int64_t*> steps;
  std::map<std::string, torch::optim::OptimizerOptions*> groups;
  for (const auto& op : optimizer_params(model, optim)) {
    int64_t* step = nullptr;
    for (const auto& [name, t] : state_tensors(optim, kind, op, &step)) {
      tensors.emplace_back("state." + op.fqn + "." + name, *t);
    }
    if (step) {
      objects.push_back("state." + op.fqn + ".step");
      steps[objects.back()] = step;
    }
    for (const auto& [name, v] : group_options(kind, op.group->options())) {
      objects.push_back("param_groups." + op.fqn + "." + name);
      groups[objects.back()] = &op.group->options();
    }
  }
  return import_all(
      tensors, objects,
      [&](const std::string& k, const c10::IValue& v) {
        if (auto it = steps.find(k); it != steps.end()) {
          *it->second = v.toInt();
          return;
        }
        set_group_option(kind, *groups.at(k), k.substr(k.rfind('.') + 1), v);
      },
      state_dict, options, "set_optimizer_state_dict");
}

StateDict with_prefix(const StateDict& state_dict, const std::string& prefix) {
  StateDict out;
  for (const auto& [k, v] : state_dict) out.emplace(prefix + k, v);
  return out;
}

StateDict strip_prefix(const StateDict& state_dict, const std::string& prefix) {
  StateDict out;
  for (const auto& [k, v] : state_dict) {
    if (k.compare(0, prefix.size(), prefix) == 0) out.emplace(k.substr(prefix.size()), v);
  }
  return out;
}

}  // namespace checkpoint
}  // namespace dtensor
