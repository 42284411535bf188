// dtensor/comm/thread_collectives.cpp: step 2 of each ThreadGroup collective (NOTE: [ThreadGroup
// rounds] in thread_group.cpp): every rank's result first, then every output.
#include "dtensor/comm/thread_rounds_internal.h"

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace dtensor {
namespace comm {
namespace thread_rounds {

static at::Tensor reduce_tensors(const std::vector<at::Tensor>& xs, ReduceOp op) {
  at::Tensor acc = xs[0].clone(at::MemoryFormat::Contiguous);
  for (size_t i = 1; i < xs.size(); ++i) {
    switch (op) {
      case ReduceOp::SUM:
      case ReduceOp::AVG: acc.add_(xs[i]); break;
      case ReduceOp::PRODUCT: acc.mul_(xs[i]); break;
      case ReduceOp::MIN: acc = at::minimum(acc, xs[i]); break;
      case ReduceOp::MAX: acc = at::maximum(acc, xs[i]); break;
    }
  }
  if (op == ReduceOp::AVG) acc.div_(static_cast<double>(xs.size()));
  return acc;
}

static std::vector<at::Tensor> first_inputs(const Calls& calls) {
  std::vector<at::Tensor> xs;
  for (const auto& c : calls) xs.push_back(c->inputs[0]);
  return xs;
}

void run_all_reduce(const Calls& calls) {
  const at::Tensor result = reduce_tensors(first_inputs(calls), calls[0]->reduce);
  for (const auto& c : calls) c->outputs[0].copy_(result);
}

// NOTE: [ThreadGroup results written in place]
// Step 2 computes every result before writing any output because an output may share memory
// with an input (in-place all_reduce, broadcast). For all_gather and reduce_scatter that is a
// temporary as large as the whole output (all_gather) or input (reduce_scatter), allocated by
// the runner: its rank alone pays it, on top of its own buffers, in the per-rank accounting
// (fsdp_benchmark's per-rank peak, NOTE: [Per-rank memory accounting] in
// dtensor/debug/tracking_allocator_internal.h), though not in a MemTracker's (UntrackedScope).
// When no output shares memory with any input (except, for all_gather, a rank's input that is
// exactly its own block of its output: the in-place all-gather FSDP issues), writing block by
// block reads nothing already written, so the runner writes the outputs directly: the same
// values, with at most one block (reduce_scatter) as a temporary.
static bool only_own_block_shared(const Calls& calls, bool allow_own_block) {
  const int64_t n = static_cast<int64_t>(calls.size());
  for (int64_t r = 0; r < n; ++r) {
    const at::Tensor& out = calls[r]->outputs[0];
    for (int64_t j = 0; j < n; ++j) {
      const at::Tensor& in = calls[j]->inputs[0];
      if (at::get_overlap_status(out, in) == at::MemOverlapStatus::No) continue;
      if (!allow_own_block || j != r) return false;
      const at::Tensor own = out.narrow(0, r * in.size(0), in.size(0));
      if (!(in.data_ptr() == own.data_ptr() && in.sizes() == own.sizes() && in.strides() == own.strides()))
        return false;
    }
  }
  return true;
}

void run_all_gather(const Calls& calls) {
  if (only_own_block_shared(calls, /*allow_own_block=*/true)) {
    for (size_t r = 0; r < calls.size(); ++r) {
      const at::Tensor& out = calls[r]->outputs[0];
      for (size_t j = 0; j < calls.size(); ++j) {
        const at::Tensor& in = calls[j]->inputs[0];
        at::Tensor block = out.narrow(0, static_cast<int64_t>(j) * in.size(0), in.size(0));
        if (block.data_ptr() != in.data_ptr()) block.copy_(in);
      }
    }
    return;
  }
  const at::Tensor result = at::cat(first_inputs(calls), 0);
  for (const auto& c : calls) c->outputs[0].copy_(result);
}

void run_reduce_scatter(const Calls& calls) {
  // Reducing a block alone gives the same values (elementwise, in rank order) as reducing the
  // whole input and taking the block.
  const int64_t n = static_cast<int64_t>(calls.size());
  const int64_t rows = calls[0]->inputs[0].size(0) / n;
  auto block_of = [&](int64_t r) {
    std::vector<at::Tensor> xs;
    for (const auto& c : calls) xs.push_back(c->inputs[0].narrow(0, r * rows, rows));
    return reduce_tensors(xs, calls[0]->reduce);
  };
  if (only_own_block_shared(calls, /*allow_own_block=*/false)) {
    for (int64_t r = 0; r < n; ++r) calls[r]->outputs[0].copy_(block_of(r));
    return;
  }
  const at::Tensor reduced = reduce_tensors(first_inputs(calls), calls[0]->reduce);
  for (int64_t r = 0; r < n; ++r) calls[r]->outputs[0].copy_(reduced.narrow(0, r * rows, rows));
}

// Rank `to`'s all_to_all_single output: its rows from every rank, in rank order.
static at::Tensor all_to_all_rows_for(const Calls& calls, int to) {
  std::vector<at::Tensor> parts;
  for (size_t from = 0; from < calls.size(); ++from) {
    const Call& k = *calls[from];
    const int64_t rows = k.in_splits[to];
    const int64_t expected = calls[to]->out_splits[from];
    TORCH_CHECK(rows == expected, "rank ", from, " sends ", rows, " rows to rank ", to, " but rank ", to,
                " expects ", expected);
    int64_t offset = 0;
    for (int j = 0; j < to; ++j) offset += k.in_splits[j];
    parts.push_back(k.inputs[0].narrow(0, offset, rows));
  }
  return at::cat(parts, 0);
}

void run_all_to_all(const Calls& calls) {
  std::vector<at::Tensor> results;
  for (size_t to = 0; to < calls.size(); ++to) results.push_back(all_to_all_rows_for(calls, static_cast<int>(to)));
  for (size_t to = 0; to < calls.size(); ++to) calls[to]->outputs[0].copy_(results[to]);
}

void run_broadcast(const Calls& calls) {
  const int src = calls[0]->root;
  const at::Tensor value = calls[src]->inputs[0].clone();
  for (size_t r = 0; r < calls.size(); ++r)
    if (static_cast<int>(r) != src) calls[r]->outputs[0].copy_(value);
}

void run_gather(const Calls& calls) {
  const Call& dst = *calls[calls[0]->root];
  std::vector<at::Tensor> values;  // clones: an output may alias some rank's input
  for (const auto& c : calls) values.push_back(c->inputs[0].clone());
  for (size_t r = 0; r < calls.size(); ++r) dst.outputs[r].copy_(values[r]);
}

void run_scatter(const Calls& calls) {
  const Call& src = *calls[calls[0]->root];
  std::vector<at::Tensor> values;  // clones: an output may alias one of src's inputs
  for (const auto& t : src.inputs) values.push_back(t.clone());
  for (size_t r = 0; r < calls.size(); ++r) calls[r]->outputs[0].copy_(values[r]);
}

void run_nothing(const Calls&) {}

}  // namespace thread_rounds
}  // namespace comm
}  // namespace dtensor
