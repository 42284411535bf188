// dtensor/nn/device_context.cpp: NOTE: [Device context] in device_context.h.
#include "dtensor/nn/device_context.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

namespace dtensor {
namespace nn {

namespace {

constexpr c10::DispatchKey kContextKey = c10::DispatchKey::DeferredInit;
thread_local std::optional<c10::Device> t_device;

bool is_tensor_type(const c10::TypePtr& type) {
  if (type->kind() == c10::TypeKind::TensorType) return true;
  if (auto opt = type->cast<c10::OptionalType>()) return is_tensor_type(opt->getElementType());
  if (auto list = type->cast<c10::ListType>()) return is_tensor_type(list->getElementType());
  return false;
}

// A factory: no argument is a tensor (or an optional tensor, or a list of them).
bool is_factory(const c10::FunctionSchema& schema) {
  for (const auto& a : schema.arguments())
    if (is_tensor_type(a.type())) return false;
  return true;
}

void device_context_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::FunctionSchema& schema = op.schema();
  if (t_device.has_value() && is_factory(schema)) {
    const auto& args = schema.arguments();
    const size_t begin = stack->size() - args.size();
    for (size_t i = 0; i < args.size(); ++i) {
      if (args[i].name() != "device") continue;
      c10::IValue& v = (*stack)[begin + i];
      if (v.isNone()) v = c10::IValue(*t_device);
    }
  }
  // The op's own implementation (and whatever it calls) runs as without a context.
  c10::impl::ExcludeDispatchKeyGuard outside(kContextKey);
  op.callBoxed(stack);
}

}  // namespace

DeviceContext::DeviceContext(c10::Device device)
    : saved_(t_device), saved_included_(c10::impl::tls_is_dispatch_key_included(kContextKey)) {
  t_device = device;
  c10::impl::tls_set_dispatch_key_included(kContextKey, true);
}

DeviceContext::~DeviceContext() {
  t_device = saved_;
  c10::impl::tls_set_dispatch_key_included(kContextKey, saved_included_);
}

std::optional<c10::Device> DeviceContext::current() { return t_device; }

TORCH_LIBRARY_IMPL(_, DeferredInit, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&device_context_fallback>());
}

}  // namespace nn
}  // namespace dtensor
