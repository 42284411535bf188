// dtensor/comm/fake_group.cpp: NOTE: [Fake world] in fake_group.h.
#include "dtensor/comm/fake_group.h"
#include "dtensor/comm/group_checks_internal.h"
#include "dtensor/debug/tracking_allocator_internal.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <numeric>

namespace dtensor {
namespace comm {

namespace {

// Writes happen under no_grad (as a real group's do) and never on meta tensors.
bool writable(const at::Tensor& t) { return t.defined() && !t.is_meta() && t.numel() > 0; }

// `t` reduced with `op` over `n` ranks that all passed `t`.
void reduce_identical(const at::Tensor& t, ReduceOp op, int n) {
  if (!writable(t) || n == 1 || t.scalar_type() == at::kBool) return;
  at::NoGradGuard no_grad;
  // Its temporaries (the scalar) stand for a real round's, which no rank's MemTracker counts.
  const debug::detail::UntrackedScope untracked;
  if (op == ReduceOp::SUM) t.mul_(n);
  else if (op == ReduceOp::PRODUCT) t.pow_(n);
}

}  // namespace

FakeGroup::FakeGroup(int rank, int world_size) : rank_(rank) {
  TORCH_CHECK(world_size >= 1, "FakeGroup: world size ", world_size, " must be at least 1");
  global_ranks_.resize(static_cast<size_t>(world_size));
  std::iota(global_ranks_.begin(), global_ranks_.end(), 0);
  TORCH_CHECK(rank >= 0 && rank < world_size, "FakeGroup: rank ", rank, " is not in a world of ", world_size);
}

FakeGroup::FakeGroup(int rank, std::vector<int> global_ranks) : rank_(rank), global_ranks_(std::move(global_ranks)) {
  TORCH_CHECK(!global_ranks_.empty(), "FakeGroup: the group has no ranks");
  TORCH_CHECK(rank >= 0 && rank < size(), "FakeGroup: rank ", rank, " is not in a group of ", size());
}

WorkPtr FakeGroup::all_reduce_async(const at::Tensor& tensor, ReduceOp op) {
  const detail::ObservedCollective observed(*this, "all_reduce", detail::nbytes(tensor), detail::nbytes(tensor));
  detail::check_avg(*this, "all_reduce", tensor, op);
  reduce_identical(tensor, op, size());
  return Work::completed("all_reduce", name());
}

WorkPtr FakeGroup::all_gather_into_async(const at::Tensor& output, const at::Tensor& input) {
  const detail::ObservedCollective observed(*this, "all_gather_into", detail::nbytes(input), detail::nbytes(output));
  detail::check_all_gather_shapes(*this, output, input);
  if (writable(output)) {
    at::NoGradGuard no_grad;
    const int64_t rows = input.dim() == 0 ? 1 : input.size(0);
    at::Tensor in = input.dim() == 0 ? input.reshape({1}) : input;
    for (int r = 0; r < size(); ++r) output.narrow(0, r * rows, rows).copy_(in);
  }
  return Work::completed("all_gather_into", name());
}

WorkPtr FakeGroup::reduce_scatter_into_async(const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  const detail::ObservedCollective observed(*this, "reduce_scatter_into", detail::nbytes(input), detail::nbytes(output));
  detail::check_reduce_scatter_shapes(*this, output, input);
  detail::check_avg(*this, "reduce_scatter_into", input, op);
  if (writable(output)) {
    at::NoGradGuard no_grad;
    const int64_t rows = output.dim() == 0 ? 1 : output.size(0);
    at::Tensor block = input.narrow(0, rank_ * rows, rows);
    output.copy_(output.dim() == 0 ? block.reshape({}) : block);
    reduce_identical(output, op, size());
  }
  return Work::completed("reduce_scatter_into", name());
}

WorkPtr FakeGroup::all_to_all_single_async(const at::Tensor& output, const at::Tensor& input,
                                           const std::vector<int64_t>& output_splits,
                                           const std::vector<int64_t>& input_splits) {
  const detail::ObservedCollective observed(*this, "all_to_all_single", detail::nbytes(input), detail::nbytes(output));
  (void)detail::resolve_all_to_all_splits(*this, output, input, output_splits, input_splits);
  if (writable(output)) {
    at::NoGradGuard no_grad;
    output.zero_();
  }
  return Work::completed("all_to_all_single", name());
}

WorkPtr FakeGroup::broadcast_async(const at::Tensor& tensor, int src) {
  const detail::ObservedCollective observed(*this, "broadcast", detail::nbytes(tensor), detail::nbytes(tensor));
  detail::check_rank_arg(*this, "broadcast", "src", src);
  return Work::completed("broadcast", name());
}

WorkPtr FakeGroup::barrier_async() {
  const detail::ObservedCollective observed(*this, "barrier", 0, 0);
  return Work::completed("barrier", name());
}

WorkPtr FakeGroup::send_async(const at::Tensor& tensor, int dst, int tag) {
  (void)tag;
  const detail::ObservedCollective observed(*this, "send", detail::nbytes(tensor), 0);
  detail::check_rank_arg(*this, "send", "dst", dst);
  TORCH_CHECK(dst != rank_, "send on ", describe(), ": a rank cannot send to itself");
  return Work::completed("send", name());
}

WorkPtr FakeGroup::recv_async(const at::Tensor& tensor, int src, int tag) {
  (void)tag;
  const detail::ObservedCollective observed(*this, "recv", 0, detail::nbytes(tensor));
  detail::check_rank_arg(*this, "recv", "src", src);
  TORCH_CHECK(src != rank_, "recv on ", describe(), ": a rank cannot receive from itself");
  if (writable(tensor)) {
    at::NoGradGuard no_grad;
    tensor.zero_();
  }
  return Work::completed("recv", name());
}

WorkPtr FakeGroup::gather_async(const at::Tensor& input, const std::vector<at::Tensor>& outputs, int dst) {
  const detail::ObservedCollective observed(*this, "gather", detail::nbytes(input), detail::nbytes(outputs));
  detail::check_rank_arg(*this, "gather", "dst", dst);
  if (rank_ == dst) {
    detail::check_gather_outputs(*this, input, outputs);
    at::NoGradGuard no_grad;
    for (const auto& t : outputs)
      if (writable(t)) t.copy_(input);
  }
  return Work::completed("gather", name());
}

WorkPtr FakeGroup::scatter_async(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) {
  const detail::ObservedCollective observed(*this, "scatter", detail::nbytes(inputs), detail::nbytes(output));
  detail::check_rank_arg(*this, "scatter", "src", src);
  if (rank_ == src) {
    detail::check_scatter_inputs(*this, output, inputs);
    if (writable(output)) {
      at::NoGradGuard no_grad;
      output.copy_(inputs[static_cast<size_t>(rank_)]);
    }
  }
  return Work::completed("scatter", name());
}

std::shared_ptr<Group> FakeGroup::new_subgroup(const std::vector<int>& ranks) {
  detail::check_subgroup_ranks(*this, ranks);
  auto it = std::find(ranks.begin(), ranks.end(), rank_);
  if (it == ranks.end()) return nullptr;
  std::vector<int> globals;
  globals.reserve(ranks.size());
  for (int r : ranks) globals.push_back(global_ranks_[static_cast<size_t>(r)]);
  return std::make_shared<FakeGroup>(static_cast<int>(it - ranks.begin()), std::move(globals));
}

}  // namespace comm
}  // namespace dtensor
