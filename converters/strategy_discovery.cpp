// converters/strategy_discovery.cpp: see strategy_discovery.h.
#include "converters/strategy_discovery.h"

#include "dtensor/comm/fake_group.h"
#include "dtensor/mesh/device_mesh.h"
#include "dtensor/ops/strategy_query.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>
#include <random>
#include <sstream>

namespace dtensor {
namespace testing {

namespace {

bool inexact(const at::Tensor& t) { return t.is_floating_point() || t.is_complex(); }

// (coordinate sum + shift) even: the checkerboard of NOTE: [Partial pieces that catch
// non-linear ops].
at::Tensor checkerboard(const at::Tensor& t, int shift) {
  at::Tensor sum = at::zeros({}, at::kLong);
  for (int64_t d = 0; d < t.dim(); ++d) {
    std::vector<int64_t> shape(static_cast<size_t>(t.dim()), 1);
    shape[static_cast<size_t>(d)] = t.size(d);
    sum = sum + at::arange(t.size(d), at::kLong).view(shape);
  }
  return (sum + shift).remainder(2).eq(0).expand(t.sizes());
}

// The tolerances of torch.testing.assert_close for `dtype` (rtol, atol).
std::pair<double, double> dtype_tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kHalf:
      return {1e-3, 1e-5};
    case at::kBFloat16:
      return {1.6e-2, 1e-5};
    case at::kDouble:
    case at::kComplexDouble:
      return {1e-7, 1e-7};
    default:
      return {1.3e-6, 1e-5};
  }
}

bool close(const at::Tensor& a, const at::Tensor& b, double rtol, double atol) {
  if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type()) return false;
  if (!inexact(a)) return at::equal(a, b);
  return at::allclose(a, b, rtol, atol, /*equal_nan=*/true);
}

double max_abs(const std::vector<at::Tensor>& pieces) {
  double m = 0;
  for (const auto& p : pieces) {
    if (p.numel() == 0) continue;
    m = std::max(m, p.abs().max().item<double>());
  }
  return m;
}

// The tensors of a boxed stack: (stack index, list index or -1).
using Slot = std::pair<size_t, int64_t>;

// A Tensor[] or a Tensor?[] (index, index_put: None entries skipped), as the dispatcher sees
// their tensors: each is a DTensor input.
bool is_tensor_list(const c10::IValue& v) {
  if (v.isTensorList()) return true;
  if (!v.isList()) return false;
  const auto list = v.toListRef();
  return !list.empty() && std::all_of(list.begin(), list.end(), [](const c10::IValue& e) {
    return e.isTensor() || e.isNone();
  }) && std::any_of(list.begin(), list.end(), [](const c10::IValue& e) { return e.isTensor(); });
}

std::vector<Slot> tensor_slots(const std::vector<c10::IValue>& stack) {
  std::vector<Slot> slots;
  for (size_t i = 0; i < stack.size(); ++i) {
    const c10::IValue& v = stack[i];
    if (v.isTensor()) {
      if (v.toTensor().defined()) slots.emplace_back(i, -1);
    } else if (is_tensor_list(v)) {
      const auto list = v.toListRef();
      for (size_t j = 0; j < list.size(); ++j) {
        if (list[j].isTensor() && list[j].toTensor().defined()) slots.emplace_back(i, static_cast<int64_t>(j));
      }
    }
  }
  return slots;
}

at::Tensor slot_tensor(const std::vector<c10::IValue>& stack, const Slot& s) {
  if (s.second < 0) return stack[s.first].toTensor();
  return stack[s.first].toListRef()[static_cast<size_t>(s.second)].toTensor();
}

// `stack` with each slot's tensor replaced by `values[k]`.
std::vector<c10::IValue> with_tensors(const std::vector<c10::IValue>& stack, const std::vector<Slot>& slots,
                                      const std::vector<at::Tensor>& values) {
  std::vector<c10::IValue> out = stack;
  std::vector<std::vector<c10::IValue>> lists(stack.size());
  for (size_t k = 0; k < slots.size(); ++k) {
    const auto& [i, j] = slots[k];
    if (j < 0) {
      out[i] = values[k];
      continue;
    }
    if (lists[i].empty()) lists[i] = stack[i].toListRef().vec();
    lists[i][static_cast<size_t>(j)] = values[k];
  }
  for (size_t i = 0; i < lists.size(); ++i) {
    if (lists[i].empty()) continue;
    if (stack[i].isTensorList()) {
      std::vector<at::Tensor> ts;
      for (const auto& v : lists[i]) ts.push_back(v.toTensor());
      out[i] = c10::IValue(ts);
    } else {
      c10::List<c10::optional<at::Tensor>> opt;
      for (const auto& v : lists[i]) opt.push_back(v.isTensor() ? c10::optional<at::Tensor>(v.toTensor()) : c10::nullopt);
      out[i] = c10::IValue(opt);
    }
  }
  return out;
}

// The op's tensor outputs (nullopt: one is not a tensor).
std::optional<std::vector<at::Tensor>> call(const c10::OperatorHandle& op, std::vector<c10::IValue> stack) {
  op.callBoxed(&stack);
  std::vector<at::Tensor> outs;
  for (const auto& v : stack) {
    if (v.isTensor()) {
      outs.push_back(v.toTensor());
    } else if (v.isTensorList()) {
      for (const auto& t : v.toTensorVector()) outs.push_back(t);
    } else {
      return std::nullopt;
    }
  }
  return outs;
}

std::string degenerate(const at::Tensor& g) {
  if (!g.defined()) return "an undefined output";
  if (g.numel() == 0) return "an empty output";
  if (g.scalar_type() == at::kBool) return "";
  if (!g.ne(0).any().item<bool>()) return "an all-zero output";
  if (inexact(g) && g.isnan().all().item<bool>()) return "an all-NaN output";
  return "";
}

std::string message_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->msg();
  return e.what();
}

// A sample made ready for discovery: its boxed arguments, tensor slots, whole tensors and
// result; `skipped` says why it cannot be examined.
struct Prepared {
  std::vector<c10::IValue> stack;
  std::vector<Slot> slots;
  std::vector<at::Tensor> whole, truth;
  std::string skipped;
};

Prepared prepare_sample(const c10::OperatorHandle& op, const OpSample& sample) {
  const c10::FunctionSchema& schema = op.schema();
  Prepared p;
  if (sample.rng_seed || !sample.compare_values) {
    p.skipped = "a random op, or a sample without values to compare";
    return p;
  }
  if (schema.is_mutable()) {
    p.skipped = "the op writes an argument (in-place or out=)";
    return p;
  }
  p.stack = boxed_args(schema, sample.args, sample.kwargs);
  p.slots = tensor_slots(p.stack);
  if (p.slots.empty()) {
    p.skipped = "no tensor argument";
    return p;
  }
  for (const auto& s : p.slots) p.whole.push_back(slot_tensor(p.stack, s).detach());
  std::optional<std::vector<at::Tensor>> truth;
  try {
    std::vector<at::Tensor> copies;
    for (const auto& t : p.whole) copies.push_back(t.clone());
    truth = call(op, with_tensors(p.stack, p.slots, copies));
  } catch (const std::exception& e) {
    p.skipped = "the op raises on the whole tensors: " + message_of(e);
    return p;
  }
  if (!truth) {
    p.skipped = "a non-tensor output";
    return p;
  }
  p.truth = std::move(*truth);
  for (const auto& g : p.truth) {
    const std::string why = degenerate(g);
    if (!why.empty()) {
      p.skipped = why;
      return p;
    }
  }
  return p;
}

// The sample's tolerances, else the loosest dtype's among the arguments and the outputs: a
// float32 argument's shares summed into a float64 result round as float32.
std::pair<std::optional<double>, std::optional<double>> sample_tolerances(const OpSample& sample,
                                                                          const std::vector<at::Tensor>& whole,
                                                                          const std::vector<at::Tensor>& truth) {
  std::optional<double> rtol = sample.rtol, atol = sample.atol;
  if (!rtol || !atol) {
    double r = 0, a = 0;
    auto widen = [&](const at::Tensor& t) {
      if (!inexact(t)) return;
      const auto [tr, ta] = dtype_tolerance(t.scalar_type());
      r = std::max(r, tr);
      a = std::max(a, ta);
    };
    for (const auto& t : whole) widen(t);
    for (const auto& g : truth) widen(g);
    if (!rtol && r > 0) rtol = r;
    if (!atol && a > 0) atol = a;
  }
  return {rtol, atol};
}

}  // namespace

std::vector<Placement> candidate_placements(const at::Tensor& t, bool partial) {
  std::vector<Placement> out{Replicate{}};
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) > 1) out.emplace_back(Shard{d});
  }
  if (!partial || t.scalar_type() == at::kBool) return out;
  out.emplace_back(Partial{comm::ReduceOp::SUM});
  if (inexact(t)) out.emplace_back(Partial{comm::ReduceOp::AVG});
  if (!t.is_complex()) {
    out.emplace_back(Partial{comm::ReduceOp::MIN});
    out.emplace_back(Partial{comm::ReduceOp::MAX});
  }
  return out;
}

std::vector<at::Tensor> local_pieces(const at::Tensor& t, const Placement& p, int64_t ranks, int mask_shift,
                                     int tensor_index) {
  TORCH_CHECK(ranks >= 2, "local_pieces: a mesh dim of ", ranks, " ranks (at least 2)");
  std::vector<at::Tensor> out;
  if (std::holds_alternative<Replicate>(p)) {
    for (int64_t r = 0; r < ranks; ++r) out.push_back(t.clone());
    return out;
  }
  if (const auto* s = std::get_if<Shard>(&p)) {
    TORCH_CHECK(s->split_factor == 1, "local_pieces: ", to_string(p), " has no meaning on one mesh dim");
    const int64_t dim = s->dim < 0 ? s->dim + t.dim() : s->dim;
    for (int64_t r = 0; r < ranks; ++r) {
      auto [shape, offset] = compute_local_shape_and_global_offset(t.sizes(), std::vector<int64_t>{ranks}, {p},
                                                                   std::vector<int64_t>{r});
      out.push_back(t.narrow(dim, offset[static_cast<size_t>(dim)], shape[static_cast<size_t>(dim)]).clone());
    }
    return out;
  }
  const comm::ReduceOp op = std::get<Partial>(p).reduce_op;
  // Shifted by the argument's index: two Partial arguments are not held alike (with the same
  // holders, add would pass Partial(max) + Partial(max) -> Partial(max)).
  const at::Tensor mask = checkerboard(t, mask_shift + tensor_index);
  if (op == comm::ReduceOp::SUM || op == comm::ReduceOp::AVG) {
    TORCH_CHECK(op == comm::ReduceOp::SUM || inexact(t), "local_pieces: Partial(avg) of an integer tensor");
    // sign * (|x| + 1), the sign on the checkerboard
    const at::Tensor sign = at::where(mask, at::ones({}, t.options()), -at::ones({}, t.options()));
    if (!inexact(t)) {
      const at::Tensor u = sign * (t.abs() + 1);
      out.push_back(t - u * (ranks - 1));
      for (int64_t r = 1; r < ranks; ++r) out.push_back(u.clone());
      return out;
    }
    const double base = 0.6 + 0.1 * (tensor_index % 3);
    const double scale = op == comm::ReduceOp::AVG ? static_cast<double>(ranks) : 1.0;
    const at::Tensor offset = sign * (t.abs() + 1);
    out.push_back(t * (base * scale) + offset);
    const at::Tensor rest = t * ((1 - base) * scale / static_cast<double>(ranks - 1)) - offset / static_cast<double>(ranks - 1);
    for (int64_t r = 1; r < ranks; ++r) out.push_back(rest.clone());
    return out;
  }
  TORCH_CHECK(op == comm::ReduceOp::MIN || op == comm::ReduceOp::MAX, "local_pieces: ", to_string(p),
              " is not a Partial discovery builds");
  TORCH_CHECK(!t.is_complex(), "local_pieces: ", to_string(p), " of a complex tensor");
  // The value on one rank (rank 0 on the checkerboard, rank 1 off it), moved away on the
  // others: by 2 x range + 1 (beyond every value), or, on the complementary checkerboard, by
  // (|x| + 1) / 2 (near it: abs would pass max -> min on far pieces alone).
  const double direction = op == comm::ReduceOp::MIN ? 1 : -1;
  at::Tensor moved;
  if (mask_shift % 2 == 0) {
    double range = 0;
    if (t.numel() > 0) range = (t.max() - t.min()).item<double>();
    const double delta = (2 * range + 1) * direction;
    moved = inexact(t) ? t + delta : t + static_cast<int64_t>(delta);
  } else {
    const at::Tensor near = inexact(t) ? (t.abs() + 1) * 0.5 : at::floor_divide(t.abs(), 2) + 1;
    moved = direction > 0 ? t + near : t - near;
  }
  for (int64_t r = 0; r < ranks; ++r) {
    const at::Tensor holds = r == 0 ? mask : (r == 1 ? mask.logical_not() : at::zeros_like(mask));
    out.push_back(at::where(holds, t, moved));
  }
  return out;
}

bool pieces_match(const std::vector<at::Tensor>& pieces, const Placement& p, const at::Tensor& expected,
                  std::optional<double> rtol, std::optional<double> atol) {
  const auto [dtype_rtol, dtype_atol] = dtype_tolerance(expected.scalar_type());
  const double rt = rtol.value_or(dtype_rtol);
  double at_ = atol.value_or(dtype_atol);
  const int64_t ranks = static_cast<int64_t>(pieces.size());
  for (const auto& piece : pieces) {
    if (!piece.defined() || piece.scalar_type() != expected.scalar_type()) return false;
  }
  if (std::holds_alternative<Replicate>(p)) {
    return std::all_of(pieces.begin(), pieces.end(), [&](const at::Tensor& x) { return close(x, expected, rt, at_); });
  }
  if (const auto* s = std::get_if<Shard>(&p)) {
    if (s->split_factor != 1 || expected.dim() == 0) return false;
    const int64_t dim = s->dim < 0 ? s->dim + expected.dim() : s->dim;
    if (dim < 0 || dim >= expected.dim()) return false;
    for (int64_t r = 0; r < ranks; ++r) {
      auto [shape, offset] = compute_local_shape_and_global_offset(expected.sizes(), std::vector<int64_t>{ranks}, {p},
                                                                   std::vector<int64_t>{r});
      const at::Tensor chunk = expected.narrow(dim, offset[static_cast<size_t>(dim)], shape[static_cast<size_t>(dim)]);
      if (!close(pieces[static_cast<size_t>(r)], chunk, rt, at_)) return false;
    }
    return true;
  }
  for (const auto& piece : pieces) {
    if (piece.sizes() != expected.sizes()) return false;
  }
  const comm::ReduceOp op = std::get<Partial>(p).reduce_op;
  at::Tensor reduced = pieces[0].clone();
  for (size_t r = 1; r < pieces.size(); ++r) {
    switch (op) {
      case comm::ReduceOp::SUM:
      case comm::ReduceOp::AVG:
        reduced = reduced + pieces[r];
        break;
      case comm::ReduceOp::MIN:
        if (expected.is_complex()) return false;
        reduced = at::minimum(reduced, pieces[r]);
        break;
      case comm::ReduceOp::MAX:
        if (expected.is_complex()) return false;
        reduced = at::maximum(reduced, pieces[r]);
        break;
      default:
        return false;
    }
  }
  if (op == comm::ReduceOp::AVG) {
    if (!inexact(expected)) return false;
    reduced = reduced / static_cast<double>(ranks);
  }
  // A sum of shares that cancel rounds like the shares: the tolerance follows their magnitude.
  if ((op == comm::ReduceOp::SUM || op == comm::ReduceOp::AVG) && inexact(expected))
    at_ += rt * static_cast<double>(ranks) * max_abs(pieces);
  return close(reduced.to(expected.scalar_type()), expected, rt, at_);
}

SampleDiscovery discover_strategies(const c10::OperatorHandle& op, const OpSample& sample,
                                    const DiscoveryOptions& options) {
  TORCH_CHECK(options.ranks >= 2, "discover_strategies: a mesh dim of ", options.ranks, " ranks (at least 2)");
  const c10::FunctionSchema& schema = op.schema();
  SampleDiscovery d;
  d.op = op_key(schema);
  d.variant = sample.variant;
  d.ranks = options.ranks;
  Prepared prep = prepare_sample(op, sample);
  d.tensor_inputs = prep.slots.size();
  d.outputs = prep.truth.size();
  if (!prep.skipped.empty()) {
    d.skipped = prep.skipped;
    return d;
  }
  const std::vector<c10::IValue>& stack = prep.stack;
  const std::vector<Slot>& slots = prep.slots;
  const std::vector<at::Tensor>& whole = prep.whole;
  const std::optional<std::vector<at::Tensor>> truth = prep.truth;

  // Input combinations: the product of each argument's candidates (all-Replicate first).
  // No Partial integer inputs: their pieces are not valid indices, and some kernels
  // (embedding_dense_backward) write out of bounds rather than check them.
  std::vector<std::vector<Placement>> choices;
  size_t total = 1;
  for (const auto& t : whole) {
    choices.push_back(candidate_placements(t, options.partial && inexact(t)));
    total = total > options.max_input_combinations ? total : total * choices.back().size();
  }
  const bool capped = total > options.max_input_combinations;
  std::vector<size_t> index(choices.size(), 0);
  for (bool first = true;; first = false) {
    if (!first) {  // the next index (mixed radix)
      size_t pos = 0;
      while (pos < index.size() && ++index[pos] == choices[pos].size()) index[pos++] = 0;
      if (pos == index.size()) break;
    }
    const size_t non_replicate =
        static_cast<size_t>(std::count_if(index.begin(), index.end(), [](size_t i) { return i != 0; }));
    if (capped && non_replicate > 2) continue;

    DiscoveredCombination c;
    bool any_partial = false;
    for (size_t k = 0; k < index.size(); ++k) {
      c.inputs.push_back(choices[k][index[k]]);
      any_partial = any_partial || std::holds_alternative<Partial>(c.inputs.back());
    }
    // Per mask shift, per output, per rank: the local results.
    std::vector<std::vector<std::vector<at::Tensor>>> results;
    try {
      for (int shift = 0; shift < (any_partial ? 2 : 1); ++shift) {
        std::vector<std::vector<at::Tensor>> pieces;
        for (size_t k = 0; k < whole.size(); ++k)
          pieces.push_back(local_pieces(whole[k], c.inputs[k], options.ranks, shift, static_cast<int>(k)));
        std::vector<std::vector<at::Tensor>> per_output(d.outputs);
        for (int64_t r = 0; r < options.ranks; ++r) {
          std::vector<at::Tensor> mine;
          for (const auto& p : pieces) mine.push_back(p[static_cast<size_t>(r)]);
          auto outs = call(op, with_tensors(stack, slots, mine));
          TORCH_CHECK(outs && outs->size() == d.outputs, "rank ", r, " gave ", outs ? outs->size() : 0,
                      " tensor outputs, the whole tensors ", d.outputs);
          for (size_t o = 0; o < d.outputs; ++o) per_output[o].push_back((*outs)[o]);
        }
        results.push_back(std::move(per_output));
      }
    } catch (const std::exception& e) {
      c.error = message_of(e);
      d.combinations.push_back(std::move(c));
      continue;
    }
    c.valid_outputs.resize(d.outputs);
    const auto [rtol, atol] = sample_tolerances(sample, whole, *truth);
    for (size_t o = 0; o < d.outputs; ++o) {
      const at::Tensor& g = (*truth)[o];
      for (const Placement& q : candidate_placements(g, options.partial)) {
        const bool valid = std::all_of(results.begin(), results.end(), [&](const auto& per_output) {
          return pieces_match(per_output[o], q, g, rtol, atol);
        });
        if (valid) c.valid_outputs[o].push_back(q);
      }
    }
    d.combinations.push_back(std::move(c));
  }
  return d;
}

namespace {

std::string placements_string(const std::vector<Placement>& ps) {
  std::string s = "(";
  for (size_t i = 0; i < ps.size(); ++i) s += (i ? ", " : "") + placement_label(ps[i]);
  return s + ")";
}

// The rule's options and choice for a call whose tensor slots are laid out as `inputs` (one
// placement per mesh dim each) on `mesh`; nullopt when the op has no rule.
std::optional<ops::StrategyQuery> query_rule(const c10::FunctionSchema& schema, const std::vector<c10::IValue>& stack,
                                             const std::vector<Slot>& slots, const std::vector<TensorMeta>& input_meta,
                                             const std::vector<TensorMeta>& output_meta, const DeviceMesh& mesh,
                                             const std::vector<std::vector<Placement>>& inputs,
                                             const std::string& rule_name) {
  ops::OpCall c;
  c.name = rule_name.empty() ? op_key(schema) : rule_name;
  c.schema = &schema;
  c.mesh = &mesh;
  c.args.resize(stack.size());
  for (size_t i = 0; i < stack.size(); ++i) c.args[i].value = stack[i];
  for (size_t k = 0; k < slots.size(); ++k) {
    const auto& [i, li] = slots[k];
    ops::ArgInfo& a = c.args[i];
    const DTensorSpec spec(mesh, inputs[k], input_meta[k]);
    if (li < 0) {
      a.kind = ops::ArgInfo::Kind::kDTensor;
      a.spec = spec;
    } else {
      a.kind = ops::ArgInfo::Kind::kDTensorList;
      a.list.push_back(spec);
      a.list_index.push_back(li);
      a.list_size = static_cast<int64_t>(stack[i].toListRef().size());
    }
    a.value = c10::IValue();
  }
  for (auto& a : c.args) {
    if (a.kind == ops::ArgInfo::Kind::kDTensor) c.inputs.push_back(&*a.spec);
    for (const auto& s : a.list) c.inputs.push_back(&s);
  }
  // The OpCall points into itself: query before it moves.
  return ops::query_strategies(c, [&] { return output_meta; });
}

bool contains(const std::vector<Placement>& v, const Placement& p) { return std::find(v.begin(), v.end(), p) != v.end(); }

}  // namespace

std::string placement_label(const Placement& p) {
  if (std::holds_alternative<Replicate>(p)) return "R";
  if (const auto* sh = std::get_if<Shard>(&p)) {
    if (sh->split_factor == 1) return "S(" + std::to_string(sh->dim) + ")";
    return "_S(" + std::to_string(sh->dim) + ", " + std::to_string(sh->split_factor) + ")";
  }
  return "P(" + comm::to_string(std::get<Partial>(p).reduce_op) + ")";
}

std::string RuleJudgement::Strategy::to_string() const {
  return placements_string(inputs) + " -> " + placements_string(outputs);
}

RuleJudgement judge_rule(const c10::OperatorHandle& op, const OpSample& sample, const SampleDiscovery& discovery,
                         const std::string& rule_name) {
  RuleJudgement j;
  if (!discovery.skipped.empty() || discovery.combinations.empty()) return j;
  const c10::FunctionSchema& schema = op.schema();
  const std::vector<c10::IValue> stack = boxed_args(schema, sample.args, sample.kwargs);
  const std::vector<Slot> slots = tensor_slots(stack);
  std::vector<TensorMeta> input_meta;
  for (const auto& s : slots) {
    const at::Tensor t = slot_tensor(stack, s);
    input_meta.push_back(TensorMeta{t.sizes().vec(), t.contiguous().strides().vec(), t.scalar_type()});
  }
  // The outputs' metadata, from one run on the whole tensors.
  std::vector<TensorMeta> output_meta;
  {
    std::vector<at::Tensor> copies;
    for (const auto& s : slots) copies.push_back(slot_tensor(stack, s).detach().clone());
    const std::optional<std::vector<at::Tensor>> outs = call(op, with_tensors(stack, slots, copies));
    for (const auto& g : *outs) output_meta.push_back(TensorMeta{g.sizes().vec(), g.strides().vec(), g.scalar_type()});
  }
  auto world = std::make_shared<comm::FakeGroup>(0, static_cast<int>(discovery.ranks));
  const DeviceMesh mesh = init_device_mesh("cpu", {discovery.ranks}, {}, world);
  auto query = [&](const std::vector<Placement>& inputs) {
    std::vector<std::vector<Placement>> full;
    for (const auto& p : inputs) full.push_back({p});
    return query_rule(schema, stack, slots, input_meta, output_meta, mesh, full, rule_name);
  };
  auto find = [&](const std::vector<Placement>& inputs) -> const DiscoveredCombination* {
    for (const auto& c : discovery.combinations)
      if (c.inputs == inputs) return &c;
    return nullptr;
  };
  auto add_wrong = [&](RuleJudgement::Strategy s) {
    for (const auto& w : j.wrong)
      if (w.inputs == s.inputs && w.outputs == s.outputs) return;
    j.wrong.push_back(std::move(s));
  };
  // Whether running the op on pieces laid out as `inputs` gives `outputs` (nullopt: discovery
  // does not try these placements).
  auto valid_strategy = [&](const std::vector<Placement>& inputs,
                            const std::vector<Placement>& outputs) -> std::optional<bool> {
    const DiscoveredCombination* at_inputs = find(inputs);
    if (at_inputs == nullptr) return std::nullopt;
    bool valid = at_inputs->error.empty();
    for (size_t out = 0; valid && out < outputs.size() && out < at_inputs->valid_outputs.size(); ++out) {
      const Placement& p = outputs[out];
      const auto* sh = std::get_if<Shard>(&p);
      // A placement discovery does not try for this output (a shard of a size-1 dim).
      const auto& meta = output_meta[out];
      if (sh && (sh->split_factor != 1 || sh->dim >= static_cast<int64_t>(meta.shape.size()) ||
                 meta.shape[static_cast<size_t>(sh->dim)] <= 1))
        return std::nullopt;
      valid = contains(at_inputs->valid_outputs[out], p);
    }
    return valid;
  };
  for (const DiscoveredCombination& c : discovery.combinations) {
    std::optional<ops::StrategyQuery> q;
    try {
      q = query(c.inputs);
    } catch (const std::exception& e) {
      j.choices.push_back({c.inputs, "unsupported", {}, 0, 0, message_of(e)});
      continue;
    }
    if (!q) {
      // No rule. An op with a CompositeImplicitAutograd kernel (matmul, linear, einsum) never
      // reaches the DTensor key: it decomposes into ops that have rules, so a DTensor call runs
      // (its values are the op suite's to check). Any other raises, whatever the layout.
      const bool decomposes = op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd);
      for (const DiscoveredCombination& each : discovery.combinations)
        j.choices.push_back({each.inputs, decomposes ? "unjudged" : "unsupported", {}, 0, 0,
                             decomposes ? "decomposes into ops with rules" : "no sharding rule"});
      return j;
    }
    j.has_rule = true;
    j.own_local_computation = q->has_kernel || q->has_rewrite;
    for (size_t k = 0; k < q->options.size(); ++k) {
      const ops::DimOption& o = q->options[k];
      if (!q->runnable[k] || j.own_local_computation) continue;
      const std::optional<bool> valid = valid_strategy(o.inputs, o.outputs);
      if (!valid) continue;
      if (*valid) {
        ++j.confirmed;
      } else {
        add_wrong({o.inputs, o.outputs});
      }
    }
    {
      RuleJudgement::Choice choice{c.inputs, "unsupported", {}, q->chosen.cost, 0, ""};
      if (!std::isfinite(q->chosen.cost)) {
        choice.message = "no valid strategy";
      } else {
        std::vector<Placement> chosen_inputs;
        for (const auto& in : q->chosen.inputs) chosen_inputs.push_back(in.empty() ? Placement(Replicate()) : in[0]);
        for (const auto& out : q->chosen.outputs) choice.outputs.push_back(out.empty() ? Placement(Replicate()) : out[0]);
        for (size_t k = 0; k < chosen_inputs.size() && k < c.inputs.size(); ++k)
          if (!(chosen_inputs[k] == c.inputs[k]) && !std::holds_alternative<Replicate>(c.inputs[k])) ++choice.collectives;
        const std::optional<bool> valid =
            j.own_local_computation ? std::nullopt : valid_strategy(chosen_inputs, choice.outputs);
        choice.status = !valid ? "unjudged" : *valid ? "ok" : "wrong";
      }
      j.choices.push_back(std::move(choice));
    }
    // Valid outputs (one placement per output; every output's valid placements combine, since
    // the local runs are the same) the rule does not offer for these very inputs.
    if (!c.error.empty() || c.valid_outputs.empty()) continue;
    std::vector<std::vector<Placement>> tuples{{}};
    for (const auto& valid : c.valid_outputs) {
      std::vector<std::vector<Placement>> next;
      for (const auto& t : tuples)
        for (const auto& p : valid) {
          next.push_back(t);
          next.back().push_back(p);
        }
      tuples = std::move(next);
      if (tuples.size() > 256) break;
    }
    for (const auto& outputs : tuples) {
      if (outputs.size() != c.valid_outputs.size()) break;
      const bool offered = std::any_of(q->options.begin(), q->options.end(), [&](const ops::DimOption& o) {
        return o.inputs == c.inputs && o.outputs == outputs;
      });
      if (offered) continue;
      ++j.unoffered;
      const double chosen = q->chosen.cost;
      if (chosen > 0) j.missing.push_back({{c.inputs, outputs}, chosen});
    }
  }
  std::stable_sort(j.missing.begin(), j.missing.end(),
                   [](const RuleJudgement::Missing& a, const RuleJudgement::Missing& b) { return a.saved > b.saved; });
  return j;
}

// NOTE: [Judging choices on a mesh of several dims]
// A layout on mesh dims 0..n-1 is simulated top-down: the whole tensor is split by mesh dim 0's
// placement into one piece per coordinate (local_pieces: chunks, adversarial Partial shares,
// copies), each piece by mesh dim 1's, and so on, the ranks in row-major order: a later mesh
// dim sharding the same tensor dim splits the piece the earlier one left, as DTensor does. The
// op runs on each rank's pieces, and the outputs are put back bottom-up: the last mesh dim's
// pieces are joined (concatenated for Shard, reduced for Partial, all equal for Replicate) into
// the piece their parent stands for, up to the whole result, which must equal the op's on the
// whole tensors; every rank's piece must also have the shape its layout implies. Layouts with a
// Partial run again on the complementary checkerboard. A tensor with strided shards (and no
// Partial) is split into, and its output compared by, the boxes compute_local_shape_and_
// global_offset gives each rank: under NOTE: [Strided shards] every rank holds one box, so
// a strided layout differs from the plain one only in which rank holds which box.
namespace {

// The rank's coordinate on the mesh, row-major (as split_on_mesh orders the ranks).
std::vector<int64_t> coord_of(int64_t rank, const std::vector<int64_t>& mesh_shape) {
  std::vector<int64_t> coord(mesh_shape.size());
  for (size_t m = mesh_shape.size(); m-- > 0;) {
    coord[m] = rank % mesh_shape[m];
    rank /= mesh_shape[m];
  }
  return coord;
}

// The box of `t` the rank at `coord` holds under `placements` (Shard, strided or not, and
// Replicate only).
at::Tensor box_of(const at::Tensor& t, const std::vector<Placement>& placements, const std::vector<int64_t>& mesh_shape,
                  const std::vector<int64_t>& coord) {
  const auto [shape, offset] = compute_local_shape_and_global_offset(t.sizes(), mesh_shape, placements, coord);
  at::Tensor box = t;
  for (int64_t d = 0; d < t.dim(); ++d)
    box = box.narrow(d, offset[static_cast<size_t>(d)], shape[static_cast<size_t>(d)]);
  return box;
}

bool any_strided(const std::vector<Placement>& ps) {
  return std::any_of(ps.begin(), ps.end(), [](const Placement& p) { return is_strided_shard(p); });
}
bool any_partial(const std::vector<Placement>& ps) {
  return std::any_of(ps.begin(), ps.end(), [](const Placement& p) { return std::holds_alternative<Partial>(p); });
}

std::vector<at::Tensor> split_on_mesh(const at::Tensor& t, const std::vector<Placement>& placements,
                                      const std::vector<int64_t>& mesh_shape, int shift, int tensor_index) {
  std::vector<at::Tensor> nodes{t};
  for (size_t m = 0; m < mesh_shape.size(); ++m) {
    std::vector<at::Tensor> next;
    for (const auto& node : nodes) {
      if (mesh_shape[m] == 1) {
        next.push_back(node);
        continue;
      }
      for (auto& piece : local_pieces(node, placements[m], mesh_shape[m], shift, tensor_index + static_cast<int>(m)))
        next.push_back(std::move(piece));
    }
    nodes = std::move(next);
  }
  return nodes;
}

// The whole tensor the ranks' `pieces` stand for under `placements`; nullopt when Replicate
// pieces differ or Shard pieces do not join.
std::optional<at::Tensor> join_on_mesh(std::vector<at::Tensor> nodes, const std::vector<Placement>& placements,
                                       const std::vector<int64_t>& mesh_shape, double rtol, double atol) {
  for (size_t m = mesh_shape.size(); m-- > 0;) {
    const auto n = static_cast<size_t>(mesh_shape[m]);
    std::vector<at::Tensor> parents;
    for (size_t first = 0; first < nodes.size(); first += n) {
      const std::vector<at::Tensor> group(nodes.begin() + static_cast<std::ptrdiff_t>(first),
                                          nodes.begin() + static_cast<std::ptrdiff_t>(first + n));
      const Placement& p = placements[m];
      if (n == 1 || std::holds_alternative<Replicate>(p)) {
        for (const auto& g : group)
          if (!close(g, group[0], rtol, atol)) return std::nullopt;
        parents.push_back(group[0]);
      } else if (const auto* s = std::get_if<Shard>(&p)) {
        const int64_t dim = s->dim < 0 ? s->dim + group[0].dim() : s->dim;
        for (const auto& g : group)
          if (g.dim() != group[0].dim() || dim < 0 || dim >= g.dim()) return std::nullopt;
        try {
          parents.push_back(at::cat(group, dim));
        } catch (const std::exception&) {
          return std::nullopt;
        }
      } else {
        const comm::ReduceOp op = std::get<Partial>(p).reduce_op;
        at::Tensor r = group[0];
        for (size_t i = 1; i < n; ++i) {
          if (group[i].sizes() != r.sizes()) return std::nullopt;
          if (op == comm::ReduceOp::MIN || op == comm::ReduceOp::MAX) {
            if (r.is_complex()) return std::nullopt;
            r = op == comm::ReduceOp::MIN ? at::minimum(r, group[i]) : at::maximum(r, group[i]);
          } else {
            r = r + group[i];
          }
        }
        if (op == comm::ReduceOp::AVG) {
          if (!inexact(r)) return std::nullopt;
          r = r / static_cast<double>(n);
        }
        parents.push_back(r);
      }
    }
    nodes = std::move(parents);
  }
  return nodes.at(0);
}

std::string layout_string(const std::vector<std::vector<Placement>>& tensors) {
  std::string s = "(";
  for (size_t i = 0; i < tensors.size(); ++i) {
    s += i ? ", [" : "[";
    for (size_t m = 0; m < tensors[i].size(); ++m) s += (m ? ", " : "") + placement_label(tensors[i][m]);
    s += "]";
  }
  return s + ")";
}

}  // namespace

MeshJudgement judge_rule_on_mesh(const c10::OperatorHandle& op, const OpSample& sample,
                                 const MeshCheckOptions& options, const std::string& rule_name) {
  TORCH_CHECK(!options.mesh_shape.empty(), "judge_rule_on_mesh: an empty mesh shape");
  for (int64_t n : options.mesh_shape)
    TORCH_CHECK(n >= 1, "judge_rule_on_mesh: mesh shape ", c10::IntArrayRef(options.mesh_shape), " has a dim below 1");
  MeshJudgement j;
  const c10::FunctionSchema& schema = op.schema();
  const Prepared prep = prepare_sample(op, sample);
  if (!prep.skipped.empty()) {
    j.skipped = prep.skipped;
    return j;
  }
  const auto [rtol_opt, atol_opt] = sample_tolerances(sample, prep.whole, prep.truth);
  std::vector<TensorMeta> input_meta, output_meta;
  for (const auto& t : prep.whole) input_meta.push_back(TensorMeta{t.sizes().vec(), t.contiguous().strides().vec(), t.scalar_type()});
  for (const auto& g : prep.truth) output_meta.push_back(TensorMeta{g.sizes().vec(), g.strides().vec(), g.scalar_type()});
  const int64_t ranks = c10::multiply_integers(options.mesh_shape);
  auto world = std::make_shared<comm::FakeGroup>(0, static_cast<int>(ranks));
  const DeviceMesh mesh = init_device_mesh("cpu", options.mesh_shape, {}, world);

  // Layouts: per tensor, per mesh dim, one of the tensor's candidates; every one or a seeded draw.
  const size_t mesh_dims = options.mesh_shape.size();
  std::vector<std::vector<Placement>> candidates;
  size_t total = 1;
  for (const auto& t : prep.whole) {
    candidates.push_back(candidate_placements(t, options.partial && inexact(t)));
    for (size_t m = 0; m < mesh_dims; ++m)
      total = total > options.combinations ? total : total * candidates.back().size();
  }
  std::vector<std::vector<std::vector<Placement>>> layouts;
  // Strided layouts first (MeshCheckOptions::strided).
  if (options.strided && mesh_dims >= 2 && options.mesh_shape[mesh_dims - 2] > 1 && options.mesh_shape[mesh_dims - 1] > 1) {
    const std::vector<Placement> rep(mesh_dims, Replicate{});
    auto strided_on = [&](int64_t d) {
      std::vector<Placement> ps = rep;
      ps[mesh_dims - 2] = StridedShard(d, options.mesh_shape[mesh_dims - 1]);
      ps[mesh_dims - 1] = Shard{d};
      return ps;
    };
    for (size_t k = 0; k < prep.whole.size(); ++k)
      for (int64_t d = 0; d < prep.whole[k].dim(); ++d) {
        if (prep.whole[k].size(d) < 2) continue;
        std::vector<std::vector<Placement>> l(prep.whole.size(), rep);
        l[k] = strided_on(d);
        layouts.push_back(std::move(l));
      }
    for (int64_t d = 0; prep.whole.size() > 1 && d < prep.whole[0].dim(); ++d) {
      if (prep.whole[0].size(d) < 2) continue;
      std::vector<std::vector<Placement>> l(prep.whole.size(), rep);
      size_t laid = 0;
      for (size_t k = 0; k < l.size(); ++k)
        if (prep.whole[k].sizes() == prep.whole[0].sizes()) {
          l[k] = strided_on(d);
          ++laid;
        }
      if (laid > 1) layouts.push_back(std::move(l));
    }
  }
  auto layout_at = [&](std::vector<size_t> digits) {
    std::vector<std::vector<Placement>> l(prep.whole.size());
    for (size_t k = 0; k < l.size(); ++k)
      for (size_t m = 0; m < mesh_dims; ++m) l[k].push_back(candidates[k][digits[k * mesh_dims + m]]);
    return l;
  };
  if (total <= options.combinations) {
    std::vector<size_t> digits(prep.whole.size() * mesh_dims, 0);
    for (;;) {
      layouts.push_back(layout_at(digits));
      size_t pos = 0;
      while (pos < digits.size() && ++digits[pos] == candidates[pos / mesh_dims].size()) digits[pos++] = 0;
      if (pos == digits.size()) break;
    }
  } else {
    std::mt19937_64 rng(options.seed);
    for (size_t i = 0; i < options.combinations; ++i) {
      std::vector<size_t> digits(prep.whole.size() * mesh_dims);
      for (size_t d = 0; d < digits.size(); ++d) {
        const size_t n = candidates[d / mesh_dims].size();
        digits[d] = rng() % 3 == 0 ? 0 : rng() % n;  // Replicate in at least a third
      }
      layouts.push_back(layout_at(digits));
    }
  }

  for (const auto& layout : layouts) {
    std::optional<ops::StrategyQuery> q;
    try {
      q = query_rule(schema, prep.stack, prep.slots, input_meta, output_meta, mesh, layout, rule_name);
    } catch (const std::exception&) {
      ++j.unsupported;
      continue;
    }
    if (!q) return j;  // no rule
    j.has_rule = true;
    if (q->has_kernel || q->has_rewrite) {
      j.own_local_computation = true;
      return j;
    }
    const ops::OutputSharding& chosen = q->relabelled ? *q->relabelled : q->chosen;
    if (!std::isfinite(chosen.cost)) {
      ++j.unsupported;
      continue;
    }
    const auto& ins = chosen.inputs;
    const auto& outs = chosen.outputs;
    bool strided_and_partial = false, partial = false, strided = false;
    for (const auto* side : {&ins, &outs})
      for (const auto& ps : *side) {
        strided_and_partial = strided_and_partial || (any_strided(ps) && any_partial(ps));
        partial = partial || any_partial(ps);
        strided = strided || any_strided(ps);
      }
    for (const auto& ps : layout) strided = strided || any_strided(ps);
    if (strided_and_partial || ins.size() != prep.whole.size() || outs.size() != prep.truth.size()) {
      ++j.unjudged;
      continue;
    }
    const std::string strategy = layout_string(ins) + " -> " + layout_string(outs);
    std::string why;
    try {
      for (int shift = 0; shift < (partial ? 2 : 1) && why.empty(); ++shift) {
        std::vector<std::vector<at::Tensor>> pieces;
        for (size_t k = 0; k < prep.whole.size(); ++k) {
          if (!any_strided(ins[k])) {
            pieces.push_back(split_on_mesh(prep.whole[k], ins[k], options.mesh_shape, shift, static_cast<int>(k)));
            continue;
          }
          pieces.emplace_back();
          for (int64_t r = 0; r < ranks; ++r)
            pieces.back().push_back(box_of(prep.whole[k], ins[k], options.mesh_shape, coord_of(r, options.mesh_shape)).clone());
        }
        std::vector<std::vector<at::Tensor>> per_output(prep.truth.size());
        for (int64_t r = 0; r < ranks; ++r) {
          std::vector<at::Tensor> mine;
          for (const auto& p : pieces) mine.push_back(p[static_cast<size_t>(r)]);
          auto local = call(op, with_tensors(prep.stack, prep.slots, mine));
          TORCH_CHECK(local && local->size() == prep.truth.size(), "rank ", r, " gave ", local ? local->size() : 0,
                      " tensor outputs");
          for (size_t o = 0; o < prep.truth.size(); ++o) per_output[o].push_back((*local)[o]);
        }
        for (size_t o = 0; o < prep.truth.size() && why.empty(); ++o) {
          const at::Tensor& g = prep.truth[o];
          const auto [dr, da] = dtype_tolerance(g.scalar_type());
          const double rtol = rtol_opt.value_or(dr);
          double atol = atol_opt.value_or(da);
          for (int64_t r = 0; r < ranks && why.empty(); ++r) {
            const std::vector<int64_t> coord = coord_of(r, options.mesh_shape);
            const auto expected = compute_local_shape_and_global_offset(g.sizes(), options.mesh_shape, outs[o], coord).first;
            if (per_output[o][static_cast<size_t>(r)].sizes() != c10::IntArrayRef(expected))
              why = "output " + std::to_string(o) + " on rank " + std::to_string(r) + " has shape " +
                    c10::str(per_output[o][static_cast<size_t>(r)].sizes()) + ", its layout implies " +
                    c10::str(c10::IntArrayRef(expected));
          }
          if (!why.empty()) break;
          if (any_strided(outs[o])) {  // each rank's piece is its box of the result
            for (int64_t r = 0; r < ranks && why.empty(); ++r)
              if (!close(per_output[o][static_cast<size_t>(r)].to(g.scalar_type()),
                         box_of(g, outs[o], options.mesh_shape, coord_of(r, options.mesh_shape)), rtol, atol))
                why = "output " + std::to_string(o) + " on rank " + std::to_string(r) + " has other values than its box";
            continue;
          }
          if (partial && inexact(g)) atol += rtol * static_cast<double>(ranks) * max_abs(per_output[o]);
          const std::optional<at::Tensor> joined = join_on_mesh(per_output[o], outs[o], options.mesh_shape, rtol, atol);
          if (!joined || !close(joined->to(g.scalar_type()), g, rtol, atol))
            why = "output " + std::to_string(o) + (joined ? " has other values" : "'s pieces do not fit together");
        }
      }
    } catch (const std::exception& e) {
      why = "the op raises on the pieces: " + message_of(e).substr(0, 160);
    }
    ++j.checked;
    j.strided += strided;
    if (!why.empty()) j.wrong.push_back(layout_string(layout) + " chooses " + strategy + ": " + why);
  }
  return j;
}

}  // namespace testing
}  // namespace dtensor
