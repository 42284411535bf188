// dtensor/ops/rule_helpers.cpp: see rule_helpers.h.
#include "dtensor/ops/rule_helpers.h"

#include <algorithm>
#include <limits>

namespace dtensor {
namespace ops {
namespace detail {

std::vector<comm::ReduceOp> partial_reduce_ops(PartialKind kind) {
  using R = comm::ReduceOp;
  switch (kind) {
    case PartialKind::kNone: return {};
    case PartialKind::kMoves: return {R::SUM, R::AVG, R::MIN, R::MAX};
    case PartialKind::kLinear: return {R::SUM, R::AVG};
    case PartialKind::kNotSum: return {R::AVG, R::MIN, R::MAX};
  }
  return {};
}

void add_partial_options(std::vector<DimOption>& options, PartialKind kind, size_t n_inputs, size_t n_outputs,
                         const std::vector<size_t>& partial_inputs) {
  for (comm::ReduceOp op : partial_reduce_ops(kind)) {
    const Partial p(op);
    DimOption o{std::vector<Placement>(n_outputs, p), std::vector<Placement>(n_inputs, Replicate{})};
    for (size_t i : partial_inputs) o.inputs[i] = p;
    options.push_back(std::move(o));
  }
}

std::vector<DimOption> mapped_options(const std::vector<int64_t>& out_to_in, PartialKind kind, size_t n_outputs) {
  std::vector<DimOption> o{{std::vector<Placement>(n_outputs, Replicate{}), {Replicate{}}}};
  add_partial_options(o, kind, 1, n_outputs, {0});
  for (int64_t d = 0; d < static_cast<int64_t>(out_to_in.size()); ++d)
    if (out_to_in[d] >= 0) o.push_back({std::vector<Placement>(n_outputs, Shard{d}), {Shard{out_to_in[d]}}});
  return o;
}

bool for_every_coordinate(const DeviceMesh& mesh, const std::function<bool(const std::vector<int64_t>&)>& fn) {
  const std::vector<int64_t> shape = mesh.shape();
  std::vector<int64_t> coord(shape.size(), 0);
  for (;;) {
    if (!fn(coord)) return false;
    int64_t d = static_cast<int64_t>(shape.size()) - 1;
    while (d >= 0 && ++coord[d] == shape[d]) coord[d--] = 0;
    if (d < 0) return true;
  }
}

std::vector<int64_t> sharded_dims(const std::vector<Placement>& placements, int64_t ndim) {
  std::vector<int64_t> out;
  for (const Placement& p : placements)
    if (const auto* s = std::get_if<Shard>(&p)) {
      const int64_t d = normalize_shard_dim(s->dim, ndim);
      if (std::find(out.begin(), out.end(), d) == out.end()) out.push_back(d);
    }
  return out;
}

bool whole_slice(int64_t size, const c10::IValue& start, const c10::IValue& end, int64_t step) {
  if (step != 1) return false;
  int64_t s = start.isInt() ? start.toInt() : 0;
  int64_t e = end.isInt() ? end.toInt() : std::numeric_limits<int64_t>::max();
  if (s < 0) s += size;
  if (e < 0) e += size;
  return s <= 0 && e >= size;
}

double number_of(const c10::IValue& v, double fallback) {
  if (v.isDouble()) return v.toDouble();
  if (v.isInt()) return static_cast<double>(v.toInt());
  if (v.isBool()) return v.toBool() ? 1 : 0;
  return fallback;
}

double scalar_arg(const OpCall& c, size_t i, double fallback) {
  if (i >= c.args.size() || c.args[i].kind != ArgInfo::Kind::kOther) return fallback;
  return number_of(c.args[i].value, fallback);
}

bool shards_never_empty(int64_t n, const DeviceMesh& mesh) {
  const int64_t m = mesh.ndim();
  for (int64_t subset = 1; subset < (int64_t{1} << m); ++subset) {
    std::vector<int64_t> pieces{n};
    for (int64_t d = 0; d < m; ++d) {
      if (!(subset & (int64_t{1} << d))) continue;
      std::vector<int64_t> next;
      for (int64_t p : pieces)
        for (int64_t r = 0; r < mesh.size(d); ++r) {
          const int64_t s = shard_size_and_offset(p, mesh.size(d), r).first;
          if (s == 0) return false;
          next.push_back(s);
        }
      pieces = std::move(next);
    }
  }
  return true;
}

}  // namespace detail
}  // namespace ops
}  // namespace dtensor
