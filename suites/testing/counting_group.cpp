// suites/testing/counting_group.cpp
#include "suites/testing/counting_group.h"

#include <c10/util/Exception.h>

namespace dtensor {
namespace testing {

CountingGroup::CountingGroup(comm::GroupPtr inner) : CountingGroup(std::move(inner), std::make_shared<Counters>()) {}

CountingGroup::CountingGroup(comm::GroupPtr inner, std::shared_ptr<Counters> counters)
    : inner_(std::move(inner)), counters_(std::move(counters)) {
  TORCH_CHECK(inner_ != nullptr, "CountingGroup: the wrapped group is null");
}

void CountingGroup::bump(const char* op) {
  std::lock_guard<std::mutex> lk(counters_->mu);
  ++counters_->counts[op];
}

std::map<std::string, int64_t> CountingGroup::counts() const {
  std::lock_guard<std::mutex> lk(counters_->mu);
  return counters_->counts;
}

int64_t CountingGroup::collectives() const {
  int64_t n = 0;
  for (const auto& kv : counts())
    if (kv.first != "send" && kv.first != "recv") n += kv.second;
  return n;
}

void CountingGroup::reset() {
  std::lock_guard<std::mutex> lk(counters_->mu);
  counters_->counts.clear();
}

comm::WorkPtr CountingGroup::all_reduce_async(const at::Tensor& tensor, comm::ReduceOp op) {
  bump("all_reduce");
  return inner_->all_reduce_async(tensor, op);
}
comm::WorkPtr CountingGroup::all_gather_into_async(const at::Tensor& output, const at::Tensor& input) {
  bump("all_gather_into");
  return inner_->all_gather_into_async(output, input);
}
comm::WorkPtr CountingGroup::reduce_scatter_into_async(const at::Tensor& output, const at::Tensor& input,
                                                       comm::ReduceOp op) {
  bump("reduce_scatter_into");
  return inner_->reduce_scatter_into_async(output, input, op);
}
comm::WorkPtr CountingGroup::all_to_all_single_async(const at::Tensor& output, const at::Tensor& input,
                                                     const std::vector<int64_t>& output_splits,
                                                     const std::vector<int64_t>& input_splits) {
  bump("all_to_all_single");
  return inner_->all_to_all_single_async(output, input, output_splits, input_splits);
}
comm::WorkPtr CountingGroup::broadcast_async(const at::Tensor& tensor, int src) {
  bump("broadcast");
  return inner_->broadcast_async(tensor, src);
}
comm::WorkPtr CountingGroup::barrier_async() {
  bump("barrier");
  return inner_->barrier_async();
}
comm::WorkPtr CountingGroup::send_async(const at::Tensor& tensor, int dst, int tag) {
  bump("send");
  return inner_->send_async(tensor, dst, tag);
}
comm::WorkPtr CountingGroup::recv_async(const at::Tensor& tensor, int src, int tag) {
  bump("recv");
  return inner_->recv_async(tensor, src, tag);
}
comm::WorkPtr CountingGroup::gather_async(const at::Tensor& input, const std::vector<at::Tensor>& outputs, int dst) {
  bump("gather");
  return inner_->gather_async(input, outputs, dst);
}
comm::WorkPtr CountingGroup::scatter_async(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) {
  bump("scatter");
  return inner_->scatter_async(output, inputs, src);
}
std::shared_ptr<comm::Group> CountingGroup::new_subgroup(const std::vector<int>& ranks) {
  bump("new_subgroup");
  comm::GroupPtr sub = inner_->new_subgroup(ranks);
  if (!sub) return nullptr;
  return std::shared_ptr<CountingGroup>(new CountingGroup(std::move(sub), counters_));
}

}  // namespace testing
}  // namespace dtensor
