// dtensor/nn/hooks.cpp: see NOTE: [Hook registry].
#include "dtensor/nn/hooks.h"

#include <c10/util/Exception.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace dtensor {
namespace nn {

namespace {

struct Entry {
  std::weak_ptr<torch::nn::Module> owner;
  std::vector<std::pair<uint64_t, ForwardPreHook>> pre;
  std::vector<std::pair<uint64_t, ForwardHook>> post;
  std::pair<uint64_t, ForwardOverride> override_fn{0, nullptr};  // id 0: none
  size_t size() const { return pre.size() + post.size() + (override_fn.first != 0 ? 1 : 0); }
};

std::mutex g_mu;
std::unordered_map<const torch::nn::Module*, Entry> g_entries;  // guarded by g_mu
std::atomic<size_t> g_num_entries{0};
uint64_t g_next_id = 1;  // guarded by g_mu

// The live entry of `module`, or nullptr; drops an entry whose module died. Holds g_mu.
Entry* live_entry(const torch::nn::Module* module) {
  auto it = g_entries.find(module);
  if (it == g_entries.end()) return nullptr;
  auto alive = it->second.owner.lock();
  if (!alive || alive.get() != module || it->second.size() == 0) {
    g_entries.erase(it);
    g_num_entries.store(g_entries.size());
    return nullptr;
  }
  return &it->second;
}

// Drops every entry whose module died, releasing what its hooks hold (a hook of a parallel
// style holds the DeviceMesh, hence its groups). Holds g_mu.
void sweep_dead_entries() {
  for (auto it = g_entries.begin(); it != g_entries.end();) {
    if (it->second.owner.expired()) it = g_entries.erase(it);
    else ++it;
  }
  g_num_entries.store(g_entries.size());
}

// Holds g_mu.
Entry& entry_for(torch::nn::Module& module, const char* what) {
  sweep_dead_entries();
  std::weak_ptr<torch::nn::Module> owner = module.weak_from_this();
  TORCH_CHECK(!owner.expired(), what, ": the ", module.name(),
              " is not owned by a std::shared_ptr; hooks are keyed by module and must be able to tell when it "
              "dies. Create it through its ModuleHolder (e.g. torch::nn::Linear) or std::make_shared");
  if (Entry* e = live_entry(&module)) return *e;
  Entry& e = g_entries[&module];
  e.owner = owner;
  g_num_entries.store(g_entries.size());
  return e;
}

}  // namespace

void RemovableHandle::remove() {
  if (module_ == nullptr) return;
  std::lock_guard<std::mutex> lk(g_mu);
  if (Entry* e = live_entry(module_)) {
    auto drop = [&](auto& v) {
      for (auto it = v.begin(); it != v.end(); ++it)
        if (it->first == id_) {
          v.erase(it);
          return;
        }
    };
    drop(e->pre);
    drop(e->post);
    if (e->override_fn.first == id_) e->override_fn = {0, nullptr};
    live_entry(module_);  // drops the entry when it became empty
  }
  module_ = nullptr;
}

bool RemovableHandle::is_active() const {
  if (module_ == nullptr) return false;
  std::lock_guard<std::mutex> lk(g_mu);
  Entry* e = live_entry(module_);
  if (!e) return false;
  for (auto& h : e->pre)
    if (h.first == id_) return true;
  for (auto& h : e->post)
    if (h.first == id_) return true;
  return e->override_fn.first == id_;
}

RemovableHandle register_forward_pre_hook(torch::nn::Module& module, ForwardPreHook hook) {
  TORCH_CHECK(hook != nullptr, "register_forward_pre_hook: the hook is empty");
  std::lock_guard<std::mutex> lk(g_mu);
  Entry& e = entry_for(module, "register_forward_pre_hook");
  const uint64_t id = g_next_id++;
  e.pre.emplace_back(id, std::move(hook));
  return RemovableHandle(&module, id);
}

RemovableHandle register_forward_hook(torch::nn::Module& module, ForwardHook hook) {
  TORCH_CHECK(hook != nullptr, "register_forward_hook: the hook is empty");
  std::lock_guard<std::mutex> lk(g_mu);
  Entry& e = entry_for(module, "register_forward_hook");
  const uint64_t id = g_next_id++;
  e.post.emplace_back(id, std::move(hook));
  return RemovableHandle(&module, id);
}

RemovableHandle register_forward_override(torch::nn::Module& module, ForwardOverride override_fn) {
  TORCH_CHECK(override_fn != nullptr, "register_forward_override: the override is empty");
  std::lock_guard<std::mutex> lk(g_mu);
  Entry& e = entry_for(module, "register_forward_override");
  TORCH_CHECK(e.override_fn.first == 0, "register_forward_override: the ", module.name(),
              " already has a forward override; remove it first (a module is computed one way)");
  const uint64_t id = g_next_id++;
  e.override_fn = {id, std::move(override_fn)};
  return RemovableHandle(&module, id);
}

size_t num_forward_hooks(const torch::nn::Module& module) {
  std::lock_guard<std::mutex> lk(g_mu);
  Entry* e = live_entry(&module);
  return e ? e->size() : 0;
}

namespace detail {

bool any_hooks() { return g_num_entries.load(std::memory_order_relaxed) > 0; }

Hooks hooks_of(const torch::nn::Module& module) {
  Hooks h;
  std::lock_guard<std::mutex> lk(g_mu);
  if (Entry* e = live_entry(&module)) {
    for (auto& p : e->pre) h.pre.push_back(p.second);
    for (auto& p : e->post) h.post.push_back(p.second);
    h.override_fn = e->override_fn.second;
  }
  return h;
}

void run_pre_hooks(torch::nn::Module& module, const Hooks& hooks, ForwardInputs& inputs) {
  const size_t n = inputs.size();
  for (const auto& hook : hooks.pre) {
    hook(module, inputs);
    TORCH_CHECK(inputs.size() == n, "a forward pre-hook of ", module.name(), " changed the number of inputs from ",
                n, " to ", inputs.size(), "; forward takes ", n);
  }
}

void run_post_hooks(torch::nn::Module& module, const Hooks& hooks, const ForwardInputs& inputs,
                    c10::IValue& output) {
  for (const auto& hook : hooks.post) hook(module, inputs, output);
}

// ---- NOTE: [Module path] ------------------------------------------------------------------
namespace {
thread_local ModuleTracker* t_tracker = nullptr;
thread_local std::vector<ModuleFrame> t_stack;

// The path of `child` below `parent` ("layers.0"), or "" when it is not a descendant.
std::string path_below(const torch::nn::Module& parent, const torch::nn::Module& child) {
  for (const auto& item : parent.named_modules("", /*include_self=*/false))
    if (item.value().get() == &child) return item.key();
  return "";
}
}  // namespace

ModuleTracker* module_tracker() { return t_tracker; }
ModuleTracker* set_module_tracker(ModuleTracker* tracker) {
  ModuleTracker* previous = t_tracker;
  t_tracker = tracker;
  if (!tracker) t_stack.clear();
  return previous;
}
const std::vector<ModuleFrame>& module_stack() { return t_stack; }

std::string module_type_name(const torch::nn::Module& module) {
  std::string n = module.name();
  const auto colon = n.rfind("::");
  if (colon != std::string::npos) n = n.substr(colon + 2);
  if (n.size() > 4 && n.compare(n.size() - 4, 4, "Impl") == 0) n.resize(n.size() - 4);
  return n;
}

ModuleStackScope::ModuleStackScope(std::vector<ModuleFrame> stack) : saved_(std::move(stack)) {
  std::swap(saved_, t_stack);
}
ModuleStackScope::~ModuleStackScope() { std::swap(saved_, t_stack); }

ModuleCallFrame::ModuleCallFrame(const torch::nn::Module& module) {
  if (!t_tracker) return;
  ModuleFrame f;
  f.module = &module;
  f.type = module_type_name(module);
  std::string below = t_stack.empty() ? "" : path_below(*t_stack.back().module, module);
  f.fqn = below.empty() ? f.type : t_stack.back().fqn + "." + below;
  t_stack.push_back(std::move(f));
  pushed_ = true;
  try {
    t_tracker->on_module_enter(t_stack);
  } catch (...) {
    t_stack.pop_back();
    throw;
  }
}
ModuleCallFrame::~ModuleCallFrame() {
  if (pushed_ && !t_stack.empty()) t_stack.pop_back();
}

}  // namespace detail
}  // namespace nn
}  // namespace dtensor
