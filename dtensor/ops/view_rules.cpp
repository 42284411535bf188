// dtensor/ops/view_rules.cpp: ops that only re-index a tensor (DESIGN.md D5): view/_unsafe_view/
// _reshape_alias (and through them reshape, flatten, unflatten), t, transpose, permute (and
// movedim), squeeze/unsqueeze and their in-place forms, expand, repeat, split/unbind (and
// chunk), slice/narrow_copy (and narrow), select, diagonal, as_strided, view_as_real/complex,
// and the backward ops of select, slice and diagonal.
//
// Each rule maps a sharded input dim to the output dim that holds the same data; where no
// such dim exists (a dim that is sliced, selected, merged behind another, or split so that
// the shards no longer line up) the input is replicated on it first. Views only move
// elements, so every Partial stays Partial (NOTE: [Partial through data movement]). Size
// arguments are rewritten to the local shapes.
//
// NOTE: [Views of uneven shards]
// view/reshape group the input and output dims into runs of equal product ([8, 4] -> [32]:
// one group; [4, 6] -> [2, 12]: one group of two dims on each side). Within a group only the
// leading dim (the first of size > 1) can be sharded: its torch.chunk pieces are contiguous
// runs of the group's elements, and they stay shards of the output's leading dim exactly when
// every rank's run is the same on both sides. For a flatten of n rows of r elements over k
// ranks that means ceil(n / k) * r == ceil(n * r / k): always when k divides n, sometimes
// otherwise (7 rows of 2 on 4 ranks: 2,2,2,1 rows = 4,4,4,2 elements), never for 5 rows of 6
// (2,2,1,0 rows = 12,12,6,0, but chunking 30 elements gives 8,8,8,6). On a mesh of several
// dims each mesh dim splits what the previous left, so whether a mesh dim may keep the shard
// depends on the others: the engine asks RuleOptions::valid, which compares the runs of every
// coordinate of the mesh. The same check guards squeeze(), which drops every dim that is 1
// locally: a sharded dim must not have a shard of exactly 1 element anywhere.
#include "dtensor/ops/rule_helpers.h"

#include <ATen/TensorUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>
#include <c10/util/strides.h>

#include <numeric>

namespace dtensor {
namespace ops {
namespace {

using detail::mapped_options;
using detail::PartialKind;

const std::vector<int64_t>& in_shape(const OpCall& c) { return c.inputs[0]->tensor_meta.shape; }
const std::vector<int64_t>& out_shape(const OpCall& c) { return c.output_meta[0].shape; }
int64_t in_ndim(const OpCall& c) { return static_cast<int64_t>(in_shape(c).size()); }

int64_t product(const std::vector<int64_t>& v, int64_t begin, int64_t end) {
  return std::accumulate(v.begin() + begin, v.begin() + end, int64_t{1}, std::multiplies<int64_t>());
}

std::vector<int64_t> identity_map(int64_t n) {
  std::vector<int64_t> m(static_cast<size_t>(n));
  std::iota(m.begin(), m.end(), 0);
  return m;
}

// The map of an op that removes input dim `dim` (select, unbind): output d <- input d or d + 1.
std::vector<int64_t> drop_dim_map(int64_t in_nd, int64_t dim) {
  std::vector<int64_t> m;
  for (int64_t d = 0; d < in_nd; ++d)
    if (d != dim) m.push_back(d);
  return m;
}

// The inverse of drop_dim_map (select_backward): output d <- grad d or d - 1; `dim` unmapped.
std::vector<int64_t> insert_dim_map(int64_t out_nd, int64_t dim) {
  std::vector<int64_t> m(static_cast<size_t>(out_nd), -1);
  for (int64_t d = 0; d < out_nd; ++d)
    if (d != dim) m[d] = d < dim ? d : d - 1;
  return m;
}

// ---- permutations -------------------------------------------------------------------------------

std::vector<int64_t> permutation(const OpCall& c) {
  const int64_t nd = in_ndim(c);
  std::vector<int64_t> perm = identity_map(nd);
  const std::string& n = c.name;
  if (n == "aten::t" || n == "aten::t_") {
    if (nd == 2) std::swap(perm[0], perm[1]);
  } else if (n == "aten::transpose.int" || n == "aten::transpose_") {
    if (nd > 0) std::swap(perm[normalize_shard_dim(arg_int(c, 1, 0), nd)], perm[normalize_shard_dim(arg_int(c, 2, 0), nd)]);
  } else {  // permute
    auto dims = arg_int_list(c, 1);
    for (int64_t i = 0; i < nd; ++i) perm[i] = normalize_shard_dim(dims[i], nd);
  }
  return perm;
}

// ---- view / reshape (NOTE: [Views of uneven shards]) -------------------------------------------

struct ViewGroup {
  int64_t in_begin, in_end, out_begin, out_end;
  int64_t in_lead, out_lead;  // the first dim of size > 1 on each side (or the first dim)
};

int64_t lead_dim(const std::vector<int64_t>& shape, int64_t begin, int64_t end) {
  for (int64_t d = begin; d < end; ++d)
    if (shape[d] != 1) return d;
  return begin;
}

// Runs of input and output dims with equal products; empty when a size is 0 (nothing to shard).
std::vector<ViewGroup> view_groups(const std::vector<int64_t>& in, const std::vector<int64_t>& out) {
  std::vector<ViewGroup> groups;
  for (auto s : in)
    if (s == 0) return {};
  const int64_t ni = static_cast<int64_t>(in.size()), no = static_cast<int64_t>(out.size());
  int64_t i = 0, j = 0;
  while (i < ni && j < no) {
    int64_t i2 = i + 1, j2 = j + 1;
    int64_t pi = in[i], pj = out[j];
    while (pi != pj) {
      if (pi < pj) {
        if (i2 >= ni) return {};
        pi *= in[i2++];
      } else {
        if (j2 >= no) return {};
        pj *= out[j2++];
      }
    }
    groups.push_back({i, i2, j, j2, lead_dim(in, i, i2), lead_dim(out, j, j2)});
    i = i2;
    j = j2;
  }
  return groups;
}

std::vector<DimOption> view_options(const OpCall& c) {
  std::vector<int64_t> map(out_shape(c).size(), -1);
  for (const ViewGroup& g : view_groups(in_shape(c), out_shape(c))) map[g.out_lead] = g.in_lead;
  return mapped_options(map);
}

// Every rank's shard of every group is the same run of elements on both sides.
bool view_keeps_shards(const OpCall& c, const FullPlacements& ins, const FullPlacements& outs) {
  const auto& in = in_shape(c);
  const auto& out = out_shape(c);
  const auto groups = view_groups(in, out);
  const std::vector<int64_t> mesh_shape = c.mesh->shape();
  return detail::for_every_coordinate(*c.mesh, [&](const std::vector<int64_t>& coord) {
    const auto [in_local, in_off] = compute_local_shape_and_global_offset(in, mesh_shape, ins[0], coord);
    const auto [out_local, out_off] = compute_local_shape_and_global_offset(out, mesh_shape, outs[0], coord);
    for (const ViewGroup& g : groups) {
      for (int64_t d = g.in_begin; d < g.in_end; ++d)
        if (d != g.in_lead && in_local[d] != in[d]) return false;
      for (int64_t d = g.out_begin; d < g.out_end; ++d)
        if (d != g.out_lead && out_local[d] != out[d]) return false;
      const int64_t r_in = product(in, g.in_lead + 1, g.in_end);
      const int64_t r_out = product(out, g.out_lead + 1, g.out_end);
      const int64_t n = in_local[g.in_lead] * r_in;
      if (n != out_local[g.out_lead] * r_out) return false;
      if (n > 0 && in_off[g.in_lead] * r_in != out_off[g.out_lead] * r_out) return false;
    }
    return true;
  });
}

// ---- squeeze ------------------------------------------------------------------------------------

// Output dims are the input dims that survive, in order. squeeze.dim names the dim that goes
// (when it is 1): of [1, 1] squeeze(1) keeps dim 0, which matching by size cannot tell from
// dim 1 (a shard of the dropped dim would be taken for one of the kept dim). squeeze() drops
// every dim of size 1: match greedily by size.
std::vector<int64_t> squeeze_map(const OpCall& c) {
  const auto& in = in_shape(c);
  const auto& out = out_shape(c);
  std::vector<int64_t> map(out.size(), -1);
  if (c.args.size() > 1 && c.args[1].value.isInt()) {
    const auto nd = static_cast<int64_t>(in.size());
    const int64_t dropped = nd == 0 ? -1 : normalize_shard_dim(arg_int(c, 1, 0), nd);
    size_t k = 0;
    for (int64_t i = 0; i < nd && k < out.size(); ++i)
      if (i != dropped || in[static_cast<size_t>(i)] != 1) map[k++] = i;
    return map;
  }
  size_t j = 0;
  for (size_t i = 0; i < in.size() && j < out.size(); ++i) {
    if (in[i] == out[j] && (in[i] != 1 || in.size() - i == out.size() - j)) map[j++] = static_cast<int64_t>(i);
    else if (in[i] != 1) return std::vector<int64_t>(out.size(), -1);
  }
  return map;
}

// ---- diagonal -----------------------------------------------------------------------------------

// diagonal(offset, dim1, dim2): the other dims in order, then the diagonal.
std::vector<int64_t> diagonal_kept_dims(int64_t nd, int64_t dim1, int64_t dim2) {
  std::vector<int64_t> kept;
  for (int64_t d = 0; d < nd; ++d)
    if (d != dim1 && d != dim2) kept.push_back(d);
  return kept;
}

// ---- local arguments ----------------------------------------------------------------------------

std::vector<int64_t> local_out_shape(const OpCall& c, const std::vector<std::vector<Placement>>& outs) {
  return compute_local_shape(out_shape(c), *c.mesh, outs[0]);
}

// Argument `index` (a size list) becomes the output's local shape.
LocalArgRewrite local_size_at(size_t index) {
  return [index](std::vector<c10::IValue>& args, const OpCall& c, const std::vector<std::vector<Placement>>& outs) {
    args[index] = local_out_shape(c, outs);
  };
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

// ---- as_strided ---------------------------------------------------------------------------------

// NOTE: [as_strided on DTensors]
// as_strided(size, stride, offset) reads storage. A DTensor has no storage, but a DTensor that
// is contiguous (global strides) is a row-major run of the storage starting at its storage
// offset s: element i of the tensor is storage element s + i. The local tensor stands in for
// that run when it holds the whole tensor (Replicate or Partial on every mesh dim), or when
// the call is the identity (size == shape, contiguous strides, offset s), which any shard
// satisfies locally. Every other call replicates the input first. The call must read inside
// the run, and a DTensor with non-contiguous global strides (a transposed or sliced view) has
// no run to read: both raise naming what would work. Autograd's CopySlices relies on the
// replicated case: it takes as_strided views of a replicated new_empty_strided buffer and
// writes through them (NOTE: [In-place writes through DTensor views] in dispatch.cpp).
int64_t as_strided_offset(const OpCall& c) {
  const c10::IValue& offset = c.args.size() > 3 ? c.args[3].value : c10::IValue();
  return offset.isInt() ? offset.toInt() : c.inputs[0]->tensor_meta.storage_offset;
}

bool as_strided_is_identity(const OpCall& c) {
  const auto& shape = in_shape(c);
  const auto contiguous = c10::contiguous_strides(shape);
  return arg_int_list(c, 1) == shape &&
         arg_int_list(c, 2) == std::vector<int64_t>(contiguous.begin(), contiguous.end()) &&
         as_strided_offset(c) == c.inputs[0]->tensor_meta.storage_offset;
}

std::vector<DimOption> as_strided_options(const OpCall& c) {
  const auto& meta = c.inputs[0]->tensor_meta;
  const auto contiguous = c10::contiguous_strides(meta.shape);
  bool is_contiguous = true;
  for (size_t d = 0; d < meta.shape.size(); ++d)
    if (meta.shape[d] != 1 && meta.stride[d] != contiguous[d]) is_contiguous = false;
  TORCH_CHECK(is_contiguous, "DTensor: ", c.name, " on a DTensor of shape ", c10::IntArrayRef(meta.shape),
              " with non-contiguous strides ", c10::IntArrayRef(meta.stride),
              ": a DTensor has no storage for as_strided to read (NOTE: [as_strided on DTensors]); call "
              "contiguous() first");
  // The storage elements the call reads: [offset + lowest, offset + highest].
  const auto size = arg_int_list(c, 1);
  const auto stride = arg_int_list(c, 2);
  int64_t lowest = 0, highest = 0;
  bool empty = false;
  for (size_t d = 0; d < size.size() && d < stride.size(); ++d) {
    if (size[d] == 0) empty = true;
    (stride[d] < 0 ? lowest : highest) += (size[d] - 1) * stride[d];
  }
  int64_t numel = 1;
  for (auto s : meta.shape) numel *= s;
  const int64_t first = as_strided_offset(c) + lowest - meta.storage_offset;
  TORCH_CHECK(empty || (first >= 0 && as_strided_offset(c) + highest - meta.storage_offset < numel), "DTensor: ",
              c.name, "(size=", c10::IntArrayRef(size), ", stride=", c10::IntArrayRef(stride), ", offset=",
              as_strided_offset(c), ") reads storage outside the DTensor of shape ", c10::IntArrayRef(meta.shape),
              " (storage offset ", meta.storage_offset,
              "); a DTensor has only its own elements to read (NOTE: [as_strided on DTensors])");
  return mapped_options(as_strided_is_identity(c) ? identity_map(in_ndim(c)) : std::vector<int64_t>(out_shape(c).size(), -1));
}

// The local tensor in row-major order; the storage offset moved from the global run to the
// local one.
void rewrite_as_strided(std::vector<c10::IValue>& args, const OpCall& c, const std::vector<std::vector<Placement>>& outs) {
  at::Tensor local = args[0].toTensor();
  if (!local.is_contiguous()) local = local.contiguous();  // a copy: the result aliases it, not the shard
  args[0] = local;
  const auto shape = local_out_shape(c, outs);
  if (as_strided_is_identity(c)) {
    const auto strides = c10::contiguous_strides(shape);
    args[1] = shape;
    args[2] = std::vector<int64_t>(strides.begin(), strides.end());
  }
  args[3] = local.storage_offset() + as_strided_offset(c) - c.inputs[0]->tensor_meta.storage_offset;
}

// ---- registration -------------------------------------------------------------------------------

const bool registered = [] {
  auto perm_rule = [](const OpCall& c) { return mapped_options(permutation(c)); };
  for (const char* n : {"aten::t", "aten::transpose.int", "aten::permute"}) register_rule(n, perm_rule);
  RuleOptions inplace;
  inplace.inplace_view = true;
  for (const char* n : {"aten::t_", "aten::transpose_"}) register_rule(n, perm_rule, nullptr, inplace);

  auto unsqueeze_rule = [](const OpCall& c) {
    const int64_t nd_out = static_cast<int64_t>(out_shape(c).size());
    return mapped_options(insert_dim_map(nd_out, normalize_shard_dim(arg_int(c, 1, 0), nd_out)));
  };
  register_rule("aten::unsqueeze", unsqueeze_rule);
  register_rule("aten::unsqueeze_", unsqueeze_rule, nullptr, inplace);

  // squeeze.dim names its dim: only that one goes, so any shard of the others survives.
  auto squeeze_rule = [](const OpCall& c) { return mapped_options(squeeze_map(c)); };
  // The functional and the in-place overload: each rank squeezes the global size-1 dims.
  auto register_squeeze = [&](const char* name, const char* inplace_name, const LocalKernel& kernel) {
    RuleOptions functional;
    functional.kernel = kernel;
    RuleOptions in_place = functional;
    in_place.inplace_view = true;
    register_rule(name, squeeze_rule, nullptr, functional);
    register_rule(inplace_name, squeeze_rule, nullptr, in_place);
  };
  // NOTE: [squeeze() of a shard of one element]
  // squeeze() on a local shard would drop every dim that is 1 THERE, and a shard of a longer dim
  // may hold one element (a dim of 4 on 4 ranks; 5 on 4 ranks: 2, 2, 1, 0). Each rank squeezes
  // instead the dims that are 1 globally, one by one (the last first), so any shard is fine,
  // in place too (before, a tensor with such a shard could not be squeezed in place at all).
  // squeeze(d) and libtorch 2.x's squeeze.dims (which the bare name serves) name their dims:
  // there the named dims that are 1 globally go (a named dim that is not 1 is a no-op, also
  // where a rank's shard of it holds one element: [8, 4] on 8 ranks).
  const LocalKernel squeeze_global_size1_dims = [](const c10::OperatorHandle&, std::vector<c10::IValue>& args,
                                                   const OpCall& call, const OutputSharding&) -> std::vector<c10::IValue> {
    const auto& in = in_shape(call);
    const auto nd = static_cast<int64_t>(in.size());
    std::vector<bool> drop(in.size(), false);
    if (call.args.size() == 1) {
      for (size_t d = 0; d < in.size(); ++d) drop[d] = in[d] == 1;
    } else if (nd > 0) {
      const std::vector<int64_t> named = call.args[1].value.isInt() ? std::vector<int64_t>{arg_int(call, 1, 0)}
                                                                     : arg_int_list(call, 1);
      for (int64_t d : named) {
        const auto k = static_cast<size_t>(normalize_shard_dim(d, nd));
        drop[k] = in[k] == 1;
      }
    }
    const bool in_place = call.written_input >= 0;
    at::Tensor t = in_place ? args[0].toTensor() : args[0].toTensor().alias();  // a view, as squeeze's
    for (int64_t d = nd - 1; d >= 0; --d)
      if (drop[static_cast<size_t>(d)]) t = in_place ? t.squeeze_(d) : t.squeeze(d);
    return {t};
  };
  register_squeeze("aten::squeeze", "aten::squeeze_", squeeze_global_size1_dims);
  register_squeeze("aten::squeeze.dim", "aten::squeeze_.dim", squeeze_global_size1_dims);

  for (const char* n : {"aten::expand", "aten::expand_copy"})
    register_rule(
        n,
        [](const OpCall& c) {
          std::vector<int64_t> map(out_shape(c).size(), -1);
          for (int64_t d = 0; d < static_cast<int64_t>(map.size()); ++d)
            map[d] = broadcast_input_dim(in_shape(c), out_shape(c), d);
          return mapped_options(map);
        },
        local_size_at(1));
  // repeat(repeats): output dim d is input dim d - (new leading dims) tiled repeats[d] times;
  // only the dims repeated once keep their shards.
  register_rule("aten::repeat", [](const OpCall& c) {
    const auto repeats = arg_int_list(c, 1);
    const int64_t lead = static_cast<int64_t>(repeats.size()) - in_ndim(c);
    std::vector<int64_t> map(repeats.size(), -1);
    for (int64_t d = lead; d < static_cast<int64_t>(repeats.size()); ++d)
      if (repeats[d] == 1) map[d] = d - lead;
    return mapped_options(map);
  });

  // Complex <-> real views: the complex dims keep their shards; the trailing (re, im) dim of
  // size 2 is never sharded.
  register_rule("aten::view_as_real", [](const OpCall& c) {
    std::vector<int64_t> map = identity_map(static_cast<int64_t>(out_shape(c).size()));
    map.back() = -1;
    return mapped_options(map);
  });
  // A complex number has no min or max: only a sum or average of (re, im) pairs stays Partial.
  register_rule("aten::view_as_complex", [](const OpCall& c) {
    return mapped_options(identity_map(static_cast<int64_t>(out_shape(c).size())), PartialKind::kLinear);
  });

  RuleOptions exact_view;
  exact_view.valid = view_keeps_shards;
  register_rule("aten::view", view_options, local_size_at(1), exact_view);
  register_rule("aten::_unsafe_view", view_options, local_size_at(1), exact_view);
  register_rule("aten::view_copy", view_options, local_size_at(1), exact_view);  // a view, copied
  // view.dtype / view_copy.dtype(self, dtype) reinterpret the bytes: the last dim's size scales
  // by the ratio of the element sizes, every other dim keeps its shards.
  for (const char* n : {"aten::view.dtype", "aten::view_copy.dtype"})
    register_rule(n, [](const OpCall& c) {
      std::vector<int64_t> map = identity_map(in_ndim(c));
      if (!map.empty()) map.back() = -1;
      return mapped_options(map, detail::PartialKind::kNone);  // reinterpreted bits do not add up
    });
  register_rule("aten::_reshape_alias", view_options, rewrite_reshape_alias, exact_view);

  // split / unbind: the dim that is cut is replicated; every piece keeps the other shards.
  auto split_rule = [](const OpCall& c) {
    const int64_t dim = normalize_shard_dim(arg_int(c, 2, 0), in_ndim(c));
    std::vector<int64_t> map = identity_map(in_ndim(c));
    map[dim] = -1;
    return mapped_options(map, PartialKind::kMoves, c.output_meta.size());
  };
  for (const char* n : {"aten::split.Tensor", "aten::split_with_sizes", "aten::unsafe_split.Tensor",
                        "aten::unsafe_split_with_sizes"})
    register_rule(n, split_rule);
  register_rule("aten::unbind.int", [](const OpCall& c) {
    const int64_t dim = normalize_shard_dim(arg_int(c, 1, 0), in_ndim(c));
    return mapped_options(drop_dim_map(in_ndim(c), dim), PartialKind::kMoves, c.output_meta.size());
  });

  // slice / narrow_copy / select: a dim that is cut is replicated unless the slice is whole.
  register_rule("aten::slice.Tensor", [](const OpCall& c) {
    const int64_t dim = normalize_shard_dim(arg_int(c, 1, 0), in_ndim(c));
    std::vector<int64_t> map = identity_map(in_ndim(c));
    if (!detail::whole_slice(in_shape(c)[dim], c.args[2].value, c.args[3].value, arg_int(c, 4, 1))) map[dim] = -1;
    return mapped_options(map);
  });
  // narrow_copy(dim, start, length): a whole narrow of a sharded dim takes the local length.
  register_rule(
      "aten::narrow_copy",
      [](const OpCall& c) {
        const int64_t dim = normalize_shard_dim(arg_int(c, 1, 0), in_ndim(c));
        std::vector<int64_t> map = identity_map(in_ndim(c));
        const int64_t start = arg_int(c, 2, 0);
        if (!(start == 0 && arg_int(c, 3, 0) == in_shape(c)[dim])) map[dim] = -1;
        return mapped_options(map);
      },
      [](std::vector<c10::IValue>& args, const OpCall& c, const std::vector<std::vector<Placement>>& outs) {
        args[3] = local_out_shape(c, outs)[normalize_shard_dim(arg_int(c, 1, 0), in_ndim(c))];
      });
  register_rule("aten::select.int", [](const OpCall& c) {
    return mapped_options(drop_dim_map(in_ndim(c), normalize_shard_dim(arg_int(c, 1, 0), in_ndim(c))));
  });
  register_rule("aten::diagonal", [](const OpCall& c) {
    const int64_t nd = in_ndim(c);
    std::vector<int64_t> map = diagonal_kept_dims(nd, normalize_shard_dim(arg_int(c, 2, 0), nd),
                                                  normalize_shard_dim(arg_int(c, 3, 1), nd));
    map.push_back(-1);  // the diagonal itself
    return mapped_options(map);
  });
  register_rule("aten::as_strided", as_strided_options, rewrite_as_strided);

  // Backward ops: the gradient is written into zeros of the input's shape (zeros keep every
  // Partial: NOTE: [Partial through data movement]); `input_sizes` becomes the local shape.
  register_rule(
      "aten::select_backward",
      [](const OpCall& c) {
        const int64_t nd = static_cast<int64_t>(out_shape(c).size());
        return mapped_options(insert_dim_map(nd, normalize_shard_dim(arg_int(c, 2, 0), nd)));
      },
      local_size_at(1));
  register_rule(
      "aten::slice_backward",
      [](const OpCall& c) {
        const int64_t nd = static_cast<int64_t>(out_shape(c).size());
        const int64_t dim = normalize_shard_dim(arg_int(c, 2, 0), nd);
        std::vector<int64_t> map = identity_map(nd);
        if (!detail::whole_slice(out_shape(c)[dim], c.args[3].value, c.args[4].value, arg_int(c, 5, 1))) map[dim] = -1;
        return mapped_options(map);
      },
      local_size_at(1));
  register_rule(
      "aten::diagonal_backward",
      [](const OpCall& c) {
        const int64_t nd = static_cast<int64_t>(out_shape(c).size());
        const auto kept = diagonal_kept_dims(nd, normalize_shard_dim(arg_int(c, 3, 0), nd),
                                             normalize_shard_dim(arg_int(c, 4, 1), nd));
        std::vector<int64_t> map(static_cast<size_t>(nd), -1);
        for (size_t k = 0; k < kept.size(); ++k) map[kept[k]] = static_cast<int64_t>(k);
        return mapped_options(map);
      },
      local_size_at(1));
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
