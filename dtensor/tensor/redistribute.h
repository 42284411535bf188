// dtensor/tensor/redistribute.h: moving a local shard between placements (no autograd).
#pragma once

#include "dtensor/placement/placement.h"

#include "dtensor/comm/work.h"

#include <ATen/core/Tensor.h>

#include <functional>

namespace dtensor {
namespace detail {

// Collective over the mesh dims whose placement changes. Returns this rank's new local tensor
// for `to` (same global tensor as `from` describes).
//
// NOTE: [Redistribute order]
// A tensor dim may be sharded by several mesh dims: mesh dim i splits it, a later mesh dim j
// splits that piece again. So transitions away from Shard run innermost mesh dim first
// (reverse order), and transitions to Shard outermost first (forward order).
// With a StridedShard on either side see NOTE: [Redistributing strided shards].
at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& from,
                              const std::vector<Placement>& to);

// A local tensor that the last collective of a redistribution may still be computing.
struct PendingLocal {
  comm::WorkPtr work;               // the collective in flight; nullptr: `value` is ready
  at::Tensor value;                 // the result, once ready
  std::function<at::Tensor()> then;  // with `work`: the result once it completed (local steps)
  // Waits for the collective (rethrowing its error) and returns the result.
  at::Tensor get();
};

// As redistribute_local, but the last collective is left in flight (PyTorch's async
// redistribute): collectives before it complete first, local steps after it run in `then`.
// Redistributions involving strided shards complete before returning.
PendingLocal redistribute_local_async(const at::Tensor& local, const DTensorSpec& from,
                                      const std::vector<Placement>& to);

}  // namespace detail
}  // namespace dtensor
