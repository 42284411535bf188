// dtensor/ops/matrix_rules.cpp: matrix products (mm, bmm, dot, vdot, mv, addmm, baddbmm,
// addbmm, addmv, addr) and the fused attention forward (DESIGN.md D5). Composite ops (matmul,
// linear, einsum, outer/ger, the attention math path) reach the dispatcher as these products
// plus views and pointwise ops, and are covered by those rules.
//
// NOTE: [Matrix products as einsum]
// Each product is described by an einsum equation over its two operands ("mk,kn->mn" for mm)
// and gets the same options as PyTorch's einsum strategy, for one mesh dim:
//   - everything Replicate;
//   - a batch letter (in both operands and the output) sharded everywhere -> output Shard;
//   - a contracted letter (in both operands, not in the output) sharded on both operands ->
//     Partial(sum) output: each rank holds the product of its slices of the contraction;
//   - a free letter (in one operand and the output) sharded on that operand, the other
//     replicated -> output Shard of that letter;
//   - one operand Partial(sum|avg), the other replicated -> output Partial of the same op
//     (a product is linear in each operand, NOTE: [Partial and linearity]).
// Uneven shards are fine: both operands of a contracted or batch letter have the same size
// there and are cut the same way (NOTE: [Uneven shards]).
// The add-variants (addmm: beta * self + alpha * (a @ b)) put `self` first: it broadcasts to
// the output, so it follows the output's placement (Shard of the dim it lines up with,
// Replicate where it broadcasts) and, for a Partial output, must be Partial of the same op:
// then every rank adds its share of beta * self.
#include "dtensor/compat.h"
#include "dtensor/ops/registry.h"
#include "dtensor/ops/rule_helpers.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <string>

namespace dtensor {
namespace ops {
namespace {

const Placement R = Replicate{};

// Options of "lhs,rhs->out" (NOTE: [Matrix products as einsum]).
std::vector<DimOption> einsum_options(const std::string& equation) {
  const auto comma = equation.find(',');
  const auto arrow = equation.find("->");
  TORCH_INTERNAL_ASSERT(comma != std::string::npos && arrow != std::string::npos, "bad equation ", equation);
  const std::string lhs = equation.substr(0, comma);
  const std::string rhs = equation.substr(comma + 1, arrow - comma - 1);
  const std::string out = equation.substr(arrow + 2);
  auto shard_of = [](const std::string& dims, char letter) -> Placement {
    const auto p = dims.find(letter);
    return p == std::string::npos ? R : Placement(Shard{static_cast<int64_t>(p)});
  };
  std::vector<DimOption> o;
  o.push_back({{R}, {R, R}});
  std::string letters = lhs;
  for (char c : rhs)
    if (letters.find(c) == std::string::npos) letters += c;
  for (char c : letters) {
    const bool in_l = lhs.find(c) != std::string::npos, in_r = rhs.find(c) != std::string::npos;
    const bool in_out = out.find(c) != std::string::npos;
    if (in_out) {
      // Batch letter (both operands) or free letter (one operand; the other replicated).
      o.push_back({{shard_of(out, c)}, {shard_of(lhs, c), shard_of(rhs, c)}});
    } else if (in_l && in_r) {
      o.push_back({{Partial{}}, {shard_of(lhs, c), shard_of(rhs, c)}});
    }
  }
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) {
    o.push_back({{Partial(op)}, {Partial(op), R}});
    o.push_back({{Partial(op)}, {R, Partial(op)}});
  }
  return o;
}

// The add-variant of a product: `self` first, following the output.
std::vector<DimOption> add_product_options(const OpCall& c, const std::string& equation) {
  std::vector<DimOption> out;
  const auto& self_shape = c.inputs[0]->tensor_meta.shape;
  const auto& out_shape = c.output_meta[0].shape;
  for (auto& mo : einsum_options(equation)) {
    DimOption o{mo.outputs, {}};
    const Placement& p = mo.outputs[0];
    if (is_shard(p)) {
      const int64_t a = broadcast_input_dim(self_shape, out_shape, std::get<Shard>(p).dim);
      o.inputs.push_back(a < 0 ? R : Placement(Shard{a}));
    } else {
      o.inputs.push_back(p);
    }
    o.inputs.insert(o.inputs.end(), mo.inputs.begin(), mo.inputs.end());
    out.push_back(std::move(o));
  }
  // NOTE: [A Partial self plus a replicated product]
  // beta * self + alpha * (mat1 @ mat2) with both factors replicated adds the same value on
  // every rank to beta * self: a Partial(avg) self stays Partial(avg) (for any beta), and a
  // Partial(max) or (min) one keeps its kind for beta >= 0 and swaps it for beta < 0 (beta is
  // argument 3 of addmm, baddbmm, addbmm and addmv). Partial(sum) would add the product once per
  // rank: only a Partial(sum) product goes with it (the contraction options above).
  const double beta = detail::scalar_arg(c, 3, 1);
  for (auto op : {comm::ReduceOp::AVG, comm::ReduceOp::MAX, comm::ReduceOp::MIN}) {
    comm::ReduceOp kept = op;
    if (beta < 0 && op != comm::ReduceOp::AVG) kept = op == comm::ReduceOp::MAX ? comm::ReduceOp::MIN : comm::ReduceOp::MAX;
    out.push_back({{Partial(kept)}, {Partial(op), R, R}});  // (self, mat1, mat2); out= is fitted later
  }
  return out;
}

// NOTE: [Attention forward]
// The fused attention op (compat::kSdpaFusedOp) differs between the libtorch lines:
//   - 1.13: aten::_scaled_dot_product_attention_forward(q, k, v, attn_mask, dropout_p,
//     need_attn_weights, is_causal) -> (output, weights), the path _scaled_dot_product_attention
//     takes when no input requires grad (with grad it decomposes into matmul, _softmax and
//     dropout, which have rules of their own); weights (..., L, S), undefined unless
//     need_attn_weights;
//   - 2.x: aten::_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *,
//     attn_mask, scale) -> (output, logsumexp), the path scaled_dot_product_attention takes on
//     CPU when aten::_fused_sdp_choice picks flash (4-D inputs, no dropout; with or without
//     grad: its backward op has no rule, so training through it needs the math path or
//     dtensor::nn::functional::scaled_dot_product_attention); logsumexp (B, H, L).
// q is (..., L, E), k (..., S, E), v (..., S, Ev); the output is (..., L, Ev); the second output
// (weights or logsumexp) has q's leading dims and L in the same positions. Per mesh dim:
//   - a batch/head dim (any leading dim) sharded on q, k and v (and on the mask where it has
//     that dim, else the mask is replicated) -> both outputs sharded there;
//   - q's L dim sharded, k and v replicated -> both outputs sharded on L (not with is_causal:
//     the causal mask is built from the local L);
//   - v Partial, q and k replicated -> output Partial (the output is linear in v), weights
//     Replicate (they do not depend on v).
// dropout_p > 0 is refused: the fused kernel draws the dropout mask from each rank's default
// generator, which DTensor's RNG tracker does not control.
std::vector<DimOption> attention_options(const OpCall& c) {
  const double dropout_p =
      c.args[compat::kSdpaDropoutArg].value.isDouble() ? c.args[compat::kSdpaDropoutArg].value.toDouble() : 0.0;
  TORCH_CHECK(dropout_p == 0.0, "DTensor: ", c.name, " with dropout_p = ", dropout_p,
              " would draw its dropout mask from each rank's default generator, so the values would not match "
              "the single-device op; call it with dropout_p = 0 and apply at::dropout to the weights, or with "
              "inputs that require grad (the decomposed path uses DTensor's RNG tracker)");
  const bool is_causal = arg_bool(c, compat::kSdpaCausalArg, false);
  const bool has_mask = c.args[compat::kSdpaMaskArg].kind == ArgInfo::Kind::kDTensor;
  const int64_t nd = c.inputs[0]->ndim();
  const auto& out_shape = c.output_meta[0].shape;
  auto mask_placement = [&](int64_t out_dim) -> Placement {
    const int64_t a = broadcast_input_dim(c.inputs[3]->tensor_meta.shape, out_shape, out_dim);
    return a < 0 ? R : Placement(Shard{a});
  };
  std::vector<DimOption> o;
  auto add = [&](Placement out, Placement q, Placement k, Placement v, Placement w, Placement m) {
    DimOption d{{out, w}, {q, k, v}};
    if (has_mask) d.inputs.push_back(m);
    o.push_back(std::move(d));
  };
  add(R, R, R, R, R, R);
  for (int64_t b = 0; b + 2 < nd; ++b)
    add(Shard{b}, Shard{b}, Shard{b}, Shard{b}, Shard{b}, has_mask ? mask_placement(b) : R);
  if (!is_causal) add(Shard{nd - 2}, Shard{nd - 2}, R, R, Shard{nd - 2}, has_mask ? mask_placement(nd - 2) : R);
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG}) add(Partial(op), R, R, Partial(op), R, R);
  return o;
}

// The fused attention's backward (compat::kSdpaFusedBackwardOp, 2.x): inputs grad_out, q, k, v,
// out, logsumexp[, attn_mask]; outputs grad_q, grad_k, grad_v. Per mesh dim: a batch/head dim
// sharded everywhere -> the gradients sharded there; q's L dim sharded on grad_out, q, out and
// logsumexp (k, v replicated; not with is_causal) -> grad_q Shard(L), grad_k and grad_v
// Partial (each rank's rows of q contribute a share); grad_out Partial, the rest replicated ->
// every gradient Partial (they are linear in grad_out).
std::vector<DimOption> attention_backward_options(const OpCall& c) {
  const bool is_causal = arg_bool(c, static_cast<size_t>(compat::kSdpaBackwardCausalArg), false);
  const bool has_mask = c.inputs.size() > 6;
  const int64_t nd = c.inputs[1]->ndim();
  const auto& out_shape = c.output_meta[0].shape;
  auto mask_placement = [&](int64_t out_dim) -> Placement {
    const int64_t a = broadcast_input_dim(c.inputs[6]->tensor_meta.shape, out_shape, out_dim);
    return a < 0 ? R : Placement(Shard{a});
  };
  std::vector<DimOption> o;
  auto add = [&](std::vector<Placement> outs, std::vector<Placement> ins, Placement m) {
    if (has_mask) ins.push_back(m);
    o.push_back({std::move(outs), std::move(ins)});
  };
  add({R, R, R}, {R, R, R, R, R, R}, R);
  for (int64_t b = 0; b + 2 < nd; ++b) {
    const Placement s = Shard{b};
    add({s, s, s}, {s, s, s, s, s, s}, has_mask ? mask_placement(b) : R);
  }
  if (!is_causal) {
    const Placement l = Shard{nd - 2};
    add({l, Partial{}, Partial{}}, {l, l, R, R, l, l}, has_mask ? mask_placement(nd - 2) : R);
  }
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG})
    add({Partial(op), Partial(op), Partial(op)}, {Partial(op), R, R, R, R, R}, R);
  return o;
}

// libtorch 2.x's CPU flash kernels divide by zero on empty inputs (SIGFPE), which an uneven
// split gives some ranks (a dim of 5 on 4 ranks: 2, 2, 1, 0), and have no meta kernel. A rank
// whose shard of any input is empty gets zero outputs of its local shapes (from the chosen
// output placements) and the outputs' dtypes, without running the kernel. (No attention output
// is 0-dim: an output whose metadata has no dims is one the op leaves undefined.)
std::vector<c10::IValue> attention_on_shards(const c10::OperatorHandle& op, std::vector<c10::IValue>& args,
                                             const OpCall& call, const OutputSharding& sharding) {
  bool empty = false;
  c10::Device device = c10::kCPU;
  for (const auto& a : args)
    if (a.isTensor() && a.toTensor().defined()) {
      empty = empty || a.toTensor().numel() == 0;
      device = a.toTensor().device();
    }
  torch::jit::Stack stack(args.begin(), args.end());
  if (!empty) {
    op.callBoxed(&stack);
    return stack;
  }
  std::vector<c10::IValue> rets;
  for (size_t i = 0; i < op.schema().returns().size(); ++i) {
    const TensorMeta& m = sharding.output_meta[i];
    if (m.shape.empty()) {
      rets.emplace_back(at::Tensor());
      continue;
    }
    // zeros: a Partial(sum) output (grad_k, grad_v of a rank with no rows of q) adds nothing.
    rets.emplace_back(at::zeros(compute_local_shape(m.shape, *call.mesh, sharding.outputs[i]),
                                at::TensorOptions().dtype(m.dtype).device(device)));
  }
  return rets;
}

// NOTE: [Attention kernel choice]
// On libtorch 2.x, scaled_dot_product_attention first asks compat::kSdpaChoiceOp
// (aten::_fused_sdp_choice) which kernel to run: flash (compat::kSdpaFusedOp) or the math
// decomposition. The answer (an int) depends only on the inputs' metadata (dims, sizes,
// strides, dtype, device) and the other arguments. Every rank must take the same path, and its
// shards' sizes may differ (an empty shard of an uneven split would pick math where the others
// pick flash), so the choice is made once from the GLOBAL metadata, on stand-in tensors that
// have it and share one byte of data (never read). The inputs stay where they are.
std::vector<DimOption> keep_placements(const OpCall& c) {
  std::vector<DimOption> o;
  for (int64_t d = 0; d < c.mesh->ndim(); ++d) {
    DimOption opt;
    for (const DTensorSpec* s : c.inputs) opt.inputs.push_back(s->placements[static_cast<size_t>(d)]);
    o.push_back(std::move(opt));
  }
  return o;
}

std::vector<c10::IValue> choice_from_global_meta(const c10::OperatorHandle& op, std::vector<c10::IValue>& args,
                                                 const OpCall& call, const OutputSharding&) {
  static char data = 0;
  for (size_t i = 0; i < call.args.size(); ++i) {
    if (call.args[i].kind != ArgInfo::Kind::kDTensor) continue;
    const TensorMeta& m = call.args[i].spec->tensor_meta;
    args[i] = at::from_blob(&data, m.shape, m.stride, [](void*) {}, args[i].toTensor().options());
  }
  torch::jit::Stack stack(args.begin(), args.end());
  op.callBoxed(&stack);
  return stack;
}

const bool registered = [] {
  auto product = [](const char* op, const char* equation) {
    register_rule(op, [eq = std::string(equation)](const OpCall&) { return einsum_options(eq); });
  };
  auto add_product = [](const char* op, const char* equation) {
    register_rule(op, [eq = std::string(equation)](const OpCall& c) { return add_product_options(c, eq); });
  };
  product("aten::mm", "mk,kn->mn");
  product("aten::bmm", "bmk,bkn->bmn");
  product("aten::dot", "k,k->");
  product("aten::vdot", "k,k->");  // conj(self) . other: conjugation is real-linear, sums stay sums
  product("aten::mv", "mk,k->m");
  add_product("aten::addmm", "mk,kn->mn");
  add_product("aten::baddbmm", "bmk,bkn->bmn");
  // In place: self is written, so it keeps its placements (the dispatcher refuses the rest).
  add_product("aten::addmm_", "mk,kn->mn");
  add_product("aten::baddbmm_", "bmk,bkn->bmn");
  add_product("aten::addbmm", "bmk,bkn->mn");  // the batch is summed: a contracted letter
  // addmv's kernel returns `self` as it is when mat is empty ([m, 0] or [0, k]): with a
  // broadcast self ([1] or a scalar), a rank holding an empty piece of mat would hold a piece
  // of self's shape, not the output's ([1] for [0], or for [m] when its shard of k is empty).
  // No coordinate may then hold an empty piece of a mat that is not empty.
  RuleOptions addmv_options;
  addmv_options.valid = [](const OpCall& c, const FullPlacements& ins, const FullPlacements&) {
    const auto& self = c.inputs.at(0)->tensor_meta.shape;
    const auto& mat = c.inputs.at(1)->tensor_meta.shape;
    if ((self.size() == 1 && self[0] == mat[0]) || mat[0] == 0 || mat[1] == 0) return true;
    const std::vector<int64_t> mesh_shape = c.mesh->shape();
    return detail::for_every_coordinate(*c.mesh, [&](const std::vector<int64_t>& coord) {
      const auto local = compute_local_shape(mat, mesh_shape, ins[1], coord);
      return local[0] > 0 && local[1] > 0;
    });
  };
  register_rule("aten::addmv", [](const OpCall& c) { return add_product_options(c, "mk,k->m"); }, nullptr,
                addmv_options);
  add_product("aten::addr", "m,n->mn");
  RuleOptions on_shards;
  on_shards.kernel = attention_on_shards;
  register_rule(compat::kSdpaFusedOp, attention_options, nullptr, on_shards);
  if (compat::kSdpaFusedBackwardOp)
    register_rule(compat::kSdpaFusedBackwardOp, attention_backward_options, nullptr, on_shards);
  if (compat::kSdpaChoiceOp) {
    RuleOptions choice;
    choice.kernel = choice_from_global_meta;
    register_rule(compat::kSdpaChoiceOp, keep_placements, nullptr, choice);
  }
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
