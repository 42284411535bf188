// dtensor/tensor/composite_ops.cpp: composite ops that reach the DTensor fallback whole.
//
// NOTE: [Composite ops run whole]
// A CompositeImplicitAutograd op has no kernel of its own: its autograd kernel runs the
// decomposition (a C++ function calling other ops) above kDTensorKey, so the DTensor fallback
// only sees the ops it calls. That is what we want, except for the few decompositions that
// cannot run on DTensors because they build a plain tensor and write DTensors into it, e.g.
// libtorch 1.13's value_selecting_reduction_backward (the gradient of max/min.dim):
//     at::zeros(sizes, grad.options()).scatter_(dim, indices, grad)
// For the ops listed below we register a kernel at the per-backend autograd keys that
// redispatches below autograd. Then:
//   - plain tensors reach the same decomposition (the backend's entry of a composite op is
//     its decomposition), whose ops dispatch afresh and are recorded by autograd as before;
//   - DTensors reach the fallback with the op whole, and its sharding rule decides
//     (dtensor/ops). The decomposition then runs on local tensors.
// The DTensor call is not recorded by autograd, so a call that would need recording (grad
// mode on and an input requiring grad: a backward with create_graph=true) raises instead of
// giving a result without gradient.
#include "dtensor/tensor/dtensor.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace dtensor {
namespace {

// The ops of NOTE: [Composite ops run whole], each with a sharding rule in dtensor/ops.
constexpr const char* kRunWhole[] = {
    "value_selecting_reduction_backward",  // reduction_rules.cpp
};

void run_below_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const size_t n = op.schema().arguments().size();
  bool any_dtensor = false, any_requires_grad = false;
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    const c10::IValue& v = (*stack)[i];
    std::vector<at::Tensor> ts;
    if (v.isTensor()) ts.push_back(v.toTensor());
    else if (v.isTensorList()) ts = v.toTensorVector();
    for (const at::Tensor& t : ts) {
      if (!t.defined()) continue;
      any_dtensor = any_dtensor || is_dtensor(t);
      any_requires_grad = any_requires_grad || t.requires_grad();
    }
  }
  TORCH_CHECK(!(any_dtensor && any_requires_grad && at::GradMode::is_enabled()), "DTensor: ", op.schema().name(),
              " runs on DTensors as one op below autograd, so its result cannot be differentiated (a backward "
              "with create_graph=true through it is not supported); call it with grad mode off, or on plain "
              "tensors (full_tensor())");
  op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
}

void register_run_whole(torch::Library& m) {
  for (const char* name : kRunWhole)
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&run_below_autograd>());
}

}  // namespace

// The autograd keys of the backends a DTensor's local tensor can live on.
TORCH_LIBRARY_IMPL(aten, AutogradCPU, m) { register_run_whole(m); }
TORCH_LIBRARY_IMPL(aten, AutogradCUDA, m) { register_run_whole(m); }

}  // namespace dtensor
