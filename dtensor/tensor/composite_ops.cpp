// dtensor/tensor/composite_ops.cpp: composite ops that reach the DTensor fallback whole, and
// svd's decomposition for DTensors (NOTE: [svd without U and V]).
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
#include <ATen/ops/linalg_svd.h>
#include <ATen/ops/linalg_svdvals.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

namespace dtensor {
namespace {

// The ops of NOTE: [Composite ops run whole], each with a sharding rule in dtensor/ops.
constexpr const char* kRunWhole[] = {
    "value_selecting_reduction_backward",  // reduction_rules.cpp
    "cummaxmin_backward",                  // scan_rules.cpp: zeros(input.sizes()).scatter_add_(dim, indices, grad)
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

// NOTE: [svd without U and V]
// libtorch's composite svd with compute_uv=false makes U and V as at::zeros(sizes, A.options()):
// plain tensors, even when A is a DTensor. With a DTensor A this kernel runs the same
// decomposition (linalg_svd, or linalg_svdvals and zeros) with A.new_zeros instead, which gives
// Replicate DTensors of zeros; the ops it calls dispatch afresh and autograd records them as it
// records the composite's. Plain tensors go below autograd, where the backend's entry of svd is
// libtorch's decomposition itself (NOTE: [Composite ops run whole]), unchanged.
std::tuple<at::Tensor, at::Tensor, at::Tensor> svd_autograd(c10::DispatchKeySet ks, const at::Tensor& a, bool some,
                                                            bool compute_uv) {
  if (!is_dtensor(a)) {
    static const auto op = c10::Dispatcher::singleton()
                               .findSchemaOrThrow("aten::svd", "")
                               .typed<std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, bool, bool)>();
    return op.redispatch(ks & c10::after_autograd_keyset, a, some, compute_uv);
  }
  if (compute_uv) {
    auto usvh = at::linalg_svd(a, /*full_matrices=*/!some);
    return {std::get<0>(usvh), std::get<1>(usvh), std::get<2>(usvh).mH()};
  }
  at::Tensor s = at::linalg_svdvals(a);  // refuses fewer than 2 dims, as the composite does
  std::vector<int64_t> sizes = a.sizes().vec();
  const int64_t m = sizes.end()[-2], n = sizes.end()[-1];
  sizes.end()[-1] = m;
  at::Tensor u = a.new_zeros(sizes);
  sizes.end()[-2] = n;
  sizes.end()[-1] = n;
  at::Tensor vh = a.new_zeros(sizes);
  return {std::move(u), std::move(s), vh.mH()};
}

void register_run_whole(torch::Library& m) {
  for (const char* name : kRunWhole)
    m.impl(name, torch::CppFunction::makeFromBoxedFunction<&run_below_autograd>());
  m.impl("svd", TORCH_FN(svd_autograd));
}

}  // namespace

// The autograd keys of the backends a DTensor's local tensor can live on.
TORCH_LIBRARY_IMPL(aten, AutogradCPU, m) { register_run_whole(m); }
TORCH_LIBRARY_IMPL(aten, AutogradCUDA, m) { register_run_whole(m); }

}  // namespace dtensor
