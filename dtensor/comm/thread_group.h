// dtensor/comm/thread_group.h
//
// ThreadGroup: ranks are threads of one process and collectives are exchanges through
// shared memory (DESIGN.md D2). Fast, deterministic (the reduction runs once, in rank order,
// so all ranks get bit-identical results), no sockets.
//
//   auto world = dtensor::comm::ThreadWorld::create(4);
//   // in thread r:
//   auto g = std::make_shared<dtensor::comm::ThreadGroup>(world, r);
//   g->all_reduce(t);                          // blocking
//   auto work = g->all_gather_into_async(out, t);
//   ...                                        // overlaps with the all_gather
//   work->wait();
//
// Collectives are asynchronous (NOTE: [Async collectives] in work.h): issuing one returns at
// once, and the rank that issues a collective last computes every rank's result and writes
// all outputs (NOTE: [ThreadGroup rounds] in thread_group.cpp); wait() waits for that.
//
// Beyond c10d, a ThreadGroup checks that every rank called the same collective with
// compatible arguments and raises CollectiveError on EVERY rank naming what each rank called,
// instead of hanging. ThreadWorld::abort() wakes every rank waiting for a collective (of the
// world or of its sub-groups) with CollectiveError; the threaded harness calls it when a rank
// fails so the others stop promptly. A collective not completed within the world's timeout
// aborts the world, naming the ranks that had not issued it.
#pragma once

#include "dtensor/comm/group.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace dtensor {
namespace comm {

// The shared memory of the ranks of one ThreadGroup (and, through sub-worlds, of the groups
// made from it with new_subgroup).
class ThreadWorld {
 public:
  static std::shared_ptr<ThreadWorld> create(
      int size, std::chrono::milliseconds timeout = kDefaultCollectiveTimeout);
  ~ThreadWorld();

  int size() const;
  // How long a collective may stay incomplete after a rank issued it (and a recv unanswered).
  std::chrono::milliseconds timeout() const;
  // Wakes every waiter of this world and its sub-worlds with CollectiveError naming `reason`;
  // collectives issued later throw at once. The first reason sticks.
  void abort(const std::string& reason);
  bool aborted() const;

  struct State;  // internal (thread_group.cpp)
  State& state() { return *state_; }

 private:
  explicit ThreadWorld(int size, std::chrono::milliseconds timeout);
  std::unique_ptr<State> state_;
};

// One rank of a ThreadWorld. Every collective is collective over the world's ranks (Group's
// contract: same collectives, same order, matching arguments); the `_async` spellings return
// a Work whose wait() rethrows the round's error on every rank.
class ThreadGroup final : public Group {
 public:
  // `global_ranks` maps group ranks to world ranks (identity when empty).
  ThreadGroup(std::shared_ptr<ThreadWorld> world, int rank, std::vector<int> global_ranks = {});

  int rank() const override { return rank_; }
  int size() const override;
  std::string backend() const override { return "threads"; }
  const std::vector<int>& global_ranks() const override { return global_ranks_; }

  WorkPtr all_reduce_async(const at::Tensor& tensor, ReduceOp op = ReduceOp::SUM) override;
  WorkPtr all_gather_into_async(const at::Tensor& output, const at::Tensor& input) override;
  WorkPtr reduce_scatter_into_async(const at::Tensor& output, const at::Tensor& input,
                                    ReduceOp op = ReduceOp::SUM) override;
  WorkPtr all_to_all_single_async(const at::Tensor& output, const at::Tensor& input,
                                  const std::vector<int64_t>& output_splits = {},
                                  const std::vector<int64_t>& input_splits = {}) override;
  WorkPtr broadcast_async(const at::Tensor& tensor, int src) override;
  WorkPtr barrier_async() override;
  // The message is queued at once (a copy): the returned Work is already complete.
  WorkPtr send_async(const at::Tensor& tensor, int dst, int tag = 0) override;
  // Receives posted in order get the messages of (src, tag) in send order, whatever order
  // their Works are waited in; `tensor` is written by wait().
  WorkPtr recv_async(const at::Tensor& tensor, int src, int tag = 0) override;
  WorkPtr gather_async(const at::Tensor& input, const std::vector<at::Tensor>& outputs, int dst) override;
  WorkPtr scatter_async(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) override;
  // Blocking: one round of the world, then the sub-world is shared by its members.
  std::shared_ptr<Group> new_subgroup(const std::vector<int>& ranks) override;

  const std::shared_ptr<ThreadWorld>& world() const { return world_; }

 private:
  std::shared_ptr<ThreadWorld> world_;
  int rank_;
  std::vector<int> global_ranks_;
};

}  // namespace comm
}  // namespace dtensor
