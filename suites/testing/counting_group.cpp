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

void CountingGroup::all_reduce(at::Tensor& tensor, comm::ReduceOp op) {
  bump("all_reduce");
  inner_->all_reduce(tensor, op);
}
void CountingGroup::all_gather_into(at::Tensor& output, const at::Tensor& input) {
  bump("all_gather_into");
  inner_->all_gather_into(output, input);
}
void CountingGroup::reduce_scatter_into(at::Tensor& output, const at::Tensor& input, comm::ReduceOp op) {
  bump("reduce_scatter_into");
  inner_->reduce_scatter_into(output, input, op);
}
void CountingGroup::all_to_all_single(at::Tensor& output, const at::Tensor& input,
                                      const std::vector<int64_t>& output_splits,
                                      const std::vector<int64_t>& input_splits) {
  bump("all_to_all_single");
  inner_->all_to_all_single(output, input, output_splits, input_splits);
}
void CountingGroup::broadcast(at::Tensor& tensor, int src) {
  bump("broadcast");
  inner_->broadcast(tensor, src);
}
void CountingGroup::barrier() {
  bump("barrier");
  inner_->barrier();
}
void CountingGroup::send(const at::Tensor& tensor, int dst, int tag) {
  bump("send");
  inner_->send(tensor, dst, tag);
}
void CountingGroup::recv(at::Tensor& tensor, int src, int tag) {
  bump("recv");
  inner_->recv(tensor, src, tag);
}
void CountingGroup::gather(const at::Tensor& input, std::vector<at::Tensor>& outputs, int dst) {
  bump("gather");
  inner_->gather(input, outputs, dst);
}
void CountingGroup::scatter(at::Tensor& output, const std::vector<at::Tensor>& inputs, int src) {
  bump("scatter");
  inner_->scatter(output, inputs, src);
}
std::shared_ptr<comm::Group> CountingGroup::new_subgroup(const std::vector<int>& ranks) {
  bump("new_subgroup");
  comm::GroupPtr sub = inner_->new_subgroup(ranks);
  if (!sub) return nullptr;
  return std::shared_ptr<CountingGroup>(new CountingGroup(std::move(sub), counters_));
}

}  // namespace testing
}  // namespace dtensor
