// dtensor/ops/scan_rules.cpp: scans along one dim (DESIGN.md D5): cumsum, cumprod (functional,
// in-place and out=), logcumsumexp, cummax and cummin; and flip, which their backward formulas
// use (the gradient of a scan is the reversed scan of the reversed gradient).
//
// A scan's element i depends on every element before it along the scan dim: a shard of that
// dim needs the totals of the shards before it. cumsum and cumprod keep it, each rank
// combining its piece's scan with those totals (NOTE: [Scans of a sharded scan dim]); the
// other scans replicate the scan dim first. Every other dim keeps its shards. cumsum is
// linear: Partial(sum) and Partial(avg) inputs stay Partial (NOTE: [Partial and
// linearity]); cumprod and logcumsumexp are not. flip replicates the flipped dims (a flipped
// shard belongs to the mirrored rank).
#include "dtensor/ops/registry.h"

#include "dtensor/mesh/device_mesh.h"

#include <ATen/core/dispatch/Dispatcher.h>

namespace dtensor {
namespace ops {
namespace {

// Options for an op that needs the dims in `whole` unsharded and keeps every other dim's
// shards (same rank in and out). Inputs after the first are out= tensors: they hold the
// output's placement.
std::vector<DimOption> keep_other_dims(const OpCall& c, const std::vector<bool>& whole, bool linear) {
  const int64_t nd = c.inputs[0]->ndim();
  auto option = [&](const Placement& p) {
    return DimOption{std::vector<Placement>(std::max<size_t>(c.output_meta.size(), 1), p),
                     std::vector<Placement>(c.inputs.size(), p)};
  };
  std::vector<DimOption> o{option(Replicate{})};
  if (linear)
    for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) o.push_back(option(Partial(op)));
  for (int64_t d = 0; d < nd; ++d)
    if (!whole[d]) o.push_back(option(Shard{d}));
  return o;
}

// `sharded_scan`: the scan dim may be sharded too (cumsum, cumprod: scan_kernel).
Rule scan(bool linear, bool sharded_scan = false) {
  return [linear, sharded_scan](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    std::vector<bool> whole(static_cast<size_t>(nd), false);
    if (nd > 0 && !sharded_scan) whole[normalize_shard_dim(arg_int(c, 1, 0), nd)] = true;
    return keep_other_dims(c, whole, linear);
  };
}

// NOTE: [Scans of a sharded scan dim]
// With the scan dim sharded, a rank's piece starts at some offset of it. Its local scan is the
// global one but for the elements before that offset: for cumsum the sum of the pieces before
// it (added), for cumprod their product (multiplied). Each rank's total is the last slice of
// its local scan (the identity for an empty piece). Mesh dims that split the scan dim are
// taken innermost first (shard_order: the last to split it, strided shards included): an
// all_gather of the totals over that mesh dim's group (group rank = coordinate, the order of
// the pieces in the box they split) gives the totals of the pieces before this one in the box,
// and the box's own total, which is the total gathered at the next mesh dim out. That moves a
// slice per rank and mesh dim where replicating the scan dim moves the whole tensor (PyTorch's
// DTensor replicates it); a scan in place keeps the shard of the tensor it writes. Partial(sum)
// inputs of cumsum stay Partial: the totals are Partial like the pieces, and the sum is linear.
LocalKernel scan_kernel(bool sum) {
  return [sum](const c10::OperatorHandle& op, std::vector<c10::IValue>& args, const OpCall& call,
               const OutputSharding& s) -> std::vector<c10::IValue> {
    const int64_t nd = call.inputs[0]->ndim();
    op.callBoxed(&args);  // the local scan; args[0] is its result (self in place, out= for .out)
    if (nd == 0) return std::move(args);
    const int64_t dim = normalize_shard_dim(arg_int(call, 1, 0), nd);
    const std::vector<int64_t> splits = shard_order(call.mesh->shape(), s.outputs[0], nd)[static_cast<size_t>(dim)];
    if (splits.empty()) return std::move(args);
    at::Tensor result = args[0].toTensor();
    const int64_t n = result.size(dim);
    std::vector<int64_t> slice_shape = result.sizes().vec();
    slice_shape[static_cast<size_t>(dim)] = 1;
    at::Tensor total = n > 0 ? result.narrow(dim, n - 1, 1).contiguous()
                             : (sum ? at::zeros(slice_shape, result.options()) : at::ones(slice_shape, result.options()));
    at::Tensor carry = sum ? at::zeros_like(total) : at::ones_like(total);
    const std::vector<int64_t>& coordinate = *call.mesh->get_coordinate();
    for (auto m = splits.rbegin(); m != splits.rend(); ++m) {
      auto group = call.mesh->get_group(*m);
      at::Tensor totals = at::empty({group->size(), total.numel()}, total.options());
      group->all_gather_into(totals, total.reshape({1, -1}));
      const at::Tensor earlier = totals.narrow(0, 0, coordinate[static_cast<size_t>(*m)]);
      if (sum) {
        carry = carry + earlier.sum(0).reshape(slice_shape);
        total = totals.sum(0).reshape(slice_shape);
      } else {
        carry = carry * earlier.prod(0).reshape(slice_shape);
        total = totals.prod(0).reshape(slice_shape);
      }
    }
    if (sum) result.add_(carry);
    else result.mul_(carry);
    return std::move(args);
  };
}

// Position of the schema argument `name`, or -1.
int64_t arg_position(const OpCall& c, const char* name) {
  const auto& formals = c.schema->arguments();
  for (size_t i = 0; i < formals.size(); ++i)
    if (formals[i].name() == name) return static_cast<int64_t>(i);
  return -1;
}

// sort / topk / kthvalue-like ops: the values along `dim` depend on the whole dim, which is
// replicated; every other dim keeps its shards (values and indices alike). Not linear.
Rule along_dim() {
  return [](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    std::vector<bool> whole(static_cast<size_t>(nd), false);
    const int64_t pos = arg_position(c, "dim");
    if (nd > 0) whole[normalize_shard_dim(pos < 0 ? -1 : arg_int(c, static_cast<size_t>(pos), -1), nd)] = true;
    return keep_other_dims(c, whole, /*linear=*/false);
  };
}

const bool registered = [] {
  // Overloads that exist in libtorch 1.13 and 2.x alike (checked through the dispatcher).
  for (const char* n : {"aten::sort", "aten::sort.stable", "aten::topk"}) register_rule(n, along_dim());
  // cumsum / cumprod: functional, in place and out= (a rule with a kernel does not serve the
  // out= overload by itself: NOTE: [Rules of functional ops serve their out= overloads]).
  for (const bool sum : {true, false}) {
    RuleOptions options;
    options.kernel = scan_kernel(sum);
    for (const char* overload : {"", "_", ".out"}) {
      const std::string name = std::string(sum ? "aten::cumsum" : "aten::cumprod") + overload;
      register_rule(name, scan(/*linear=*/sum, /*sharded_scan=*/true), nullptr, options);
    }
  }
  // cummax / cummin give (values, indices): both keep the other dims' shards.
  for (const char* n : {"aten::logcumsumexp", "aten::_logcumsumexp", "aten::cummax", "aten::cummin"})
    register_rule(n, scan(/*linear=*/false));
  // cummaxmin_backward(grad, input, indices, dim), the gradient of cummax / cummin, scatters grad
  // back along `dim` into a tensor it makes; it reaches us whole (NOTE: [Composite ops run whole]
  // in dtensor/tensor/composite_ops.cpp). Every other dim keeps its shards.
  register_rule("aten::cummaxmin_backward", [](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    std::vector<bool> whole(static_cast<size_t>(nd), false);
    if (nd > 0) whole[normalize_shard_dim(arg_int(c, 3, 0), nd)] = true;
    return keep_other_dims(c, whole, /*linear=*/false);
  });
  register_rule("aten::flip", [](const OpCall& c) {
    const int64_t nd = c.inputs[0]->ndim();
    std::vector<bool> whole(static_cast<size_t>(nd), false);
    for (int64_t d : arg_int_list(c, 1)) whole[normalize_shard_dim(d, nd)] = true;
    return keep_other_dims(c, whole, /*linear=*/true);
  });
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
