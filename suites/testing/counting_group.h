// suites/testing/counting_group.h: a comm::Group that counts the collectives passing through
// it and through every sub-group it creates (a DeviceMesh's per-dim groups), for tests and
// benchmarks that check how much a computation communicates.
//
//   auto counting = std::make_shared<dtensor::testing::CountingGroup>(group_ptr());
//   auto mesh = dtensor::init_device_mesh(device_type(), {ranks()}, {}, counting);  // in a rank body
//   counting->reset();
//   ...                                   // run something on `mesh`
//   counting->counts();                   // {"all_gather_into": 3, "reduce_scatter_into": 2}
//
// Counts are this rank's calls (per-rank, not summed over ranks), blocking and `_async` alike. Collectivity is that of the
// wrapped group.
#pragma once

#include "dtensor/comm/group.h"

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace dtensor {
namespace testing {

class CountingGroup final : public comm::Group {
 public:
  explicit CountingGroup(comm::GroupPtr inner);

  // Calls per operation name (the Group method: "all_reduce", "all_gather_into", ...), over
  // this group and its sub-groups, since construction or the last reset().
  std::map<std::string, int64_t> counts() const;
  // Collectives (everything but send/recv) in counts().
  int64_t collectives() const;
  void reset();

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string backend() const override { return inner_->backend(); }
  const std::vector<int>& global_ranks() const override { return inner_->global_ranks(); }
  comm::WorkPtr all_reduce_async(const at::Tensor& tensor, comm::ReduceOp op = comm::ReduceOp::SUM) override;
  comm::WorkPtr all_gather_into_async(const at::Tensor& output, const at::Tensor& input) override;
  comm::WorkPtr reduce_scatter_into_async(const at::Tensor& output, const at::Tensor& input,
                                          comm::ReduceOp op = comm::ReduceOp::SUM) override;
  comm::WorkPtr all_to_all_single_async(const at::Tensor& output, const at::Tensor& input,
                                        const std::vector<int64_t>& output_splits = {},
                                        const std::vector<int64_t>& input_splits = {}) override;
  comm::WorkPtr broadcast_async(const at::Tensor& tensor, int src) override;
  comm::WorkPtr barrier_async() override;
  comm::WorkPtr send_async(const at::Tensor& tensor, int dst, int tag = 0) override;
  comm::WorkPtr recv_async(const at::Tensor& tensor, int src, int tag = 0) override;
  comm::WorkPtr gather_async(const at::Tensor& input, const std::vector<at::Tensor>& outputs, int dst) override;
  comm::WorkPtr scatter_async(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) override;
  std::shared_ptr<comm::Group> new_subgroup(const std::vector<int>& ranks) override;

 private:
  struct Counters {
    mutable std::mutex mu;
    std::map<std::string, int64_t> counts;
  };
  CountingGroup(comm::GroupPtr inner, std::shared_ptr<Counters> counters);
  void bump(const char* op);

  comm::GroupPtr inner_;
  std::shared_ptr<Counters> counters_;
};

}  // namespace testing
}  // namespace dtensor
