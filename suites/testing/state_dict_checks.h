// suites/testing/state_dict_checks.h: what checkpoint tests assert about a loaded state dict.
#pragma once

#include "dtensor/checkpoint/checkpoint.h"

#include <ATen/core/Tensor.h>

#include <string>

namespace dtensor {
namespace testing {

// Every element of a DTensor's, ShardedTensor's or plain tensor's local data equals `full`'s
// (gtest failures, naming `what`).
void expect_holds(const checkpoint::StateDictValue& v, const at::Tensor& full, const std::string& what);

}  // namespace testing
}  // namespace dtensor
