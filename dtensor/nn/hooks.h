// dtensor/nn/hooks.h
//
// Forward pre/post hooks for torch::nn modules, and call(), which runs them (DESIGN.md D4).
// libtorch modules have no hooks and forward() is not virtual, so a parent that wants its
// children to be hookable (by parallel styles, for instance) calls them through
// dtensor::nn::call instead of child->forward:
//
//   struct BlockImpl : torch::nn::Module {
//     torch::nn::Linear w1{nullptr}, w2{nullptr};
//     at::Tensor forward(const at::Tensor& x) {
//       return dtensor::nn::call(w2, at::relu(dtensor::nn::call(w1, x)));
//     }
//   };
//
//   auto handle = dtensor::nn::register_forward_pre_hook(*block->w1,
//       [](torch::nn::Module&, dtensor::nn::ForwardInputs& inputs) {
//         inputs[0] = inputs[0].toTensor() * 2;      // change the input
//       });
//   handle.remove();
//
// The C++ counterpart of nn.Module.register_forward_pre_hook / register_forward_hook, with
// two differences: hooks change inputs and output in place instead of returning them, and
// they run only when the module is called through call() (a child called directly, or by
// torch::nn::Sequential, runs without them).
//
// NOTE: [Hook registry]
// Hooks are kept in one process-wide registry keyed by module address, with a weak reference
// to the module: an entry whose module has died is dropped (a new module at the same address
// does not inherit it), and every registration drops the entries of dead modules (releasing
// what their hooks captured). So a hooked module must be owned by a std::shared_ptr (a
// ModuleHolder such as torch::nn::Linear, or std::make_shared). The registry is thread-safe,
// and hooks run outside its lock, so hooks may run collectives (ranks as threads call them
// concurrently). call() costs one atomic load when no module has hooks.
//
// Hooks themselves are not collective; a hook that redistributes a DTensor is, so every rank
// must call the hooked module the same number of times.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace dtensor {
namespace nn {

// The positional arguments of one forward call.
using ForwardInputs = std::vector<c10::IValue>;

// Runs before forward; may replace inputs (same count; each must still convert to the type
// forward takes).
using ForwardPreHook = std::function<void(torch::nn::Module& module, ForwardInputs& inputs)>;
// Runs after forward with the inputs forward saw; may replace the output (same type).
using ForwardHook =
    std::function<void(torch::nn::Module& module, const ForwardInputs& inputs, c10::IValue& output)>;
// Runs INSTEAD of forward (after the pre-hooks, before the post-hooks) and returns the output,
// which must convert to forward's result type. A parallel style uses one to compute a module
// differently (a Linear whose input gather is fused with its matmul); PyTorch reaches the same
// with torch.compile's pattern matching, which eager C++ does not have.
using ForwardOverride = std::function<c10::IValue(torch::nn::Module& module, const ForwardInputs& inputs)>;

// Removes one registered hook (PyTorch's RemovableHandle). Copyable; removing twice, or after
// the module died, does nothing.
class RemovableHandle {
 public:
  RemovableHandle() = default;
  void remove();
  // True until remove() (or the module's death).
  bool is_active() const;

 private:
  friend RemovableHandle register_forward_pre_hook(torch::nn::Module&, ForwardPreHook);
  friend RemovableHandle register_forward_hook(torch::nn::Module&, ForwardHook);
  friend RemovableHandle register_forward_override(torch::nn::Module&, ForwardOverride);
  RemovableHandle(const torch::nn::Module* module, uint64_t id) : module_(module), id_(id) {}
  const torch::nn::Module* module_ = nullptr;
  uint64_t id_ = 0;
};

// Hooks run in registration order. `module` must be owned by a std::shared_ptr (NOTE: [Hook
// registry]); otherwise this throws naming the module type.
RemovableHandle register_forward_pre_hook(torch::nn::Module& module, ForwardPreHook hook);
RemovableHandle register_forward_hook(torch::nn::Module& module, ForwardHook hook);

// At most one override per module: a second one throws naming the module type. Removing it
// (handle.remove()) restores forward.
RemovableHandle register_forward_override(torch::nn::Module& module, ForwardOverride override_fn);
// Number of hooks (pre, post and override) registered on `module`.
size_t num_forward_hooks(const torch::nn::Module& module);

// NOTE: [Module path]
// While a module tracker is installed on a thread (dtensor::debug::CommDebugMode installs one),
// call() keeps the stack of modules being called on that thread, each with its fully qualified
// name as PyTorch's ModTracker gives it: a module called with no tracked module above it is
// named by its class ("Transformer"), one called inside another by the other's name and its
// path below it ("Transformer.layers.0.attention"). A module's hooks run inside its frame, so
// what they do (a parallel style's redistribution) is attributed to it. A module called
// directly (module->forward) is not seen: call the root through call() as well.
namespace detail {
struct ModuleFrame {
  std::string fqn;   // "Transformer.layers.0"
  std::string type;  // the class, without namespace or Impl: "TransformerBlock"
  const torch::nn::Module* module = nullptr;
};
class ModuleTracker {
 public:
  virtual ~ModuleTracker() = default;
  // A module was entered; `stack` ends with it.
  virtual void on_module_enter(const std::vector<ModuleFrame>& stack) = 0;
};
// This thread's tracker (nullptr: none); set returns the previous one.
ModuleTracker* module_tracker();
ModuleTracker* set_module_tracker(ModuleTracker* tracker);
// This thread's stack of modules being called (empty without a tracker).
const std::vector<ModuleFrame>& module_stack();
// Makes `stack` this thread's stack while alive (a backward step runs where its forward ran).
class ModuleStackScope {
 public:
  explicit ModuleStackScope(std::vector<ModuleFrame> stack);
  ~ModuleStackScope();
  ModuleStackScope(const ModuleStackScope&) = delete;
  ModuleStackScope& operator=(const ModuleStackScope&) = delete;

 private:
  std::vector<ModuleFrame> saved_;
};
// call()'s frame: pushes `module` while alive when a tracker is installed.
class ModuleCallFrame {
 public:
  explicit ModuleCallFrame(const torch::nn::Module& module);
  ~ModuleCallFrame();
  ModuleCallFrame(const ModuleCallFrame&) = delete;
  ModuleCallFrame& operator=(const ModuleCallFrame&) = delete;

 private:
  bool pushed_ = false;
};
// "Linear" for torch::nn::LinearImpl (PyTorch's class name).
std::string module_type_name(const torch::nn::Module& module);

struct Hooks {
  std::vector<ForwardPreHook> pre;
  std::vector<ForwardHook> post;
  ForwardOverride override_fn;  // empty: forward runs
  bool empty() const { return pre.empty() && post.empty() && !override_fn; }
};
// False when no module has hooks (one atomic load).
bool any_hooks();
// A copy of `module`'s hooks (empty if none).
Hooks hooks_of(const torch::nn::Module& module);
void run_pre_hooks(torch::nn::Module& module, const Hooks& hooks, ForwardInputs& inputs);
void run_post_hooks(torch::nn::Module& module, const Hooks& hooks, const ForwardInputs& inputs,
                    c10::IValue& output);

template <class... Ts, class Impl, size_t... I>
auto forward_from(Impl& module, ForwardInputs& inputs, std::index_sequence<I...>) {
  return module.forward(std::move(inputs[I]).template to<Ts>()...);
}
}  // namespace detail

// Calls module.forward(args...) with the module's pre-hooks before and its post-hooks after
// (just forward when it has none). Arguments and the result must convert to and from
// c10::IValue (tensors, scalars, lists, tuples, optionals).
template <class Impl, class... Args,
          class = std::enable_if_t<std::is_base_of<torch::nn::Module, Impl>::value>>
auto call(Impl& module, Args&&... args) -> decltype(module.forward(std::forward<Args>(args)...)) {
  using Result = decltype(module.forward(std::forward<Args>(args)...));
  if (!detail::any_hooks() && !detail::module_tracker()) return module.forward(std::forward<Args>(args)...);
  torch::nn::Module& base = module;
  const detail::ModuleCallFrame frame(base);
  detail::Hooks hooks = detail::hooks_of(base);
  if (hooks.empty()) return module.forward(std::forward<Args>(args)...);
  ForwardInputs inputs{c10::IValue(args)...};
  detail::run_pre_hooks(base, hooks, inputs);
  ForwardInputs seen = inputs;
  c10::IValue output = hooks.override_fn
                           ? hooks.override_fn(base, seen)
                           : c10::IValue(detail::forward_from<std::decay_t<Args>...>(
                                 module, inputs, std::index_sequence_for<Args...>()));
  detail::run_post_hooks(base, hooks, seen, output);
  return std::move(output).template to<Result>();
}

template <class Impl, class... Args>
auto call(const torch::nn::ModuleHolder<Impl>& module, Args&&... args)
    -> decltype(std::declval<Impl&>().forward(std::forward<Args>(args)...)) {
  return call(*module.ptr(), std::forward<Args>(args)...);
}

template <class Impl, class... Args>
auto call(const std::shared_ptr<Impl>& module, Args&&... args)
    -> decltype(std::declval<Impl&>().forward(std::forward<Args>(args)...)) {
  TORCH_CHECK(module != nullptr, "dtensor::nn::call: the module is null");
  return call(*module, std::forward<Args>(args)...);
}

}  // namespace nn
}  // namespace dtensor
