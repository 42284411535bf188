// dtensor/comm/c10d_guard.h: what the c10d adapter (C10dGroup) does around each collective so
// that it behaves as ThreadGroup and a single device do (DESIGN.md D12):
//   - the call check: before a collective, every rank's call (op, dtype, shape, arguments)
//     is exchanged; ranks that disagree all throw CollectiveError naming each rank's call
//     (as c10d's ProcessGroupWrapper does under TORCH_DISTRIBUTED_DEBUG=DETAIL), instead of
//     garbage or a hang. Costs one small all-gather per collective (see
//     harness_overhead_benchmark's BM_CheckedAllReduce). On by default in the harness, off
//     elsewhere; DTENSOR_CHECK_COLLECTIVES=1|0 decides when set.
//   - Gloo gaps: NaN kept by MAX/MIN, empty blocks (Gloo divides by zero on them), complex,
//     bool and the other dtypes Gloo lacks (carried as bytes, as real pairs, or widened).
#pragma once

#include "dtensor/comm/group.h"

#include <vector>

namespace dtensor {
namespace comm {

// Process-wide default of the call check (the harness sets true); DTENSOR_CHECK_COLLECTIVES
// ("1"/"0"), when set, wins.
void set_check_collectives_default(bool on);
bool check_collectives_enabled();

namespace guard {

// Called first by each C10dGroup collective. True: the call was done here (the caller
// returns). False: the caller runs it as is. Inside a guard, calls on `g` are not guarded
// again (they reach Gloo as given).
bool all_reduce(Group& g, at::Tensor& t, ReduceOp op);
bool all_gather_into(Group& g, at::Tensor& out, const at::Tensor& in);
bool reduce_scatter_into(Group& g, at::Tensor& out, const at::Tensor& in, ReduceOp op);
bool all_to_all_single(Group& g, at::Tensor& out, const at::Tensor& in,
                       const std::vector<int64_t>& output_splits,
                       const std::vector<int64_t>& input_splits);
bool broadcast(Group& g, at::Tensor& t, int src);
bool barrier(Group& g);
bool send(Group& g, const at::Tensor& t, int dst, int tag);
bool recv(Group& g, at::Tensor& t, int src, int tag);
bool gather(Group& g, const at::Tensor& in, std::vector<at::Tensor>& outs, int dst);
bool scatter(Group& g, at::Tensor& out, const std::vector<at::Tensor>& ins, int src);
bool new_subgroup(Group& g, const std::vector<int>& ranks);  // the call check only

}  // namespace guard
}  // namespace comm
}  // namespace dtensor
