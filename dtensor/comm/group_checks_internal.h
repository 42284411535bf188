// dtensor/comm/group_checks_internal.h: argument checks of gather and scatter that every Group
// implementation (C10dGroup, ThreadGroup, FakeGroup) makes on the root rank; they throw
// c10::Error naming the op and the group, like the checks in group.h's detail namespace.
#pragma once

#include "dtensor/comm/group.h"

#include <ATen/core/Tensor.h>

#include <vector>

namespace dtensor {
namespace comm {
namespace detail {

// On gather's dst: size() outputs, each of the input's shape and dtype.
void check_gather_outputs(const Group& g, const at::Tensor& input, const std::vector<at::Tensor>& outputs);
// On scatter's src: size() inputs, each of the output's shape and dtype.
void check_scatter_inputs(const Group& g, const at::Tensor& output, const std::vector<at::Tensor>& inputs);

}  // namespace detail
}  // namespace comm
}  // namespace dtensor
