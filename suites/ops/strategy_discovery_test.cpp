// converters/strategy_discovery.h: the strategies discovered for ops whose valid strategies
// follow from algebra (linearity, monotonicity, which dims a matmul contracts), on even and
// uneven shards, and the pieces each placement gives.
#include "converters/strategy_discovery.h"
#include "dtensor/ops/registry.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace dtensor {
namespace testing {
namespace {

c10::OperatorHandle op(const char* name, const char* overload) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
}

// The valid placements of output `o` for the input placements `inputs` (short names); "error"
// when the op raised on the pieces. Fails the test when the combination was not visited.
std::vector<std::string> valid(const SampleDiscovery& d, const std::vector<std::string>& inputs, size_t o = 0) {
  for (const auto& c : d.combinations) {
    std::vector<std::string> names;
    for (const auto& p : c.inputs) names.push_back(placement_label(p));
    if (names != inputs) continue;
    if (!c.error.empty()) return {"error"};
    std::vector<std::string> out;
    for (const auto& p : c.valid_outputs.at(o)) out.push_back(placement_label(p));
    return out;
  }
  ADD_FAILURE() << "combination not visited";
  return {};
}

using Names = std::vector<std::string>;

SampleDiscovery discover(const c10::OperatorHandle& h, std::vector<c10::IValue> args, int64_t ranks = 2) {
  DiscoveryOptions o;
  o.ranks = ranks;
  SampleDiscovery d = discover_strategies(h, OpSample("test", std::move(args)), o);
  EXPECT_EQ(d.skipped, "");
  return d;
}

TEST(StrategyDiscovery, AddIsLinearAndShardsElementwise) {
  SampleGen g(1);
  const SampleDiscovery d = discover(op("aten::add", "Tensor"), {g.tensor({8, 4}), g.tensor({8, 4})});
  EXPECT_EQ(valid(d, {"S(0)", "S(0)"}), Names{"S(0)"});
  EXPECT_EQ(valid(d, {"S(1)", "S(1)"}), Names{"S(1)"});
  EXPECT_EQ(valid(d, {"P(sum)", "P(sum)"}), Names{"P(sum)"});
  EXPECT_EQ(valid(d, {"P(avg)", "P(avg)"}), Names{"P(avg)"});
  // A Partial plus a replicated value counts the value on every rank; max(a) + max(b) is not
  // max(a + b); a shard plus another dim's shard does not broadcast.
  EXPECT_EQ(valid(d, {"P(sum)", "R"}), Names{});
  EXPECT_EQ(valid(d, {"P(max)", "P(max)"}), Names{});
  EXPECT_EQ(valid(d, {"S(0)", "S(1)"}), Names{"error"});  // [4, 4] + [8, 2] do not broadcast
}

TEST(StrategyDiscovery, MonotoneOpsKeepMinAndMaxAndNegSwapsThem) {
  SampleGen g(2);
  const SampleDiscovery relu = discover(op("aten::relu", ""), {g.tensor({8, 4})});
  EXPECT_EQ(valid(relu, {"P(max)"}), Names{"P(max)"});
  EXPECT_EQ(valid(relu, {"P(min)"}), Names{"P(min)"});
  EXPECT_EQ(valid(relu, {"P(sum)"}), Names{});
  EXPECT_EQ(valid(relu, {"S(1)"}), Names{"S(1)"});
  const SampleDiscovery abs = discover(op("aten::abs", ""), {g.tensor({8, 4})});
  EXPECT_EQ(valid(abs, {"P(max)"}), Names{});
  EXPECT_EQ(valid(abs, {"P(sum)"}), Names{});
  const SampleDiscovery neg = discover(op("aten::neg", ""), {g.tensor({8, 4})});
  EXPECT_EQ(valid(neg, {"P(max)"}), Names{"P(min)"});
  EXPECT_EQ(valid(neg, {"P(min)"}), Names{"P(max)"});
  EXPECT_EQ(valid(neg, {"P(sum)"}), Names{"P(sum)"});
  EXPECT_EQ(valid(neg, {"P(avg)"}), Names{"P(avg)"});
}

TEST(StrategyDiscovery, MatmulShardsRowsAndColumnsAndContractsToPartial) {
  SampleGen g(3);
  const SampleDiscovery d = discover(op("aten::mm", ""), {g.tensor({8, 4}), g.tensor({4, 6})});
  EXPECT_EQ(valid(d, {"S(0)", "R"}), Names{"S(0)"});
  EXPECT_EQ(valid(d, {"R", "S(1)"}), Names{"S(1)"});
  EXPECT_EQ(valid(d, {"S(1)", "S(0)"}), Names{"P(sum)"});
  EXPECT_EQ(valid(d, {"P(sum)", "R"}), Names{"P(sum)"});
  EXPECT_EQ(valid(d, {"R", "P(avg)"}), Names{"P(avg)"});
  EXPECT_EQ(valid(d, {"P(sum)", "P(sum)"}), Names{});
  // Contracting dims sharded on different ranks' pieces of unequal size raise.
  EXPECT_EQ(valid(d, {"S(1)", "R"}), Names{"error"});
}

TEST(StrategyDiscovery, ReductionsTurnShardsIntoPartials) {
  SampleGen g(4);
  const SampleDiscovery sum = discover(op("aten::sum", ""), {g.tensor({8, 4})});
  EXPECT_EQ(valid(sum, {"S(0)"}), Names{"P(sum)"});
  EXPECT_EQ(valid(sum, {"S(1)"}), Names{"P(sum)"});
  EXPECT_EQ(valid(sum, {"P(sum)"}), Names{"P(sum)"});
  EXPECT_EQ(valid(sum, {"P(max)"}), Names{});
  const SampleDiscovery amax = discover(op("aten::amax", ""), {g.tensor({8, 4}), c10::IValue(std::vector<int64_t>{0})});
  EXPECT_EQ(valid(amax, {"S(0)"}), Names{"P(max)"});
  EXPECT_EQ(valid(amax, {"S(1)"}), Names{"S(0)"});  // [8, 4] -> [4]: columns stay split
  EXPECT_EQ(valid(amax, {"P(max)"}), Names{"P(max)"});
}

TEST(StrategyDiscovery, UnevenShardsAreTheirOwnPieces) {
  SampleGen g(5);
  // 5 rows on 4 ranks: 2, 2, 1 and an empty piece.
  const SampleDiscovery d = discover(op("aten::add", "Tensor"), {g.tensor({5, 6}), g.tensor({5, 6})}, 4);
  EXPECT_EQ(valid(d, {"S(0)", "S(0)"}), Names{"S(0)"});
  EXPECT_EQ(valid(d, {"S(1)", "S(1)"}), Names{"S(1)"});
  const at::Tensor t = at::arange(30, at::kFloat).view({5, 6});
  const auto pieces = local_pieces(t, Shard{0}, 4);
  ASSERT_EQ(pieces.size(), 4u);
  EXPECT_EQ(pieces[2].size(0), 1);
  EXPECT_EQ(pieces[3].size(0), 0);
  EXPECT_TRUE(pieces_match(pieces, Shard{0}, t));
  EXPECT_FALSE(pieces_match(pieces, Shard{1}, t));
}

TEST(StrategyDiscovery, PartialPiecesReduceToTheValueWithMixedSigns) {
  SampleGen g(6);
  const at::Tensor t = g.tensor({4, 6});
  for (auto op : {comm::ReduceOp::SUM, comm::ReduceOp::AVG, comm::ReduceOp::MIN, comm::ReduceOp::MAX}) {
    for (int shift : {0, 1}) {
      const auto pieces = local_pieces(t, Partial{op}, 3, shift);
      EXPECT_TRUE(pieces_match(pieces, Partial{op}, t)) << comm::to_string(op) << " shift " << shift;
      // No rank holds the value itself everywhere.
      for (const auto& p : pieces) EXPECT_FALSE(at::allclose(p, t)) << comm::to_string(op);
    }
  }
  const at::Tensor ints = at::arange(-6, 6, at::kLong).view({3, 4});
  EXPECT_TRUE(pieces_match(local_pieces(ints, Partial{comm::ReduceOp::SUM}, 4), Partial{comm::ReduceOp::SUM}, ints));
  EXPECT_TRUE(pieces_match(local_pieces(ints, Partial{comm::ReduceOp::MAX}, 4), Partial{comm::ReduceOp::MAX}, ints));
}

TEST(StrategyDiscovery, SkipsWhatItCannotJudge) {
  SampleGen g(7);
  EXPECT_EQ(discover_strategies(op("aten::add_", "Tensor"), OpSample("x", {g.tensor({4}), g.tensor({4})})).skipped,
            "the op writes an argument (in-place or out=)");
  EXPECT_EQ(discover_strategies(op("aten::mul", "Tensor"), OpSample("x", {g.tensor({4}), at::zeros({4})})).skipped,
            "an all-zero output");
}

// ---- judging rules ----------------------------------------------------------------------------

std::vector<std::string> strings(const std::vector<RuleJudgement::Strategy>& v) {
  std::vector<std::string> out;
  for (const auto& s : v) out.push_back(s.to_string());
  return out;
}

// Probe rules, registered under names of their own (the real ops keep their rules): one that
// claims relu is linear, one that replicates add.
void register_probes() {
  static const bool once = [] {
    ops::register_rule("dtensor_test::linear_relu", [](const ops::OpCall&) {
      return std::vector<ops::DimOption>{{{Replicate{}}, {Replicate{}}},
                                         {{Shard{0}}, {Shard{0}}},
                                         {{Partial{}}, {Partial{}}}};
    });
    // Keeps any shard of its one input: wrong for flip along the sharded dim.
    ops::register_rule("dtensor_test::keeps_shards", [](const ops::OpCall& c) {
      std::vector<ops::DimOption> opts{{{Replicate{}}, {Replicate{}}}};
      for (int64_t d = 0; d < c.inputs[0]->ndim(); ++d) opts.push_back({{Shard{d}}, {Shard{d}}});
      return opts;
    });
    ops::register_rule("dtensor_test::replicated_add", [](const ops::OpCall&) {
      return std::vector<ops::DimOption>{{{Replicate{}}, {Replicate{}, Replicate{}}}};
    });
    return true;
  }();
  (void)once;
}

TEST(StrategyDiscovery, AWrongRuleIsNamedAndAMissingStrategyRankedByWhatItSaves) {
  register_probes();
  SampleGen g(8);
  const auto relu = op("aten::relu", "");
  const OpSample x("x", {g.tensor({8, 4})});
  const SampleDiscovery d = discover_strategies(relu, x, {});
  const RuleJudgement wrong = judge_rule(relu, x, d, "dtensor_test::linear_relu");
  EXPECT_TRUE(wrong.has_rule);
  EXPECT_EQ(strings(wrong.wrong), std::vector<std::string>{"(P(sum)) -> (P(sum))"});
  EXPECT_GT(wrong.confirmed, 0u);

  const auto add = op("aten::add", "Tensor");
  const OpSample ab("ab", {g.tensor({8, 4}), g.tensor({8, 4})});
  const SampleDiscovery da = discover_strategies(add, ab, {});
  const RuleJudgement replicated = judge_rule(add, ab, da, "dtensor_test::replicated_add");
  EXPECT_TRUE(replicated.wrong.empty()) << strings(replicated.wrong)[0];
  std::vector<std::string> missing;
  for (const auto& m : replicated.missing) {
    missing.push_back(m.strategy.to_string());
    EXPECT_GT(m.saved, 0) << m.strategy.to_string();
  }
  for (const char* s : {"(S(0), S(0)) -> (S(0))", "(S(1), S(1)) -> (S(1))", "(P(sum), P(sum)) -> (P(sum))"})
    EXPECT_NE(std::find(missing.begin(), missing.end(), s), missing.end()) << s;
  // (R, R) -> (R) is the rule's own: not missing.
  EXPECT_EQ(std::find(missing.begin(), missing.end(), "(R, R) -> (R)"), missing.end());
}

// What the rule chooses for each combination (the report's "ours" beside PyTorch's DTensor):
// the probe's Partial pass-through is chosen and wrong; mm's own choices are valid, free where
// the inputs already fit and paid for where they do not.
TEST(StrategyDiscovery, TheRuleChoiceForEachCombinationIsJudged) {
  register_probes();
  SampleGen g(10);
  auto choice = [](const RuleJudgement& j, const Names& inputs) -> const RuleJudgement::Choice* {
    for (const auto& c : j.choices) {
      Names names;
      for (const auto& p : c.inputs) names.push_back(placement_label(p));
      if (names == inputs) return &c;
    }
    ADD_FAILURE() << "no choice for the combination";
    return nullptr;
  };
  auto labels = [](const std::vector<Placement>& ps) {
    Names out;
    for (const auto& p : ps) out.push_back(placement_label(p));
    return out;
  };
  const auto relu = op("aten::relu", "");
  const OpSample x("x", {g.tensor({8, 4})});
  const SampleDiscovery d = discover_strategies(relu, x, {});
  const RuleJudgement probe = judge_rule(relu, x, d, "dtensor_test::linear_relu");
  EXPECT_EQ(probe.choices.size(), d.combinations.size());
  const auto* partial = choice(probe, {"P(sum)"});
  ASSERT_NE(partial, nullptr);
  EXPECT_EQ(partial->status, "wrong");
  EXPECT_EQ(labels(partial->outputs), Names{"P(sum)"});
  const auto* row = choice(probe, {"S(0)"});
  ASSERT_NE(row, nullptr);
  EXPECT_EQ(row->status, "ok");
  EXPECT_EQ(row->cost, 0);
  EXPECT_EQ(row->collectives, 0);
  const auto* column = choice(probe, {"S(1)"});  // not offered: redistributed
  ASSERT_NE(column, nullptr);
  EXPECT_EQ(column->status, "ok");
  EXPECT_GT(column->cost, 0);
  EXPECT_EQ(column->collectives, 1);

  const auto mm = op("aten::mm", "");
  const OpSample ab("ab", {g.tensor({8, 4}), g.tensor({4, 6})});
  const SampleDiscovery dm = discover_strategies(mm, ab, {});
  const RuleJudgement own = judge_rule(mm, ab, dm);
  EXPECT_EQ(own.choices.size(), dm.combinations.size());
  for (const auto& c : own.choices) EXPECT_EQ(c.status, "ok") << labels(c.inputs)[0] << ", " << labels(c.inputs)[1];
  const auto* rows = choice(own, {"S(0)", "R"});
  ASSERT_NE(rows, nullptr);
  EXPECT_EQ(labels(rows->outputs), Names{"S(0)"});
  EXPECT_EQ(rows->cost, 0);
  const auto* contract = choice(own, {"S(1)", "S(0)"});
  ASSERT_NE(contract, nullptr);
  EXPECT_EQ(labels(contract->outputs), Names{"P(sum)"});
  EXPECT_EQ(contract->cost, 0);
  const auto* mismatched = choice(own, {"S(1)", "R"});
  ASSERT_NE(mismatched, nullptr);
  EXPECT_GT(mismatched->cost, 0);
}

// ---- choices on a mesh of several dims ----------------------------------------------------------

// mm's choices on 2-D and 3-D meshes, uneven ones included, are valid; the probe claiming relu
// is linear is caught wherever a Partial(sum) reaches it; a layout no rule covers is counted.
TEST(StrategyDiscovery, ChoicesOnMeshesOfSeveralDimsAreRunAndChecked) {
  register_probes();
  SampleGen g(11);
  const auto mm = op("aten::mm", "");
  const OpSample ab("ab", {g.tensor({6, 4}), g.tensor({4, 5})});
  for (const std::vector<int64_t>& mesh : {std::vector<int64_t>{2, 2}, {3, 2}, {2, 2, 2}}) {
    MeshCheckOptions o;
    o.mesh_shape = mesh;
    o.combinations = 200;
    const MeshJudgement j = judge_rule_on_mesh(mm, ab, o);
    EXPECT_TRUE(j.has_rule);
    EXPECT_GT(j.checked, 100u);
    EXPECT_TRUE(j.wrong.empty()) << j.wrong[0];
  }
  const auto relu = op("aten::relu", "");
  const OpSample x("x", {g.tensor({4, 6})});
  MeshCheckOptions o;  // 2x2: 49 layouts of one tensor, every one visited
  o.combinations = 64;
  const MeshJudgement probe = judge_rule_on_mesh(relu, x, o, "dtensor_test::linear_relu");
  EXPECT_EQ(probe.checked, 49u + 2);  // and the two strided layouts
  EXPECT_EQ(probe.strided, 2u);
  ASSERT_FALSE(probe.wrong.empty());
  for (const auto& w : probe.wrong) EXPECT_NE(w.find("P(sum)"), std::string::npos) << w;
  EXPECT_NE(std::find_if(probe.wrong.begin(), probe.wrong.end(),
                         [](const std::string& w) {
                           return w.rfind("([P(sum), R]) chooses ([P(sum), R]) -> ([P(sum), R]): output 0 has other values",
                                          0) == 0;
                         }),
            probe.wrong.end());
  const MeshJudgement own = judge_rule_on_mesh(relu, x, o);
  EXPECT_TRUE(own.wrong.empty()) << own.wrong[0];
  EXPECT_EQ(judge_rule_on_mesh(op("aten::add_", "Tensor"), OpSample("x", {g.tensor({4}), g.tensor({4})}), o).skipped,
            "the op writes an argument (in-place or out=)");
}

// Strided layouts (FSDP over tensor parallel): what a DTensor call runs for them -- relabelled
// as plain shards or not (NOTE: [Ops on strided shards]) -- is run on the box each rank holds
// and checked; a rule keeping a shard that flip reverses is caught on them too.
TEST(StrategyDiscovery, StridedLayoutsAreRunOnTheBoxEachRankHolds) {
  register_probes();
  SampleGen g(12);
  MeshCheckOptions o;  // 2x2, the strided layouts only
  o.combinations = 0;
  const MeshJudgement add = judge_rule_on_mesh(op("aten::add", "Tensor"), OpSample("ab", {g.tensor({8, 4}), g.tensor({8, 4})}), o);
  EXPECT_EQ(add.checked, 6u);  // each tensor on each dim, and both on each dim
  EXPECT_EQ(add.strided, 6u);
  EXPECT_TRUE(add.wrong.empty()) << add.wrong[0];
  const MeshJudgement sum = judge_rule_on_mesh(op("aten::sum", ""), OpSample("all", {g.tensor({7, 4})}), o);
  EXPECT_EQ(sum.strided, 2u);
  EXPECT_TRUE(sum.wrong.empty()) << sum.wrong[0];
  const auto flip = op("aten::flip", "");
  const OpSample rows("rows", {g.tensor({8, 4}), c10::IValue(std::vector<int64_t>{0})});
  const MeshJudgement own = judge_rule_on_mesh(flip, rows, o);
  EXPECT_EQ(own.strided, 2u);
  EXPECT_TRUE(own.wrong.empty()) << own.wrong[0];
  const MeshJudgement probe = judge_rule_on_mesh(flip, rows, o, "dtensor_test::keeps_shards");
  ASSERT_EQ(probe.wrong.size(), 1u);
  EXPECT_EQ(probe.wrong[0],
            "([_S(0, 2), S(0)]) chooses ([_S(0, 2), S(0)]) -> ([_S(0, 2), S(0)]): output 0 on rank 0 has other values "
            "than its box");
  // 8 rows on a (3, 2) mesh: (StridedShard(0, 2), Shard(0)) leaves a rank without rows, which
  // the plain layout does not, so the max is not kept Partial for it (before: it was, and amax
  // raised on the empty box).
  o.mesh_shape = {3, 2};
  const MeshJudgement amax = judge_rule_on_mesh(op("aten::amax", ""), OpSample("dim0", {g.tensor({8, 4}), c10::IValue(std::vector<int64_t>{0})}), o);
  EXPECT_EQ(amax.strided, 2u);
  EXPECT_TRUE(amax.wrong.empty()) << amax.wrong[0];
  o.mesh_shape = {2, 3, 2};
  const MeshJudgement three = judge_rule_on_mesh(op("aten::mul", "Tensor"), OpSample("ab", {g.tensor({5, 6}), g.tensor({6})}), o);
  EXPECT_EQ(three.strided, 3u);  // [R, _S(d, 2), S(d)]: the first on dims 0 and 1, the second on dim 0
  EXPECT_TRUE(three.wrong.empty()) << three.wrong[0];
}

// The rules of these ops offer nothing that is not valid.
TEST(StrategyDiscovery, OurRulesForTheseOpsAreNotWrong) {
  SampleGen g(9);
  const std::vector<std::pair<c10::OperatorHandle, OpSample>> cases = {
      {op("aten::add", "Tensor"), OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4})})},
      {op("aten::add", "Tensor"), OpSample("broadcast", {g.tensor({8, 4}), g.tensor({4})})},
      {op("aten::mul", "Tensor"), OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4})})},
      {op("aten::mm", ""), OpSample("even", {g.tensor({8, 4}), g.tensor({4, 6})})},
      {op("aten::relu", ""), OpSample("even", {g.tensor({8, 4})})},
      {op("aten::abs", ""), OpSample("even", {g.tensor({8, 4})})},
      {op("aten::sum", ""), OpSample("all", {g.tensor({8, 4})})},
      {op("aten::amax", ""), OpSample("dim0", {g.tensor({8, 4}), c10::IValue(std::vector<int64_t>{0})})},
      // Its rule kept Partial(min) and Partial(max), which a complex value cannot have.
      {op("aten::view_as_complex", ""), OpSample("pairs", {g.tensor({8, 2})})},
      // NOTE: [Partial(max) and Partial(min) through monotone ops]
      {op("aten::exp", ""), OpSample("even", {g.tensor({8, 4})})},
      {op("aten::neg", ""), OpSample("even", {g.tensor({8, 4})})},
      {op("aten::erfc", ""), OpSample("even", {g.tensor({8, 4})})},
      {op("aten::clamp", ""), OpSample("even", {g.tensor({8, 4}), -0.5, 0.5})},
      {op("aten::clamp", "Tensor"), OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4}), g.tensor({4})})},
      {op("aten::maximum", ""), OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4})})},
      {op("aten::minimum", ""), OpSample("broadcast", {g.tensor({8, 4}), g.tensor({4})})},
      {op("aten::add", "Tensor"), OpSample("alpha", {g.tensor({8, 4}), g.tensor({8, 4})}).kw("alpha", -2)},
      {op("aten::sub", "Tensor"), OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4})})},
      {op("aten::rsub", "Tensor"), OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4})})},
      {op("aten::add", "Scalar"), OpSample("even", {g.tensor({8, 4}), 3})},
      {op("aten::mul", "Scalar"), OpSample("negative", {g.tensor({8, 4}), -1.5})},
      {op("aten::div", "Scalar"), OpSample("negative", {g.tensor({8, 4}), -4})},
      {op("aten::leaky_relu", ""), OpSample("negative_slope", {g.tensor({8, 4}), -0.5})},
      {op("aten::logaddexp", ""), OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4})})},
      {op("aten::where", "self"), OpSample("even", {g.tensor({8, 4}).gt(0), g.tensor({8, 4}), g.tensor({8, 4})})},
      {op("aten::masked_fill", "Scalar"), OpSample("even", {g.tensor({8, 4}), g.tensor({8, 4}).gt(0), 2.5})},
  };
  for (int64_t ranks : {2, 4}) {
    for (const auto& [h, sample] : cases) {
      DiscoveryOptions o;
      o.ranks = ranks;
      const SampleDiscovery d = discover_strategies(h, sample, o);
      const RuleJudgement r = judge_rule(h, sample, d);
      EXPECT_TRUE(r.has_rule) << d.op;
      EXPECT_TRUE(r.wrong.empty()) << d.op << " " << sample.variant << " on " << ranks << " ranks: "
                                   << strings(r.wrong)[0];
      EXPECT_GT(r.confirmed, 0u) << d.op;
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace dtensor
