// dtensor/ops/pool_rules.cpp: pooling, unpooling, upsampling and grid sampling, with their
// backward ops (DESIGN.md D5).
//
// NOTE: [Pooling keeps the leading dims' shards]
// These ops take (N, C, *spatial) or, unbatched, (C, *spatial), and compute every (n, c) plane
// from that plane alone: max_pool's indices and max_unpool's are flat positions within the
// plane. So per mesh dim, a shard of a leading dim (batch or channel) of every tensor argument
// gives the output the same shard, with no communication; the spatial dims are replicated (a
// window reaches across shard borders). fractional_max_pool's random_samples is (N, C, 2): its
// leading dims line up with the input's batched dims. The ops that are linear in their first
// tensor (avg and adaptive avg pooling, every interpolation, the backward ops in grad_output,
// max_unpool in its values with the indices replicated) keep a Partial(sum or avg) first
// input Partial, the other tensors replicated.
// grid_sampler's grid is (N, H_out, W_out, 2) (or 3-D: (N, D, H, W, 3)): batch shards line up
// with the input's, a channel shard of the input samples with a replicated grid; its backward
// gives the grid's gradient as Partial(sum) over a channel shard (it sums over channels).
#include "dtensor/ops/rule_helpers.h"

namespace dtensor {
namespace ops {
namespace {

const Placement R = Replicate{};

std::vector<Placement> all(size_t n, const Placement& p) { return std::vector<Placement>(n, p); }

// `spatial`: the trailing dims each plane spans; `private_dims[i]`: the trailing dims of tensor
// input i outside the leading ones (default `spatial`); `linear`: linear in input 0.
struct PoolOp {
  int64_t spatial = 2;
  bool linear = false;
  std::vector<int64_t> private_dims;
};

// Whether input `input`'s dim `dim` may be split: libtorch's pooling, upsampling and sampling
// kernels refuse empty planes (and, in some versions, an empty batch), so a dim is split only
// where no rank's piece of it is empty.
bool splits(const OpCall& c, size_t input, int64_t dim) {
  return detail::shards_never_empty(c.inputs[input]->tensor_meta.shape[static_cast<size_t>(dim)], *c.mesh);
}

std::vector<DimOption> pool_options(const OpCall& c, const PoolOp& op) {
  const size_t n_in = c.inputs.size(), n_out = std::max<size_t>(c.output_meta.size(), 1);
  std::vector<DimOption> o{{all(n_out, R), all(n_in, R)}};
  if (n_in == 0) return o;
  const int64_t leading = c.inputs[0]->ndim() - op.spatial;
  for (int64_t d = 0; d < leading; ++d) {
    DimOption k{all(n_out, Shard{d}), all(n_in, R)};
    bool fits = splits(c, 0, d);
    for (size_t i = 0; i < n_in && fits; ++i) {
      const int64_t priv = i < op.private_dims.size() ? op.private_dims[i] : op.spatial;
      // The input's own leading dims, right-aligned with the first input's.
      const int64_t dim = d + (c.inputs[i]->ndim() - priv) - leading;
      fits = dim >= 0 && dim < c.inputs[i]->ndim();
      if (fits) k.inputs[i] = Shard{dim};
    }
    for (const auto& m : c.output_meta)
      fits = fits && static_cast<int64_t>(m.shape.size()) - op.spatial == leading;
    if (fits) o.push_back(std::move(k));
  }
  if (op.linear)
    for (auto reduce : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) {
      DimOption p{all(n_out, Partial(reduce)), all(n_in, R)};
      p.inputs[0] = Partial(reduce);
      o.push_back(std::move(p));
    }
  return o;
}

Rule pool(int64_t spatial, bool linear, std::vector<int64_t> private_dims = {}) {
  PoolOp op{spatial, linear, std::move(private_dims)};
  return [op](const OpCall& c) { return pool_options(c, op); };
}

// grid_sampler_{2,3}d(input, grid, ...): (N, C, *in) and (N, *out, k) -> (N, C, *out).
std::vector<DimOption> grid_sampler_options(const OpCall& c) {
  std::vector<DimOption> o{{{R}, {R, R}}};
  if (splits(c, 0, 0)) o.push_back({{Shard{0}}, {Shard{0}, Shard{0}}});
  if (splits(c, 0, 1)) o.push_back({{Shard{1}}, {Shard{1}, R}});
  for (auto reduce : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) o.push_back({{Partial(reduce)}, {Partial(reduce), R}});
  return o;
}

// grid_sampler_{2,3}d_backward(grad_output, input, grid, ..., output_mask) -> (grad_input,
// grad_grid). grad_grid sums over channels the product of grad_output and the input's slopes.
std::vector<DimOption> grid_sampler_backward_options(const OpCall& c) {
  const Placement S0 = Shard{0}, S1 = Shard{1};
  std::vector<DimOption> o{{{R, R}, {R, R, R}}};
  if (splits(c, 1, 0)) o.push_back({{S0, S0}, {S0, S0, S0}});
  if (splits(c, 1, 1)) o.push_back({{S1, Partial(comm::ReduceOp::SUM)}, {S1, S1, R}});
  for (auto reduce : {comm::ReduceOp::SUM, comm::ReduceOp::AVG})
    o.push_back({{Partial(reduce), Partial(reduce)}, {Partial(reduce), R, R}});  // linear in grad_output
  return o;
}

// upsample_*_backward(grad_output, output_size, input_size, ...): input_size is grad_input's
// global shape, which each rank's kernel needs as its local one. Registered for the
// .grad_input out= overloads too (same arguments, then the out= tensor).
void rewrite_input_size(std::vector<c10::IValue>& args, const OpCall& c, const std::vector<std::vector<Placement>>& outputs) {
  if (c.output_meta.empty() || outputs.empty()) return;
  args[2] = compute_local_shape(c.output_meta[0].shape, *c.mesh, outputs[0]);
}

void register_upsample(const std::string& name, int64_t k) {
  register_rule("aten::" + name, pool(k, true));
  for (const std::string backward : {"aten::" + name + "_backward", "aten::" + name + "_backward.grad_input"})
    register_rule(backward, pool(k, true), rewrite_input_size);
}

const bool registered = [] {
  // The 1-D poolings decompose into the 2-D ones (CompositeImplicitAutograd).
  for (int64_t k : {2, 3}) {
    const std::string d = std::to_string(k) + "d";
    // Max pooling (values and indices) and its backward (linear in grad_output).
    register_rule("aten::max_pool" + d + "_with_indices", pool(k, false));
    register_rule("aten::max_pool" + d + "_with_indices_backward", pool(k, true));
    register_rule("aten::adaptive_max_pool" + d, pool(k, false));
    register_rule("aten::adaptive_max_pool" + d + "_backward", pool(k, true));
    register_rule("aten::fractional_max_pool" + d, pool(k, false, {k, 1}));
    register_rule("aten::fractional_max_pool" + d + "_backward", pool(k, true));
    register_rule("aten::max_unpool" + d, pool(k, true));
    // Averages and interpolations: linear.
    register_rule("aten::avg_pool" + d, pool(k, true));
    register_rule("aten::avg_pool" + d + "_backward", pool(k, true));
    register_rule("aten::_adaptive_avg_pool" + d, pool(k, true));
    register_rule("aten::_adaptive_avg_pool" + d + "_backward", pool(k, true));
  }
  for (int64_t k : {1, 2, 3}) {
    const std::string d = std::to_string(k) + "d";
    for (const char* mode : {"upsample_nearest", "_upsample_nearest_exact"}) register_upsample(mode + d, k);
  }
  for (const char* n : {"upsample_linear1d", "upsample_bilinear2d", "upsample_bicubic2d", "upsample_trilinear3d",
                        "_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa", "_upsample_lanczos2d_aa"})
    register_upsample(n, n[std::string(n).size() - 2] - '0');
  for (const char* n : {"aten::grid_sampler_2d", "aten::grid_sampler_3d"}) register_rule(n, grid_sampler_options);
  for (const char* n : {"aten::grid_sampler_2d_backward", "aten::grid_sampler_3d_backward"})
    register_rule(n, grid_sampler_backward_options);
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
