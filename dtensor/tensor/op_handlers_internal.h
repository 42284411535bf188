// dtensor/tensor/op_handlers_internal.h: ops that, while a scope asks for it on the calling
// thread, the DTensor fallback hands to a handler of their own instead of propagating their
// sharding (PyTorch's DTensor._op_dispatcher._custom_op_handlers, which loss_parallel() fills).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <functional>
#include <string>

namespace dtensor {
namespace detail {

// Runs `op` on the DTensor arguments on `stack` and leaves its returns there; returns false
// (the stack untouched) to let the fallback run the op as usual.
using OpHandler = std::function<bool(const c10::OperatorHandle& op, torch::jit::Stack* stack)>;

// Registers `handler` for "aten::name.overload" (at static initialisation: the table is read
// without a lock). A handler runs only while an OpHandlerScope is alive on the calling thread.
void register_op_handler(const std::string& op, OpHandler handler);

// While alive, the registered handlers see the calls of this thread.
class OpHandlerScope {
 public:
  OpHandlerScope();
  ~OpHandlerScope();
  OpHandlerScope(const OpHandlerScope&) = delete;
  OpHandlerScope& operator=(const OpHandlerScope&) = delete;
};

// The fallback's first step: true when a handler took the call.
bool run_op_handler(const c10::OperatorHandle& op, torch::jit::Stack* stack);

}  // namespace detail
}  // namespace dtensor
