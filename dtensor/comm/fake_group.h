// dtensor/comm/fake_group.h: FakeGroup, one rank's view of a world that is not there (PyTorch's
// FakeProcessGroup, torch/testing/_internal/distributed/fake_pg.py): every collective returns
// at once, completed, without another rank or a byte sent. One process plays rank r of a world
// of N (N may be tens of thousands) to learn what a computation would communicate: meshes of
// any shape over it, DTensors on them, tensor-parallel styles and fully_shard run unchanged,
// and CommDebugMode (dtensor/debug/comm_mode.h) records every collective with its bytes, group
// and cause, as it would on a real world.
//
//   auto world = std::make_shared<dtensor::comm::FakeGroup>(/*rank=*/3, /*world_size=*/512);
//   auto mesh = dtensor::init_device_mesh("cpu", {64, 8}, {"dp", "tp"}, world);
//   dtensor::debug::CommDebugMode comm_mode;
//   { auto active = comm_mode.enter(); /* rank 3's training step on `mesh` */ }
//   comm_mode.get_collectives();  // what rank 3 would send and receive, collective by collective
//
// NOTE: [Fake world]
// - Shapes, dtypes and arguments are checked as on a real group (an all-gather's output must be
//   size() inputs, ...), so a mistake that would fail on the cluster fails here.
// - Values: the outputs are what they would be if every rank had passed this rank's inputs
//   (all_gather: size() copies of the input; all_reduce: SUM times size(), PRODUCT to the
//   power size(), AVG/MIN/MAX unchanged; reduce_scatter: this rank's block, times size() for
//   SUM; broadcast and a non-root's gather/scatter: as given; scatter: the root's own input);
//   all_to_all_single and recv, which that does not define, write zeros. Code that agrees
//   across ranks (a mesh's fingerprint check) then agrees. The numbers of a computation on a
//   fake world are not the real ones: only its shapes, placements and collectives are.
// - On meta tensors nothing is written or allocated at all. A "meta" mesh over a fake world
//   keeps every tensor of a step on the meta device (the model built in an nn::DeviceContext):
//   shapes, placements, collectives and bytes without data, for a model of any size.
// - new_subgroup gives members a FakeGroup over the chosen ranks (global ranks kept), others
//   nullptr, as a real group does; nothing is exchanged.
#pragma once

#include "dtensor/comm/group.h"

#include <memory>
#include <string>
#include <vector>

namespace dtensor {
namespace comm {

class FakeGroup final : public Group {
 public:
  // Rank `rank` of a world of `world_size` ranks (global ranks 0..world_size-1).
  FakeGroup(int rank, int world_size);
  // Rank `rank` of a group of the world's ranks `global_ranks` (index = group rank).
  FakeGroup(int rank, std::vector<int> global_ranks);

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(global_ranks_.size()); }
  std::string backend() const override { return "fake"; }
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
  WorkPtr send_async(const at::Tensor& tensor, int dst, int tag = 0) override;
  WorkPtr recv_async(const at::Tensor& tensor, int src, int tag = 0) override;
  WorkPtr gather_async(const at::Tensor& input, const std::vector<at::Tensor>& outputs, int dst) override;
  WorkPtr scatter_async(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) override;
  std::shared_ptr<Group> new_subgroup(const std::vector<int>& ranks) override;

 private:
  int rank_;
  std::vector<int> global_ranks_;
};

}  // namespace comm
}  // namespace dtensor
