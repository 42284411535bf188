// dtensor/tensor/output_meta_internal.h: the global metadata of an op's outputs, for the
// DTensor fallback (NOTE: [DTensor fallback] step 2). Not installed.
#pragma once

#include "dtensor/ops/registry.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <vector>

namespace dtensor {
namespace detail {

// The outputs' global metadata of `op` called with `args` (the op's arguments as the fallback
// found them: DTensors where `call.args` says so). Runs the op on stand-ins of the DTensors'
// global shapes (NOTE: [Output metadata without the data]); raises, naming the op, when that
// fails.
std::vector<TensorMeta> infer_output_meta(const c10::OperatorHandle& op, const torch::jit::Stack& args,
                                          const ops::OpCall& call);

// A copy of the list `v` (same element type) with element `pos` replaced: the caller's list
// must not change (it may still hold the DTensors).
c10::IValue with_list_element(const c10::IValue& v, size_t pos, const at::Tensor& t);

// Generator or Generator?: an op's random-number generator argument.
bool is_generator_type(const c10::TypePtr& t);

}  // namespace detail
}  // namespace dtensor
