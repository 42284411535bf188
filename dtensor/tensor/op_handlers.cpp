// dtensor/tensor/op_handlers.cpp: see op_handlers_internal.h.
#include "dtensor/tensor/op_handlers_internal.h"

#include <c10/util/Exception.h>

#include <unordered_map>

namespace dtensor {
namespace detail {

namespace {

std::unordered_map<std::string, OpHandler>& handlers() {
  static std::unordered_map<std::string, OpHandler> table;
  return table;
}

thread_local int t_scopes = 0;

}  // namespace

void register_op_handler(const std::string& op, OpHandler handler) {
  TORCH_CHECK(handlers().emplace(op, std::move(handler)).second, "register_op_handler: ", op, " has a handler already");
}

OpHandlerScope::OpHandlerScope() { ++t_scopes; }
OpHandlerScope::~OpHandlerScope() { --t_scopes; }

bool run_op_handler(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  if (t_scopes == 0) return false;
  const auto& schema = op.schema();
  const std::string name =
      schema.overload_name().empty() ? schema.name() : schema.name() + "." + schema.overload_name();
  auto it = handlers().find(name);
  return it != handlers().end() && it->second(op, stack);
}

}  // namespace detail
}  // namespace dtensor
