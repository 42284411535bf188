// dtensor/ops/view_rules.cpp: ops that only re-index a tensor (DESIGN.md D5): t, transpose,
// permute, unsqueeze, squeeze, expand, view/_unsafe_view/_reshape_alias. Each maps a sharded
// input dim to the output dim holding the same data; where no such dim exists (a sharded dim
// that is merged behind another, or split unevenly) the input is replicated first. Views are
// linear, so Partial stays Partial. Size arguments are rewritten to the local shapes.
#include "dtensor/ops/registry.h"

#include <ATen/TensorUtils.h>
#include <c10/util/Exception.h>

namespace dtensor {
namespace ops {
namespace {

// Options from a map out_dim -> in_dim (-1: no input dim feeds it alone).
std::vector<DimOption> mapped_options(const std::vector<int64_t>& out_to_in) {
  std::vector<DimOption> o{{{Replicate{}}, {Replicate{}}}, {{Partial{}}, {Partial{}}},
                           {{Partial(comm::ReduceOp::AVG)}, {Partial(comm::ReduceOp::AVG)}}};
  for (int64_t d = 0; d < static_cast<int64_t>(out_to_in.size()); ++d)
    if (out_to_in[d] >= 0) o.push_back({{Shard{d}}, {Shard{out_to_in[d]}}});
  return o;
}

// Whether splitting a dim of `n` over some mesh dim (or the whole mesh) can give a shard of
// size exactly 1 (NOTE: [Uneven shards]).
bool may_have_size1_shard(int64_t n, const DeviceMesh& mesh) {
  std::vector<int64_t> ways{mesh.size()};
  for (int64_t d = 0; d < mesh.ndim(); ++d) ways.push_back(mesh.size(d));
  for (int64_t k : ways)
    for (int64_t r = 0; r < k; ++r)
      if (shard_size_and_offset(n, k, r).first == 1) return true;
  return false;
}

const std::vector<int64_t>& in_shape(const OpCall& c) { return c.inputs[0]->tensor_meta.shape; }
const std::vector<int64_t>& out_shape(const OpCall& c) { return c.output_meta[0].shape; }

std::vector<int64_t> permutation(const OpCall& c) {
  const int64_t nd = static_cast<int64_t>(in_shape(c).size());
  std::vector<int64_t> perm(nd);
  for (int64_t i = 0; i < nd; ++i) perm[i] = i;
  const std::string& n = c.name;
  if (n == "aten::t") {
    if (nd == 2) std::swap(perm[0], perm[1]);
  } else if (n == "aten::transpose.int") {
    if (nd > 0) std::swap(perm[normalize_shard_dim(arg_int(c, 1, 0), nd)], perm[normalize_shard_dim(arg_int(c, 2, 0), nd)]);
  } else {  // permute
    auto dims = arg_int_list(c, 1);
    for (int64_t i = 0; i < nd; ++i) perm[i] = normalize_shard_dim(dims[i], nd);
  }
  return perm;
}

// view/reshape: group input and output dims into runs of equal product.
std::vector<int64_t> view_map(const OpCall& c) {
  const auto& in = in_shape(c);
  const auto& out = out_shape(c);
  std::vector<int64_t> map(out.size(), -1);
  for (auto s : in)
    if (s == 0) return map;
  const int64_t shards = c.mesh->size();
  size_t i = 0, j = 0;
  while (i < in.size() && j < out.size()) {
    size_t i2 = i + 1, j2 = j + 1;
    int64_t pi = in[i], pj = out[j];
    while (pi != pj) {
      if (pi < pj) {
        if (i2 >= in.size()) return map;
        pi *= in[i2++];
      } else {
        if (j2 >= out.size()) return map;
        pj *= out[j2++];
      }
    }
    // Input dims [i, i2) hold the same elements as output dims [j, j2).
    // Size-1 dims carry no data order: the leading dim of a group is its first dim of size > 1
    // (so [1, 1, 64] -> [64] keeps a shard of dim 2, as a bias gradient summed with keepdim does).
    auto lead = [](const std::vector<int64_t>& shape, size_t from, size_t to) {
      while (from + 1 < to && shape[from] == 1) ++from;
      return from;
    };
    if (i2 - i == 1 && j2 - j == 1) {
      map[j] = static_cast<int64_t>(i);
    } else if (j2 - j == 1) {  // flatten: the leading input dim keeps even shards
      const size_t a = lead(in, i, i2);
      if (in[a] % shards == 0) map[j] = static_cast<int64_t>(a);
    } else if (i2 - i == 1) {  // split: the leading output dim takes the shards
      const size_t b = lead(out, j, j2);
      if (out[b] % shards == 0) map[b] = static_cast<int64_t>(i);
    }
    i = i2;
    j = j2;
  }
  return map;
}

std::vector<int64_t> local_out_shape(const OpCall& c, const std::vector<std::vector<Placement>>& outs) {
  return compute_local_shape(out_shape(c), *c.mesh, outs[0]);
}

void rewrite_size(std::vector<c10::IValue>& args, const OpCall& c, const std::vector<std::vector<Placement>>& outs) {
  args[1] = local_out_shape(c, outs);
}

void rewrite_reshape_alias(std::vector<c10::IValue>& args, const OpCall& c,
                           const std::vector<std::vector<Placement>>& outs) {
  const at::Tensor& local = args[0].toTensor();
  auto shape = local_out_shape(c, outs);
  auto stride = at::detail::computeStride(local.sizes(), local.strides(), shape);
  TORCH_CHECK(stride.has_value(), "DTensor: ", c.name, ": the local shard of shape ", local.sizes(),
              " cannot be viewed as ", c10::IntArrayRef(shape), "; call contiguous() first");
  args[1] = shape;
  args[2] = std::vector<int64_t>(stride->begin(), stride->end());
}

const bool registered = [] {
  auto perm_rule = [](const OpCall& c) { return mapped_options(permutation(c)); };
  register_rule("aten::t", perm_rule);
  register_rule("aten::transpose.int", perm_rule);
  register_rule("aten::permute", perm_rule);
  register_rule("aten::unsqueeze", [](const OpCall& c) {
    const int64_t nd_out = static_cast<int64_t>(out_shape(c).size());
    const int64_t at = normalize_shard_dim(arg_int(c, 1, 0), nd_out);
    std::vector<int64_t> map(nd_out, -1);
    for (int64_t d = 0; d < nd_out; ++d)
      if (d != at) map[d] = d < at ? d : d - 1;
    return mapped_options(map);
  });
  // squeeze: output dims are the input dims that survive, in order; match them greedily by
  // size. NOTE: squeeze() without a dim runs on the local shard and drops every dim of size
  // 1 THERE: a sharded dim must never have a size-1 shard (e.g. 4 split 4 ways), or the
  // local result would lose it. squeeze.dim names its dim, so only that one goes.
  auto squeeze_rule = [](const OpCall& c, bool all_dims) {
    const auto& in = in_shape(c);
    const auto& out = out_shape(c);
    std::vector<int64_t> map(out.size(), -1);
    size_t j = 0;
    for (size_t i = 0; i < in.size() && j < out.size(); ++i) {
      if (in[i] == out[j] && (in[i] != 1 || in.size() - i == out.size() - j)) map[j++] = static_cast<int64_t>(i);
      else if (in[i] != 1) return mapped_options(std::vector<int64_t>(out.size(), -1));
    }
    if (all_dims)
      for (auto& m : map)
        if (m >= 0 && may_have_size1_shard(in[m], *c.mesh)) m = -1;
    return mapped_options(map);
  };
  register_rule("aten::squeeze", [squeeze_rule](const OpCall& c) { return squeeze_rule(c, true); });
  register_rule("aten::squeeze.dim", [squeeze_rule](const OpCall& c) { return squeeze_rule(c, false); });
  register_rule(
      "aten::expand",
      [](const OpCall& c) {
        const auto& in = in_shape(c);
        const auto& out = out_shape(c);
        std::vector<int64_t> map(out.size(), -1);
        for (int64_t d = 0; d < static_cast<int64_t>(out.size()); ++d) map[d] = broadcast_input_dim(in, out, d);
        return mapped_options(map);
      },
      rewrite_size);
  // Complex <-> real views: the complex dims keep their shards; the trailing (re, im) dim of
  // size 2 is never sharded.
  register_rule("aten::view_as_real", [](const OpCall& c) {
    std::vector<int64_t> map(out_shape(c).size(), -1);
    for (size_t d = 0; d + 1 < map.size(); ++d) map[d] = static_cast<int64_t>(d);
    return mapped_options(map);
  });
  register_rule("aten::view_as_complex", [](const OpCall& c) {
    std::vector<int64_t> map(out_shape(c).size(), -1);
    for (size_t d = 0; d < map.size(); ++d) map[d] = static_cast<int64_t>(d);
    return mapped_options(map);
  });
  auto view_rule = [](const OpCall& c) { return mapped_options(view_map(c)); };
  register_rule("aten::view", view_rule, rewrite_size);
  register_rule("aten::_unsafe_view", view_rule, rewrite_size);
  register_rule("aten::_reshape_alias", view_rule, rewrite_reshape_alias);
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
