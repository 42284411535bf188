// dtensor/comm/thread_rounds_internal.h: one collective call of a rank of a ThreadWorld, and the
// functions that run a round of them (NOTE: [ThreadGroup rounds] in thread_group.cpp).
#pragma once

#include "dtensor/comm/group.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dtensor {
namespace comm {
namespace thread_rounds {

struct Call;
using Calls = std::vector<std::shared_ptr<const Call>>;  // index: rank
// Computes every rank's result, then writes every rank's outputs (step 2).
using RunFn = void (*)(const Calls&);

struct Call {
  const char* op = "";  // a literal: Work's op
  std::string signature;  // must match across ranks
  RunFn run = nullptr;
  // Handles, never references: NOTE: [Calls outlive an aborted round].
  std::vector<at::Tensor> inputs;
  std::vector<at::Tensor> outputs;
  ReduceOp reduce = ReduceOp::SUM;
  int root = -1;  // broadcast and scatter: src; gather: dst
  std::vector<int64_t> out_splits, in_splits;
};

// Step 2 of each collective (thread_collectives.cpp): every rank's result first, then every
// output (NOTE: [ThreadGroup results written in place]).
void run_all_reduce(const Calls& calls);
void run_all_gather(const Calls& calls);
void run_reduce_scatter(const Calls& calls);
void run_all_to_all(const Calls& calls);
void run_broadcast(const Calls& calls);
void run_gather(const Calls& calls);
void run_scatter(const Calls& calls);
void run_nothing(const Calls& calls);

}  // namespace thread_rounds
}  // namespace comm
}  // namespace dtensor
