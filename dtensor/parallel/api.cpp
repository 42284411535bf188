// dtensor/parallel/api.cpp
#include "dtensor/parallel/api.h"

#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <map>
#include <sstream>

namespace dtensor {

namespace {

// fnmatch-style glob over one name component: '*' any run, '?' one character.
bool glob_match(const std::string& pattern, const std::string& name) {
  size_t p = 0, n = 0, star = std::string::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == name[n])) {
      ++p;
      ++n;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      resume = n;
    } else if (star != std::string::npos) {
      p = star + 1;
      n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> atoms;
  std::string cur;
  for (char c : path) {
    if (c == '.') {
      atoms.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  atoms.push_back(cur);
  for (const auto& a : atoms)
    TORCH_CHECK(!path.empty() && !a.empty(), "parallelize_module: the plan path '", path,
                "' has an empty component; use dotted child names such as 'layers.*.attention.wq'");
  return atoms;
}

struct Match {
  std::string path;
  std::shared_ptr<torch::nn::Module> module;
};

// Depth-first over the children matching atoms[i]; `failure` keeps the first place where
// nothing matched (for the error message).
void match(const std::shared_ptr<torch::nn::Module>& module, const std::string& prefix,
           const std::vector<std::string>& atoms, size_t i, std::vector<Match>& out, std::string& failure) {
  if (i == atoms.size()) {
    out.push_back({prefix, module});
    return;
  }
  bool any = false;
  std::ostringstream names;
  for (const auto& child : module->named_children()) {
    names << (names.tellp() > 0 ? ", " : "") << child.key();
    if (!glob_match(atoms[i], child.key())) continue;
    any = true;
    match(child.value(), prefix.empty() ? child.key() : prefix + "." + child.key(), atoms, i + 1, out, failure);
  }
  if (!any && failure.empty()) {
    const std::string children = names.str();
    failure = "no child of " + (prefix.empty() ? std::string("the root module") : "'" + prefix + "'") +
              " matches '" + atoms[i] + "' (children: " + (children.empty() ? "none" : children) + ")";
  }
}

std::vector<Match> matches(torch::nn::Module& module, const std::string& pattern, std::string& failure) {
  std::vector<Match> out;
  match(module.shared_from_this(), "", split_path(pattern), 0, out, failure);
  return out;
}

void check_mesh(const DeviceMesh& mesh) {
  TORCH_CHECK(mesh.ndim() == 1, "parallelize_module: tensor parallelism takes a 1-D device mesh, got ",
              mesh.to_string(), "; slice the tensor-parallel dim, e.g. mesh[\"tp\"]");
}

std::shared_ptr<torch::nn::Module> shared(torch::nn::Module& module) {
  std::shared_ptr<torch::nn::Module> p = module.weak_from_this().lock();
  TORCH_CHECK(p != nullptr, "parallelize_module: the ", module.name(),
              " is not owned by a std::shared_ptr; create it through its ModuleHolder or std::make_shared "
              "(its forward hooks are keyed by module)");
  return p;
}

}  // namespace

std::vector<std::string> match_module_paths(torch::nn::Module& module, const std::string& pattern) {
  shared(module);
  std::string failure;
  std::vector<std::string> out;
  for (auto& m : matches(module, pattern, failure)) out.push_back(m.path);
  return out;
}

torch::nn::Module& parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh,
                                      const ParallelizePlan& plan) {
  check_mesh(mesh);
  shared(module);
  // 1. Resolve and check every entry (local; identical on every rank).
  struct Step {
    Match target;
    const ParallelStyle* style;
  };
  std::vector<Step> steps;
  std::map<const torch::nn::Module*, std::string> distributed_by;  // module -> entry that owns its params
  for (const auto& entry : plan) {
    TORCH_CHECK(entry.style != nullptr, "parallelize_module: the plan entry '", entry.path, "' has no style");
    std::string failure;
    std::vector<Match> found = matches(module, entry.path, failure);
    TORCH_CHECK(!found.empty(), "parallelize_module: the plan entry '", entry.path, "' (",
                entry.style->to_string(), ") matches no submodule: ", failure);
    for (auto& m : found) {
      entry.style->check(*m.module, m.path);
      if (entry.style->distributes_parameters()) {
        auto [it, fresh] = distributed_by.emplace(m.module.get(), entry.path);
        TORCH_CHECK(fresh, "parallelize_module: '", m.path, "' is matched by the plan entries '", it->second,
                    "' and '", entry.path, "', which both distribute its parameters; give it one of them");
      }
      steps.push_back({m, entry.style.get()});
    }
  }
  // 2. Apply in plan order.
  for (auto& s : steps) s.style->apply(*s.target.module, mesh, s.target.path);
  return module;
}

torch::nn::Module& parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelStyle& style) {
  check_mesh(mesh);
  shared(module);
  style.check(module, "");
  style.apply(module, mesh, "");
  return module;
}

}  // namespace dtensor
