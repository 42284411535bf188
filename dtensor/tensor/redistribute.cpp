// dtensor/tensor/redistribute.cpp: see NOTE: [Redistribute order].
#include "dtensor/tensor/redistribute.h"

#include "dtensor/comm/group.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <memory>

namespace dtensor {
namespace detail {

at::Tensor PendingLocal::get() {
  if (work) {
    work->wait();
    value = then();
    work = nullptr;
    then = nullptr;
  }
  return value;
}

namespace {

PendingLocal ready(at::Tensor t) { return PendingLocal{nullptr, std::move(t), nullptr}; }

// The local step `f` after `p`: applied now when `p` is ready, else when its collective completed.
PendingLocal map(PendingLocal p, std::function<at::Tensor(const at::Tensor&)> f) {
  if (!p.work) return ready(f(p.value));
  p.then = [prev = std::move(p.then), f = std::move(f)]() { return f(prev()); };
  return p;
}

// Size of tensor dim `d` before mesh dim `i` splits it, given the current placements.
int64_t size_before_split(const DTensorSpec& spec, const std::vector<Placement>& cur, int64_t d,
                          int64_t i) {
  std::vector<Placement> prefix(cur.size(), Replicate{});
  for (int64_t j = 0; j < i; ++j)
    if (is_shard(cur[j])) prefix[j] = cur[j];
  return compute_local_shape(spec.tensor_meta.shape, spec.mesh, prefix)[d];
}

at::Tensor pad_dim(const at::Tensor& t, int64_t d, int64_t to) {
  if (t.size(d) == to) return t;
  auto shape = t.sizes().vec();
  shape[d] = to - t.size(d);
  return at::cat({t, at::zeros(shape, t.options())}, d);
}

// Undoes the split of tensor dim d (n rows before it) over group g: all_gather of padded
// blocks, then unpad.
PendingLocal gather_rows_async(const at::Tensor& local, const comm::GroupPtr& g, int64_t d, int64_t n) {
  const int64_t k = g->size();
  const int64_t c = (n + k - 1) / k;
  at::Tensor block = pad_dim(local, d, c).transpose(0, d).contiguous();
  auto out_shape = block.sizes().vec();
  out_shape[0] = c * k;
  at::Tensor out = at::empty(out_shape, block.options());
  comm::WorkPtr work = g->all_gather_into_async(out, block);
  auto unpad = [out, n, k, c, d]() -> at::Tensor {
    if (c * k == n && d == 0) return out;  // even shards of dim 0: the gathered buffer is the result
    std::vector<at::Tensor> parts;
    for (int64_t r = 0; r < k; ++r) {
      const int64_t s = shard_size_and_offset(n, k, r).first;
      if (s > 0) parts.push_back(out.narrow(0, r * c, s));
    }
    at::Tensor full = parts.empty() ? out.narrow(0, 0, 0) : at::cat(parts, 0);
    return full.transpose(0, d).contiguous();
  };
  return PendingLocal{std::move(work), at::Tensor(), std::move(unpad)};
}

at::Tensor gather_rows(const at::Tensor& local, const comm::GroupPtr& g, int64_t d, int64_t n) {
  return gather_rows_async(local, g, d, n).get();
}

// S(d) -> R over mesh dim i.
PendingLocal gather_dim(const at::Tensor& local, const DTensorSpec& spec, const std::vector<Placement>& cur,
                        int64_t d, int64_t i) {
  return gather_rows_async(local, spec.mesh.get_group(i), d, size_before_split(spec, cur, d, i));
}

// R -> S(d) over mesh dim i: this rank's chunk.
at::Tensor chunk_dim(const at::Tensor& full, const DTensorSpec& spec, int64_t d, int64_t i) {
  const int64_t k = spec.mesh.size(i);
  const int64_t idx = spec.mesh.get_local_rank(i);
  auto so = shard_size_and_offset(full.size(d), k, idx);
  return full.narrow(d, so.second, so.first).clone(at::MemoryFormat::Contiguous);
}

// P -> S(d) over mesh dim i: reduce_scatter of padded blocks.
PendingLocal reduce_scatter_dim(const at::Tensor& full, const DTensorSpec& spec, int64_t d, int64_t i,
                                comm::ReduceOp op) {
  auto g = spec.mesh.get_group(i);
  const int64_t k = g->size();
  const int64_t n = full.size(d);
  const int64_t c = (n + k - 1) / k;
  at::Tensor in = pad_dim(full, d, c * k).transpose(0, d).contiguous();
  auto out_shape = in.sizes().vec();
  out_shape[0] = c;
  at::Tensor out = at::empty(out_shape, in.options());
  comm::WorkPtr work = g->reduce_scatter_into_async(out, in, op);
  const int64_t s = shard_size_and_offset(n, k, g->rank()).first;
  return PendingLocal{std::move(work), at::Tensor(),
                      [out, s, d]() { return out.narrow(0, 0, s).transpose(0, d).contiguous(); }};
}

PendingLocal all_reduce_copy_async(const at::Tensor& t, const DTensorSpec& spec, int64_t i, comm::ReduceOp op) {
  at::Tensor out = t.clone(at::MemoryFormat::Contiguous);
  comm::WorkPtr work = spec.mesh.get_group(i)->all_reduce_async(out, op);
  return PendingLocal{std::move(work), at::Tensor(), [out]() { return out; }};
}

at::Tensor all_reduce_copy(const at::Tensor& t, const DTensorSpec& spec, int64_t i, comm::ReduceOp op) {
  return all_reduce_copy_async(t, spec, i, op).get();
}

// S(a) -> S(b) over mesh dim i with all_to_all: this rank cuts its shard along b into the
// pieces every rank owns, sends piece r to rank r, and concatenates what it receives along a.
// Pieces travel flattened, so uneven shards need no padding.
PendingLocal all_to_all_dim(const at::Tensor& local, const DTensorSpec& spec, const std::vector<Placement>& cur,
                            int64_t a, int64_t b, int64_t i) {
  auto g = spec.mesh.get_group(i);
  const int64_t k = g->size();
  const int64_t me = g->rank();
  const int64_t n_a = size_before_split(spec, cur, a, i);
  const int64_t n_b = local.size(b);
  std::vector<at::Tensor> send;
  std::vector<int64_t> in_splits, out_splits;
  int64_t rest = 1;  // elements per unit of dims a and b
  for (int64_t d = 0; d < local.dim(); ++d)
    if (d != a && d != b) rest *= local.size(d);
  const auto mine_b = shard_size_and_offset(n_b, k, me).first;
  for (int64_t r = 0; r < k; ++r) {
    auto so = shard_size_and_offset(n_b, k, r);
    send.push_back(local.narrow(b, so.second, so.first).contiguous().flatten());
    in_splits.push_back(so.first * local.size(a) * rest);
    out_splits.push_back(shard_size_and_offset(n_a, k, r).first * mine_b * rest);
  }
  at::Tensor in = at::cat(send);
  int64_t total = 0;
  for (auto x : out_splits) total += x;
  at::Tensor out = at::empty({total}, local.options());
  comm::WorkPtr work = g->all_to_all_single_async(out, in, out_splits, in_splits);
  auto assemble = [out, out_splits, shape0 = local.sizes().vec(), n_a, k, mine_b, a, b]() {
    std::vector<at::Tensor> parts;
    int64_t off = 0;
    for (int64_t r = 0; r < k; ++r) {
      auto shape = shape0;
      shape[a] = shard_size_and_offset(n_a, k, r).first;
      shape[b] = mine_b;
      parts.push_back(out.narrow(0, off, out_splits[r]).view(shape));
      off += out_splits[r];
    }
    return at::cat(parts, a);
  };
  return PendingLocal{std::move(work), at::Tensor(), std::move(assemble)};
}

// R -> P(op): the reduction over the mesh dim must give the value back.
at::Tensor to_partial(const at::Tensor& t, const DTensorSpec& spec, int64_t i, comm::ReduceOp op) {
  if (op == comm::ReduceOp::SUM && spec.mesh.get_local_rank(i) != 0) return at::zeros_like(t);
  return t.clone();
}

bool has_strided(const std::vector<Placement>& ps) {
  return std::any_of(ps.begin(), ps.end(), [](const Placement& p) { return is_strided_shard(p); });
}

// NOTE: [Redistributing strided shards]
// With a StridedShard on either side, mesh dims do not split in mesh-dim order (NOTE:
// [Strided shards] in placement.h), so this path works per tensor dim on shard_order():
//   1. keep the common prefix of the two orders (same mesh dims, same placements), undo the
//      source's later splits, last first (all_gather over that mesh dim);
//   2. all_reduce the Partial mesh dims that change;
//   3. make the target's later splits, first first (a local torch.chunk piece each);
//   4. Replicate -> Partial where the target asks for it (local).
// Simple rather than cheapest: no all_to_all or reduce_scatter shortcuts.
at::Tensor redistribute_by_order(const at::Tensor& local, const DTensorSpec& from, const std::vector<Placement>& to) {
  const std::vector<int64_t> mesh_shape = from.mesh.shape();
  const int64_t ndim = from.ndim();
  const std::vector<int64_t> coord = *from.mesh.get_coordinate();
  const auto of = shard_order(mesh_shape, from.placements, ndim);
  std::vector<std::vector<int64_t>> ot;
  try {
    ot = shard_order(mesh_shape, to, ndim);
  } catch (const c10::Error& e) {
    TORCH_CHECK(false, "redistribute from ", to_string(from.placements), " to ", to_string(to), " on ",
                from.mesh.to_string(), ": ", e.what_without_backtrace());
  }
  std::vector<Placement> cur = from.placements;
  std::vector<size_t> common(static_cast<size_t>(ndim), 0);
  at::Tensor t = local;
  for (size_t d = 0; d < static_cast<size_t>(ndim); ++d) {
    size_t& p = common[d];
    while (p < of[d].size() && p < ot[d].size() && of[d][p] == ot[d][p] &&
           from.placements[static_cast<size_t>(of[d][p])] == to[static_cast<size_t>(of[d][p])])
      ++p;
    // Rows of dim d before each split of the source.
    std::vector<int64_t> before;
    int64_t n = from.tensor_meta.shape[d];
    for (int64_t i : of[d]) {
      before.push_back(n);
      n = shard_size_and_offset(n, mesh_shape[i], coord[i]).first;
    }
    for (size_t k = of[d].size(); k-- > p;) {
      const int64_t i = of[d][k];
      t = gather_rows(t, from.mesh.get_group(i), static_cast<int64_t>(d), before[k]);
      cur[i] = Replicate{};
    }
  }
  for (size_t i = 0; i < cur.size(); ++i) {
    if (is_partial(cur[i]) && cur[i] != to[i]) {
      t = all_reduce_copy(t, from, static_cast<int64_t>(i), std::get<Partial>(cur[i]).reduce_op);
      cur[i] = Replicate{};
    }
  }
  for (size_t d = 0; d < static_cast<size_t>(ndim); ++d) {
    for (size_t k = common[d]; k < ot[d].size(); ++k) {
      const int64_t i = ot[d][k];
      TORCH_INTERNAL_ASSERT(is_replicate(cur[i]), "redistribute_by_order: mesh dim ", i, " is ", to_string(cur[i]));
      auto so = shard_size_and_offset(t.size(static_cast<int64_t>(d)), mesh_shape[i], coord[i]);
      t = t.narrow(static_cast<int64_t>(d), so.second, so.first).clone(at::MemoryFormat::Contiguous);
      cur[i] = to[i];
    }
  }
  for (size_t i = 0; i < cur.size(); ++i) {
    if (cur[i] == to[i]) continue;
    TORCH_INTERNAL_ASSERT(is_replicate(cur[i]) && is_partial(to[i]), "redistribute_by_order: mesh dim ", i, " is ",
                          to_string(cur[i]), ", wanted ", to_string(to[i]));
    t = to_partial(t, from, static_cast<int64_t>(i), std::get<Partial>(to[i]).reduce_op);
  }
  return t;
}

}  // namespace

// NOTE: [Redistributed pieces keep the global layout]
// A collective's output is contiguous whatever its input's layout: the gathered piece of a
// permuted DTensor ([9, 6, 8] with strides [1, 72, 9], sharded on dim 1) comes back with
// strides [48, 8, 1] while the DTensor still says [1, 72, 9]. Ops that decide from the global
// strides whether a view is possible (reshape, flatten: CompositeImplicit, above the DTensor
// key) then ask the local piece for a view it cannot give. So a redistributed piece whose dims
// are ordered unlike the global strides is copied into that order (only then: a contiguous
// DTensor's pieces are contiguous, and a narrowed piece keeps its order).
namespace {

at::Tensor keep_global_layout(const at::Tensor& x, const std::vector<int64_t>& global_stride) {
  const int64_t nd = x.dim();
  if (nd < 2 || static_cast<int64_t>(global_stride.size()) != nd) return x;
  bool same = true;
  for (int64_t i = 0; i < nd && same; ++i)
    for (int64_t j = i + 1; j < nd && same; ++j) {
      if (x.size(i) < 2 || x.size(j) < 2) continue;
      const auto a = global_stride[static_cast<size_t>(i)], b = global_stride[static_cast<size_t>(j)];
      same = (a > b) == (x.stride(i) > x.stride(j)) && (a < b) == (x.stride(i) < x.stride(j));
    }
  if (same) return x;
  return at::empty_strided(x.sizes(), at::infer_dense_strides(x.sizes(), global_stride), x.options()).copy_(x);
}

}  // namespace

at::Tensor redistribute_local(const at::Tensor& local, const DTensorSpec& from, const std::vector<Placement>& to) {
  return redistribute_local_async(local, from, to).get();
}

PendingLocal redistribute_local_async(const at::Tensor& local, const DTensorSpec& from,
                                      const std::vector<Placement>& to_in) {
  const int64_t m = from.mesh.ndim();
  TORCH_CHECK(static_cast<int64_t>(to_in.size()) == m, "redistribute: ", to_in.size(),
              " placements given for a ", m, "-D mesh ", from.mesh.to_string());
  const std::vector<Placement> to = normalize_placements(to_in, from.ndim());
  if (!from.mesh.get_coordinate().has_value()) return ready(local);  // not in the mesh
  if (has_strided(from.placements) || has_strided(to)) {
    if (from.placements == to) return ready(local);
    return ready(keep_global_layout(redistribute_by_order(local, from, to), from.tensor_meta.stride));
  }
  std::vector<Placement> cur = from.placements;
  // On a mesh dim of one rank every placement holds the same local tensor (the whole dim,
  // the whole sum): nothing to communicate.
  for (int64_t i = 0; i < m; ++i)
    if (from.mesh.size(i) == 1) cur[i] = to[i];
  // Each collective step starts from the completed result of the previous one (get()); the
  // last one stays in flight, with the local steps after it chained onto it (map()).
  PendingLocal t = ready(local);
  // S(a) -> S(b) on a mesh dim that is the only one sharding a and b: one all_to_all.
  for (int64_t i = 0; i < m; ++i) {
    if (!is_shard(cur[i]) || !is_shard(to[i]) || cur[i] == to[i]) continue;
    const int64_t a = std::get<Shard>(cur[i]).dim, b = std::get<Shard>(to[i]).dim;
    bool alone = true;
    for (int64_t j = 0; j < m; ++j)
      if (j != i)
        for (const auto& p : {cur[j], to[j]}) alone = alone && !is_shard(p, a) && !is_shard(p, b);
    if (!alone) continue;
    t = all_to_all_dim(t.get(), from, cur, a, b, i);
    cur[i] = to[i];
  }
  // Phase A (innermost mesh dim first): leave Shard placements that change, and every inner
  // Shard of a tensor dim whose outer split changes or appears (its pieces are pieces of
  // that piece: it is undone here and redone in phase B).
  std::vector<bool> gather(static_cast<size_t>(m), false);
  for (int64_t i = 0; i < m; ++i) {
    if (!is_shard(cur[i])) continue;
    gather[i] = !(cur[i] == to[i]);
    for (int64_t j = 0; j < i; ++j)
      gather[i] = gather[i] || (gather[j] && cur[j] == cur[i]) || (to[j] == cur[i] && !(cur[j] == to[j]));
  }
  for (int64_t i = m - 1; i >= 0; --i) {
    if (gather[i]) {
      t = gather_dim(t.get(), from, cur, std::get<Shard>(cur[i]).dim, i);
      cur[i] = Replicate{};
    }
  }
  // Phase B (outermost first): reach the targets.
  for (int64_t i = 0; i < m; ++i) {
    if (cur[i] == to[i]) continue;
    if (is_partial(cur[i])) {
      const auto op = std::get<Partial>(cur[i]).reduce_op;
      if (is_shard(to[i])) {
        t = reduce_scatter_dim(t.get(), from, std::get<Shard>(to[i]).dim, i, op);
        cur[i] = to[i];
        continue;
      }
      t = all_reduce_copy_async(t.get(), from, i, op);
      cur[i] = Replicate{};
    }
    if (cur[i] == to[i]) continue;
    // cur[i] is Replicate here.
    if (is_shard(to[i])) {
      const int64_t d = std::get<Shard>(to[i]).dim;
      t = map(std::move(t), [from, d, i](const at::Tensor& x) { return chunk_dim(x, from, d, i); });
    } else if (is_partial(to[i])) {
      const auto op = std::get<Partial>(to[i]).reduce_op;
      t = map(std::move(t), [from, op, i](const at::Tensor& x) { return to_partial(x, from, i, op); });
    }
    cur[i] = to[i];
  }
  if (!t.work && t.value.is_same(local)) return t;
  return map(std::move(t), [stride = from.tensor_meta.stride](const at::Tensor& x) { return keep_global_layout(x, stride); });
}

}  // namespace detail
}  // namespace dtensor
