// dtensor/nn/module_surgery.cpp: see NOTE: [Parameter swap].
#include "dtensor/nn/module_surgery.h"

#include "dtensor/tensor/dtensor.h"
#include "dtensor/tensor/dtensor_impl.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

namespace dtensor {
namespace nn {

namespace {

// Module::parameters_ is protected: a derived class may name it, which gives a
// pointer-to-member that works on any Module.
struct RegistryAccess : torch::nn::Module {
  static torch::OrderedDict<std::string, at::Tensor>& parameters_of(torch::nn::Module& m) {
    return m.*(&RegistryAccess::parameters_);
  }
};

struct MemberEntry {
  std::string module_type;
  std::string name;
  ParameterMember member;
};

std::mutex g_members_mu;

std::vector<MemberEntry>& members() {
  static std::vector<MemberEntry> m;
  return m;
}

const bool builtin_members_registered = [] {
  register_parameter_member<torch::nn::LinearImpl>("weight", &torch::nn::LinearImpl::weight);
  register_parameter_member<torch::nn::LinearImpl>("bias", &torch::nn::LinearImpl::bias);
  register_parameter_member<torch::nn::EmbeddingImpl>("weight", &torch::nn::EmbeddingImpl::weight);
  register_parameter_member<torch::nn::LayerNormImpl>("weight", &torch::nn::LayerNormImpl::weight);
  register_parameter_member<torch::nn::LayerNormImpl>("bias", &torch::nn::LayerNormImpl::bias);
  return true;
}();

// The member of `name` in `module`, or nullptr; `known_types` gets the types registered for
// this name (for the error message).
at::Tensor* find_member(torch::nn::Module& module, const std::string& name, std::string* known_types) {
  std::vector<MemberEntry> snapshot;
  {
    std::lock_guard<std::mutex> lk(g_members_mu);
    snapshot = members();
  }
  for (auto it = snapshot.rbegin(); it != snapshot.rend(); ++it) {
    if (it->name != name) continue;
    if (at::Tensor* t = it->member(module)) return t;
    if (known_types) *known_types += (known_types->empty() ? "" : ", ") + it->module_type;
  }
  return nullptr;
}

std::string parameter_names(torch::nn::Module& module) {
  std::ostringstream os;
  bool first = true;
  for (const auto& kv : RegistryAccess::parameters_of(module)) {
    os << (first ? "" : ", ") << kv.key() << (kv.value().defined() ? "" : " (undefined)");
    first = false;
  }
  return first ? "none" : os.str();
}

}  // namespace

void register_parameter_member(const std::string& module_type, const std::string& name, ParameterMember member) {
  TORCH_CHECK(member != nullptr, "register_parameter_member: null accessor for ", module_type, ".", name);
  std::lock_guard<std::mutex> lk(g_members_mu);
  members().push_back({module_type, name, std::move(member)});
}

bool has_parameter_member(torch::nn::Module& module, const std::string& name) {
  return find_member(module, name, nullptr) != nullptr;
}

void swap_parameter(torch::nn::Module& module, const std::string& name, at::Tensor value) {
  auto& registry = RegistryAccess::parameters_of(module);
  at::Tensor* registered = registry.find(name);
  TORCH_CHECK(registered != nullptr && registered->defined(), "swap_parameter: ", module.name(),
              " has no parameter '", name, "' to replace (its parameters: ", parameter_names(module), ")");
  TORCH_CHECK(value.defined(), "swap_parameter: the new value of ", module.name(), ".", name, " is undefined");
  TORCH_CHECK(value.sizes() == registered->sizes(), "swap_parameter: ", module.name(), ".", name, " has shape ",
              registered->sizes(), " but the new value has shape ", value.sizes(),
              "; a DTensor replacing a parameter keeps its global shape");
  std::string known;
  at::Tensor* member = find_member(module, name, &known);
  TORCH_CHECK(member != nullptr, "swap_parameter: no member of ", module.name(), " is known to hold parameter '",
              name, "'", known.empty() ? std::string() : " (it is known for " + known + ")",
              ". Register it once with dtensor::nn::register_parameter_member<YourModuleImpl>(\"", name,
              "\", &YourModuleImpl::member) so that forward() sees the new tensor");
  const bool requires_grad = registered->requires_grad();
  if (!value.is_leaf()) value = value.detach();
  if (value.requires_grad() != requires_grad) value.set_requires_grad(requires_grad);
  *registered = value;
  *member = value;
}

at::Tensor get_parameter(torch::nn::Module& module, const std::string& name) {
  at::Tensor* registered = RegistryAccess::parameters_of(module).find(name);
  return registered ? *registered : at::Tensor();
}

void to_empty(torch::nn::Module& module, c10::Device device) {
  std::unordered_map<const c10::TensorImpl*, at::Tensor> made;  // tied parameters stay tied
  auto empty_like_on = [&](const at::Tensor& p) {
    at::NoGradGuard no_grad;
    if (!is_dtensor(p)) return at::empty(p.sizes(), p.options().device(device).requires_grad(false));
    const at::Tensor& local = local_tensor(p);
    return make_dtensor(at::empty(local.sizes(), local.options().device(device).requires_grad(false)), get_spec(p));
  };
  auto replace_in = [&](torch::nn::Module& m, const std::string& prefix) {
    for (const auto& kv : m.named_parameters(/*recurse=*/false)) {
      const at::Tensor& p = kv.value();
      if (!p.defined()) continue;
      auto it = made.find(p.unsafeGetTensorImpl());
      if (it == made.end()) it = made.emplace(p.unsafeGetTensorImpl(), empty_like_on(p)).first;
      swap_parameter(m, kv.key(), it->second);
    }
    for (const auto& kv : m.named_buffers(/*recurse=*/false)) {
      TORCH_CHECK(!kv.value().defined() || !kv.value().is_meta(), "to_empty: buffer '", prefix, kv.key(), "' of ",
                  m.name(), " is on the meta device; buffers are not replaced: build them on ", device);
    }
  };
  replace_in(module, "");
  for (const auto& kv : module.named_modules(/*name_prefix=*/"", /*include_self=*/false)) replace_in(*kv.value(), kv.key() + ".");
}

std::vector<std::pair<std::string, at::Tensor>> named_parameters(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& kv : module.named_parameters(/*recurse=*/true))
    if (seen.insert(kv.value().unsafeGetTensorImpl()).second) out.emplace_back(kv.key(), kv.value());
  return out;
}

std::vector<at::Tensor> parameters(const torch::nn::Module& module) {
  std::vector<at::Tensor> out;
  for (auto& kv : named_parameters(module)) out.push_back(std::move(kv.second));
  return out;
}

}  // namespace nn
}  // namespace dtensor
