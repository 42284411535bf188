// dtensor/comm/thread_group.h
//
// ThreadGroup: ranks are threads of one process and collectives are exchanges through
// shared memory (DESIGN.md D2). Fast, deterministic (every rank reduces in rank order, so
// all ranks get bit-identical results), no sockets.
//
//   auto world = dtensor::comm::ThreadWorld::create(4);
//   // in thread r:
//   auto g = std::make_shared<dtensor::comm::ThreadGroup>(world, r);
//   g->all_reduce(t);
//
// Beyond c10d, a ThreadGroup checks that every rank called the same collective with
// compatible arguments and raises CollectiveError on EVERY rank naming what each rank called,
// instead of hanging. ThreadWorld::abort() wakes every rank blocked in a collective (of the
// world or of its sub-groups) with CollectiveError; the threaded harness calls it when a rank
// fails so the others stop promptly.
#pragma once

#include "dtensor/comm/group.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace dtensor {
namespace comm {

class ThreadWorld {
 public:
  static std::shared_ptr<ThreadWorld> create(
      int size, std::chrono::milliseconds timeout = kDefaultCollectiveTimeout);
  ~ThreadWorld();

  int size() const;
  std::chrono::milliseconds timeout() const;
  // Wakes all waiters of this world and its sub-groups; later collectives throw at once.
  void abort(const std::string& reason);
  bool aborted() const;

  struct State;  // internal
  State& state() { return *state_; }

 private:
  explicit ThreadWorld(int size, std::chrono::milliseconds timeout);
  std::unique_ptr<State> state_;
};

class ThreadGroup final : public Group {
 public:
  // `global_ranks` maps group ranks to world ranks (identity when empty).
  ThreadGroup(std::shared_ptr<ThreadWorld> world, int rank, std::vector<int> global_ranks = {});

  int rank() const override { return rank_; }
  int size() const override;
  std::string backend() const override { return "threads"; }
  const std::vector<int>& global_ranks() const override { return global_ranks_; }

  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::SUM) override;
  void all_gather_into(at::Tensor& output, const at::Tensor& input) override;
  void reduce_scatter_into(at::Tensor& output, const at::Tensor& input,
                           ReduceOp op = ReduceOp::SUM) override;
  void all_to_all_single(at::Tensor& output, const at::Tensor& input,
                         const std::vector<int64_t>& output_splits = {},
                         const std::vector<int64_t>& input_splits = {}) override;
  void broadcast(at::Tensor& tensor, int src) override;
  void barrier() override;
  void send(const at::Tensor& tensor, int dst, int tag = 0) override;
  void recv(at::Tensor& tensor, int src, int tag = 0) override;
  void gather(const at::Tensor& input, std::vector<at::Tensor>& outputs, int dst) override;
  void scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) override;
  std::shared_ptr<Group> new_subgroup(const std::vector<int>& ranks) override;

  const std::shared_ptr<ThreadWorld>& world() const { return world_; }

 private:
  std::shared_ptr<ThreadWorld> world_;
  int rank_;
  std::vector<int> global_ranks_;
};

}  // namespace comm
}  // namespace dtensor
