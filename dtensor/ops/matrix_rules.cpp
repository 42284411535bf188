// dtensor/ops/matrix_rules.cpp: mm, addmm, bmm, baddbmm (DESIGN.md D5).
// With out = a @ b on one mesh dim: rows of a sharded -> rows of out; columns of b sharded ->
// columns of out; the contracted dim sharded on both -> Partial(sum) out; a Partial operand
// against a replicated one -> Partial out.
#include "dtensor/ops/registry.h"

namespace dtensor {
namespace ops {
namespace {

const Placement R = Replicate{};
const Placement P = Partial{};

// Options for a batched-or-not matmul whose operands are (.., m, k) and (.., k, n); `batch`
// is the number of leading batch dims (0 for mm, 1 for bmm).
std::vector<DimOption> matmul_options(int64_t batch) {
  const int64_t m = batch, k_a = batch + 1, k_b = batch, n = batch + 1;
  std::vector<DimOption> o;
  o.push_back({{R}, {R, R}});
  for (int64_t b = 0; b < batch; ++b) o.push_back({{Shard{b}}, {Shard{b}, Shard{b}}});
  o.push_back({{Shard{m}}, {Shard{m}, R}});
  o.push_back({{Shard{n}}, {R, Shard{n}}});
  o.push_back({{P}, {Shard{k_a}, Shard{k_b}}});
  o.push_back({{P}, {P, R}});
  o.push_back({{P}, {R, P}});
  return o;
}

// addmm/baddbmm: self (broadcast to the output) is added: it follows the output placement;
// a Partial output needs a Partial self.
std::vector<DimOption> add_matmul_options(const OpCall& c, int64_t batch) {
  std::vector<DimOption> out;
  const auto& self_shape = c.inputs[0]->tensor_meta.shape;
  const auto& out_shape = c.output_meta[0].shape;
  for (auto& mo : matmul_options(batch)) {
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
  return out;
}

const bool registered = [] {
  register_rule("aten::mm", [](const OpCall&) { return matmul_options(0); });
  register_rule("aten::bmm", [](const OpCall&) { return matmul_options(1); });
  register_rule("aten::addmm", [](const OpCall& c) { return add_matmul_options(c, 0); });
  register_rule("aten::baddbmm", [](const OpCall& c) { return add_matmul_options(c, 1); });
  // dot / mv as mm without the free dims.
  register_rule("aten::dot", [](const OpCall&) {
    return std::vector<DimOption>{{{R}, {R, R}}, {{P}, {Shard{0}, Shard{0}}}, {{P}, {P, R}}, {{P}, {R, P}}};
  });
  register_rule("aten::mv", [](const OpCall&) {
    return std::vector<DimOption>{{{R}, {R, R}}, {{Shard{0}}, {Shard{0}, R}}, {{P}, {Shard{1}, Shard{0}}},
                                  {{P}, {P, R}}, {{P}, {R, P}}};
  });
  return true;
}();

}  // namespace
}  // namespace ops
}  // namespace dtensor
