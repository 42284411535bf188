// dtensor/parallel/api.cpp
#include "dtensor/parallel/api.h"

#include "dtensor/tensor/dtensor.h"

#include <c10/util/Exception.h>
#include <torch/nn/module.h>

#include <map>
#include <sstream>

namespace dtensor {

namespace {

// One fnmatch character class starting at pattern[p] == '[': "[1-2]", "[abc]", "[!0]".
// Returns the index after ']' and sets `matched`; npos when there is no closing ']' (the '['
// is then an ordinary character, as in Python's fnmatch).
size_t match_class(const std::string& pattern, size_t p, char c, bool& matched) {
  size_t i = p + 1;
  const bool negate = i < pattern.size() && pattern[i] == '!';
  if (negate) ++i;
  bool in = false;
  bool first = true;
  for (; i < pattern.size() && (first || pattern[i] != ']'); ++i, first = false) {
    if (i + 2 < pattern.size() && pattern[i + 1] == '-' && pattern[i + 2] != ']') {
      in = in || (pattern[i] <= c && c <= pattern[i + 2]);
      i += 2;
    } else {
      in = in || pattern[i] == c;
    }
  }
  if (i >= pattern.size()) return std::string::npos;
  matched = in != negate;
  return i + 1;
}

// Python's fnmatch over one name component (what PyTorch's parallelize_module uses): '*' any
// run, '?' one character, '[seq]' / '[!seq]' one character in (not in) seq, ranges a-b allowed.
bool glob_match(const std::string& pattern, const std::string& name) {
  size_t p = 0, n = 0, star = std::string::npos, resume = 0;
  while (n < name.size()) {
    bool step = false;
    size_t next = p + 1;
    if (p < pattern.size() && pattern[p] == '[') {
      bool in = false;
      const size_t end = match_class(pattern, p, name[n], in);
      if (end != std::string::npos) {
        step = in;
        next = end;
      } else {
        step = name[n] == '[';
      }
    } else if (p < pattern.size() && pattern[p] != '*') {
      step = pattern[p] == '?' || pattern[p] == name[n];
    }
    if (step) {
      p = next;
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
  // PyTorch's _validate_tp_mesh_dim (tensor/parallel/_utils.py): tensor parallelism is the
  // innermost dim of its parent mesh, the one FSDP x TP composes with (FSDP dims first).
  if (auto parent = mesh.get_parent_mesh()) {
    const int64_t dim = mesh.get_parent_mesh_dims().at(0);
    TORCH_CHECK(dim == parent->ndim() - 1, "parallelize_module: the tensor-parallel mesh ", mesh.to_string(),
                " is dim ", dim, " of its parent mesh ", parent->to_string(),
                "; tensor parallelism must be the innermost (last) dim of its parent mesh, e.g. "
                "init_device_mesh(\"cpu\", {dp, tp}, {\"dp\", \"tp\"}) and mesh[\"tp\"]");
  }
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
                                      const ParallelizePlan& plan, std::optional<int64_t> src_data_rank) {
  check_mesh(mesh);
  auto self = shared(module);
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
    // "" is the module itself (PyTorch's shortcut for the root).
    std::vector<Match> found = entry.path.empty() ? std::vector<Match>{{"", self}} : matches(module, entry.path, failure);
    if (found.empty()) {
      // NOTE: [Unmatched plan keys warn]
      // PyTorch skips a plan key that resolves to no submodule with a warning (a plan written
      // for a family of models may name modules some members lack). Every rank warns alike.
      TORCH_WARN("parallelize_module: the plan entry '", entry.path, "' (", entry.style->to_string(),
                 ") matches no submodule (", failure, "); skipping it");
      continue;
    }
    for (auto& m : found) {
      entry.style->check(*m.module, m.path);
      if (entry.style->distributes_parameters()) {
        auto [it, fresh] = distributed_by.emplace(m.module.get(), entry.path);
        TORCH_CHECK(fresh, "parallelize_module: '", m.path.empty() ? std::string("the root module") : m.path,
                    "' is matched by the plan entries '", it->second, "' and '", entry.path,
                    "', which both distribute its parameters; give it one of them");
      }
      steps.push_back({m, entry.style.get()});
    }
  }
  // 2. Apply in plan order.
  detail::SrcDataRankGuard src(src_data_rank);
  for (auto& s : steps) s.style->apply(*s.target.module, mesh, s.target.path);
  return module;
}

torch::nn::Module& parallelize_module(torch::nn::Module& module, const DeviceMesh& mesh, const ParallelStyle& style,
                                      std::optional<int64_t> src_data_rank) {
  check_mesh(mesh);
  shared(module);
  style.check(module, "");
  detail::SrcDataRankGuard src(src_data_rank);
  style.apply(module, mesh, "");
  return module;
}

torch::nn::Module& parallelize_module(torch::nn::Module& module, const ParallelizePlan& plan) {
  return parallelize_module(module, current_mesh(), plan);
}
torch::nn::Module& parallelize_module(torch::nn::Module& module, const ParallelStyle& style) {
  return parallelize_module(module, current_mesh(), style);
}

}  // namespace dtensor
