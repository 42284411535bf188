// suites/ops/rules_test.cpp: the placements the matrix and convolution rules choose where the
// op suite only checks values: products keep Partial(avg), a batch-sharded convolution runs
// without communication and gives the data-parallel gradients, channel sharding is taken
// when it is free; the fused attention's refusal of dropout; and the communication-free layouts
// the tensor-parallel rules (embedding, layer norm, softmax, views) keep; the masked gather, the
// Partial mean nll_loss, is_same_size on global shapes, batched linear algebra and _foreach_*;
// plain tensors made by backward formulas.
#include "dtensor/compat.h"
#include "dtensor/ops/registry.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/dtensor_test_base.h"
#include "harness/harness.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/autograd.h>

#include <functional>
#include <limits>
#include <string>

namespace dtensor {
namespace {

using testing::contains;
using testing::error_of;

class MatrixRules : public testing::DTensorOpTestBase {};
class ConvRules : public testing::DTensorOpTestBase {};
class TensorParallelRules : public testing::DTensorOpTestBase {};

at::Tensor values(std::vector<int64_t> shape, double seed) {
  int64_t n = 1;
  for (auto s : shape) n *= s;
  return (at::arange(n, at::kDouble) * 0.37 + seed).sin().reshape(shape);
}

// NOTE: [Matrix products as einsum]: a product is linear in each operand, so a Partial(avg)
// operand against a replicated one gives a Partial(avg) result without communication.
DTENSOR_TEST_F(MatrixRules, ProductsKeepPartialAvg) {
  auto mesh = build_device_mesh();
  const at::Tensor a = values({8, 4}, 1), b = values({4, 6}, 2), bias = values({6}, 3);
  const Partial avg(comm::ReduceOp::AVG);
  at::Tensor pa = detail::redistribute_to_any(distribute_tensor(a, mesh, {Replicate{}}), {avg});
  at::Tensor rb = distribute_tensor(b, mesh, {Replicate{}});
  at::Tensor mm = at::mm(pa, rb);
  EXPECT_EQ(get_spec(mm).placements, std::vector<Placement>{avg});
  EXPECT_TRUE(at::allclose(full_tensor(mm), at::mm(a, b)));
  at::Tensor pbias = detail::redistribute_to_any(distribute_tensor(bias, mesh, {Replicate{}}), {avg});
  at::Tensor addmm = at::addmm(pbias, pa, rb, 0.5, 2);
  EXPECT_EQ(get_spec(addmm).placements, std::vector<Placement>{avg});
  EXPECT_TRUE(at::allclose(full_tensor(addmm), at::addmm(bias, a, b, 0.5, 2)));
}

// NOTE: [A Partial self plus a replicated product]: Partial(avg) through any beta, Partial(max)
// and (min) kept for beta >= 0 and swapped for beta < 0, with no communication; pieces that
// differ by rank (rank k holds the value shifted by -k for max, +k for min) catch a wrong kind.
DTENSOR_TEST_F(MatrixRules, APartialSelfPlusAReplicatedProductStaysPartial) {
  auto mesh = build_device_mesh();
  const at::Tensor a = values({8, 4}, 1), b = values({4, 6}, 2), self = values({8, 6}, 3);
  const at::Tensor ra = distribute_tensor(a, mesh, {Replicate{}}), rb = distribute_tensor(b, mesh, {Replicate{}});
  const Partial avg(comm::ReduceOp::AVG), max(comm::ReduceOp::MAX), min(comm::ReduceOp::MIN);
  const at::Tensor pmax = from_local(self - rank(), mesh, {max}), pmin = from_local(self + rank(), mesh, {min});
  const at::Tensor pavg = detail::redistribute_to_any(distribute_tensor(self, mesh, {Replicate{}}), {avg});
  struct Case {
    const char* what;
    at::Tensor got, want;
    Placement placement;
  };
  testing::CommCounter counting;
  const std::vector<Case> cases = {
      {"max, beta 0.5", at::addmm(pmax, ra, rb, 0.5, 2), at::addmm(self, a, b, 0.5, 2), max},
      {"max, beta -1", at::addmm(pmax, ra, rb, -1), at::addmm(self, a, b, -1), min},
      {"min, beta 1", at::addmm(pmin, ra, rb), at::addmm(self, a, b), min},
      {"avg, beta -2", at::addmm(pavg, ra, rb, -2, 3), at::addmm(self, a, b, -2, 3), avg},
  };
  EXPECT_EQ(counting.collectives(), 0);
  for (const auto& c : cases) {
    EXPECT_EQ(get_spec(c.got).placements, std::vector<Placement>{c.placement}) << c.what;
    EXPECT_TRUE(at::allclose(full_tensor(c.got), c.want)) << c.what;
  }
  // A Partial(sum) self would add the product once per rank: it is reduced (or the product made
  // Partial) instead, and the value is still right.
  const at::Tensor psum = from_local(self / mesh.size(), mesh, {Partial{}});
  EXPECT_TRUE(at::allclose(full_tensor(at::addmm(psum, ra, rb)), at::addmm(self, a, b)));
}

// Row-sharded times column-sharded operands of a contraction give Partial(sum); the batch of
// addbmm is a contraction too.
DTENSOR_TEST_F(MatrixRules, ShardedContractionGivesPartialSum) {
  auto mesh = build_device_mesh();
  const at::Tensor b1 = values({4, 5, 3}, 1), b2 = values({4, 3, 2}, 2), self = values({5, 2}, 3);
  at::Tensor out = at::addbmm(distribute_tensor(self, mesh, {Replicate{}}), distribute_tensor(b1, mesh, {Shard{0}}),
                              distribute_tensor(b2, mesh, {Shard{0}}));
  EXPECT_EQ(get_spec(out).placements, std::vector<Placement>{Partial{}});
  EXPECT_TRUE(at::allclose(full_tensor(out), at::addbmm(self, b1, b2)));
}

// addmv's kernel returns a broadcast self unchanged when mat is empty: a rank whose shard of
// the contraction (or of the rows) is empty must not run it, or its piece has self's shape.
DTENSOR_TEST_F(MatrixRules, AddmvWithABroadcastSelfAvoidsEmptyPiecesOfMat) {
  auto mesh = build_device_mesh();
  const int64_t n = mesh.size(0), k = std::max<int64_t>(1, n / 2);  // ranks k.. hold no column of mat
  const at::Tensor self = values({1}, 1), mat = values({8, k}, 2), vec = values({k}, 3);
  at::Tensor out = at::addmv(distribute_tensor(self, mesh, {Partial{}}), distribute_tensor(mat, mesh, {Shard{1}}),
                             distribute_tensor(vec, mesh, {Shard{0}}));
  EXPECT_EQ(to_local(out).sizes(), c10::IntArrayRef(compute_local_shape({8}, mesh, get_spec(out).placements)));
  EXPECT_TRUE(at::allclose(full_tensor(out), at::addmv(self, mat, vec)));
  const at::Tensor tall = values({n / 2 + 1, 3}, 4), v3 = values({3}, 5);  // some ranks hold no row
  out = at::addmv(distribute_tensor(self, mesh, {Replicate{}}), distribute_tensor(tall, mesh, {Shard{0}}),
                  distribute_tensor(v3, mesh, {Replicate{}}));
  EXPECT_EQ(to_local(out).sizes(), c10::IntArrayRef(compute_local_shape({n / 2 + 1}, mesh, get_spec(out).placements)));
  EXPECT_TRUE(at::allclose(full_tensor(out), at::addmv(self, tall, v3)));
}

// The fused attention kernel (no grad) would draw its dropout mask from each rank's default
// generator: refused with what to do instead.
DTENSOR_TEST_F(MatrixRules, FusedAttentionRefusesDropout) {
  auto mesh = build_device_mesh();
  auto qkv = [&] { return distribute_tensor(at::ones({2, 4, 8, 4}), mesh, {Shard{1}}); };
  at::Tensor q = qkv(), k = qkv(), v = qkv();
  // 1.13: the rule refuses; 2.x: the CPU flash kernel itself has no dropout (its shape check fails).
  const std::string err = error_of([&] { compat::sdpa_fused(q, k, v, {}, 0.5, false); });
  EXPECT_PRED2(contains, err, compat::kSdpaFusedOp);
  EXPECT_PRED2(contains, err, DTENSOR_TORCH_2 ? "dropout > 0" : "with dropout_p = 0.5 would draw its dropout mask");
  auto out = compat::scaled_dot_product_attention(q, k, v, {}, 0.0, false);
  EXPECT_EQ(get_spec(out).placements, std::vector<Placement>{Shard{1}});
}

// The data-parallel convolution: input Shard(0), weight and bias replicated -> output
// Shard(0), no communication; backward: grad_input Shard(0), weight/bias gradients Partial.
DTENSOR_TEST_F(ConvRules, BatchShardedInputRunsLocallyWithDataParallelGradients) {
  auto mesh = build_device_mesh();
  const at::Tensor x = values({6, 3, 5, 5}, 1), w = values({4, 3, 3, 3}, 2), b = values({4}, 3);
  at::Tensor dx = distribute_tensor(x, mesh, {Shard{0}}).requires_grad_(true);
  at::Tensor dw = distribute_tensor(w, mesh, {Replicate{}}).requires_grad_(true);
  at::Tensor db = distribute_tensor(b, mesh, {Replicate{}}).requires_grad_(true);
  at::Tensor out = at::conv2d(dx, dw, db, 1, 1);
  EXPECT_EQ(get_spec(out).placements, std::vector<Placement>{Shard{0}});
  at::Tensor px = x.clone().requires_grad_(true), pw = w.clone().requires_grad_(true), pb = b.clone().requires_grad_(true);
  at::Tensor expected = at::conv2d(px, pw, pb, 1, 1);
  EXPECT_TRUE(at::allclose(full_tensor(out), expected));
  const at::Tensor grad = values(expected.sizes().vec(), 4);
  auto grads = torch::autograd::grad({out}, {dx, dw, db}, {distribute_tensor(grad, mesh, {Shard{0}})});
  auto plain = torch::autograd::grad({expected}, {px, pw, pb}, {grad});
  EXPECT_EQ(get_spec(grads[0]).placements, std::vector<Placement>{Shard{0}});
  EXPECT_EQ(get_spec(grads[1]).placements, std::vector<Placement>{Partial{}});
  EXPECT_EQ(get_spec(grads[2]).placements, std::vector<Placement>{Partial{}});
  for (size_t i = 0; i < 3; ++i) EXPECT_TRUE(at::allclose(full_tensor(grads[i]), plain[i])) << "gradient " << i;
}

// Output-channel sharding (weight and bias Shard(0), input replicated) -> output Shard(1);
// with too few channels for every rank (n - 1 channels on n ranks) it is not taken (libtorch
// mis-shapes a convolution without channels), and the weight is gathered instead.
DTENSOR_TEST_F(ConvRules, ChannelShardingOnlyWhenEveryRankHasChannels) {
  auto mesh = build_device_mesh();
  const at::Tensor x = values({2, 3, 5, 5}, 1);
  const int64_t enough = 2 * ranks(), too_few = ranks() - 1;
  for (int64_t c_out : {enough, too_few}) {
    SCOPED_TRACE(c_out);
    const at::Tensor w = values({c_out, 3, 3, 3}, 2);
    at::Tensor out = at::conv2d(distribute_tensor(x, mesh, {Replicate{}}), distribute_tensor(w, mesh, {Shard{0}}));
    EXPECT_EQ(get_spec(out).placements, std::vector<Placement>{c_out == enough ? Placement(Shard{1}) : Replicate{}});
    EXPECT_TRUE(at::allclose(full_tensor(out), at::conv2d(x, w)));
  }
}

// The strategies that avoid communication are the ones chosen.
DTENSOR_TEST_F(TensorParallelRules, ChooseCommunicationFreeLayouts) {
  auto mesh = build_device_mesh();
  const at::Tensor w = values({10, 4}, 1), idx = (at::arange(6, at::kLong) * 3 + 1).remainder(10).view({2, 3});
  auto placements = [](const at::Tensor& t) { return to_string(get_spec(t).placements); };
  at::Tensor rep_idx = distribute_tensor(idx, mesh, {Replicate{}});
  // Row-sharded table: Partial output; its gradient comes back Shard(0).
  at::Tensor row_w = distribute_tensor(w, mesh, {Shard{0}}).requires_grad_(true);
  at::Tensor out = at::embedding(row_w, rep_idx);
  EXPECT_EQ(placements(out), "(Partial(sum),)");
  redistribute(out, {Replicate{}}).sum().backward();
  EXPECT_EQ(placements(row_w.grad()), "(Shard(dim=0),)");
  // Column-sharded table: output sharded on its last dim.
  EXPECT_EQ(placements(at::embedding(distribute_tensor(w, mesh, {Shard{1}}), rep_idx)), "(Shard(dim=2),)");
  // Sequence-sharded LayerNorm input keeps its layout; weight gradients are Partial.
  at::Tensor x = distribute_tensor(values({2, 8, 6}, 2), mesh, {Shard{1}}).requires_grad_(true);
  at::Tensor ln_w = distribute_tensor(values({6}, 3), mesh, {Replicate{}}).requires_grad_(true);
  at::Tensor y = at::layer_norm(x, {6}, ln_w, {});
  EXPECT_EQ(placements(y), "(Shard(dim=1),)");
  y.sum().backward();
  EXPECT_EQ(placements(x.grad()), "(Shard(dim=1),)");
  EXPECT_EQ(placements(ln_w.grad()), "(Partial(sum),)");
  // Viewing through size-1 dims keeps the shard.
  at::Tensor b = distribute_tensor(values({1, 1, 8}, 5), mesh, {Shard{2}});
  EXPECT_EQ(placements(b.view({8})), "(Shard(dim=0),)");
  EXPECT_EQ(placements(b.view({8}).view({1, 8, 1})), "(Shard(dim=1),)");
  // Softmax over the sharded dim gathers; over another dim it does not.
  at::Tensor s = distribute_tensor(values({4, 8}, 4), mesh, {Shard{0}});
  EXPECT_EQ(placements(s.softmax(1)), "(Shard(dim=0),)");
  EXPECT_EQ(placements(s.softmax(0)), "(Replicate(),)");
}

// NOTE: [Propagation cache keys are exact] (dtensor/ops/propagation_cache.cpp): calls that differ only in
// a non-DTensor argument get their own strategies. A Scalar argument True and one of 8 hashed
// alike in the old key (a bool's hash was its value + 7), as did a causal and a non-causal
// attention call on libtorch 2.6 (Ops.Matrix1D); a probe rule whose choice depends on that
// argument shows which strategy each call gets.
class PropagationCache : public testing::DTensorOpTestBase {};

DTENSOR_TEST_F(PropagationCache, CallsThatDifferOnlyInAScalarGetTheirOwnStrategy) {
  auto mesh = build_device_mesh();
  static const bool probe_registered = [] {
    ops::register_rule("dtensor_test::cache_probe", [](const ops::OpCall& c) {
      const bool shard = c.args[1].value.isBool();
      return std::vector<ops::DimOption>{{{shard ? Placement(Shard{0}) : Placement(Replicate{})}, {Replicate{}}}};
    });
    return true;
  }();
  (void)probe_registered;
  const auto& schema = c10::Dispatcher::singleton().findSchemaOrThrow("aten::mul", "Scalar").schema();
  const TensorMeta meta{{8}, {1}, at::kFloat};
  const DTensorSpec spec(mesh, {Replicate{}}, meta);
  auto strategy = [&](c10::IValue scalar) {
    ops::OpCall call;
    call.name = "dtensor_test::cache_probe";
    call.schema = &schema;
    call.mesh = &mesh;
    call.args.resize(2);
    call.args[0].kind = ops::ArgInfo::Kind::kDTensor;
    call.args[0].spec = spec;
    call.args[1].value = std::move(scalar);
    call.inputs.push_back(&*call.args[0].spec);
    return to_string(ops::propagate(call, [&] { return std::vector<TensorMeta>{meta}; }).outputs[0]);
  };
  EXPECT_EQ(strategy(true), "(Shard(dim=0),)");
  EXPECT_EQ(strategy(int64_t{8}), "(Replicate(),)");
  EXPECT_EQ(strategy(true), "(Shard(dim=0),)");
  EXPECT_EQ(strategy(8.0), "(Replicate(),)");
}

// ---- the rules of PyTorch's strategies that had none here ------------------------------------

class LossAndIndexRules : public testing::DTensorOpTestBase {};

// NOTE: [Gather from a sharded dim]: a replicated index into a tensor sharded on the gathered
// dim gives a Partial(sum) (no collective: nothing was redistributed), uneven and empty shards
// included ([6] rows on 4 ranks: 2, 2, 2, 0).
DTENSOR_TEST_F(LossAndIndexRules, GatherFromTheShardedDimIsAMaskedPartial) {
  auto mesh = build_device_mesh();
  for (int64_t rows : {8, 6}) {
    const at::Tensor self = values({rows, 4}, 1);
    const at::Tensor index = (at::arange(12, at::kLong) * 5).remainder(rows).view({3, 4});
    at::Tensor out = at::gather(distribute_tensor(self, mesh, {Shard{0}}), 0, distribute_tensor(index, mesh, {Replicate{}}));
    EXPECT_EQ(get_spec(out).placements, std::vector<Placement>{Partial{}}) << rows << " rows";
    EXPECT_TRUE(at::equal(full_tensor(out), at::gather(self, 0, index))) << rows << " rows";
  }
}

// NOTE: [Adding rows split along the scattered dim]: the embedding gradient of a batch split
// across ranks (index_add / scatter_add of batch-sharded rows into a replicated table) stays a
// Partial(sum) with no collective, uneven rows included.
DTENSOR_TEST_F(LossAndIndexRules, AddingRowsSplitAlongTheScatteredDimGivesAPartialSum) {
  auto mesh = build_device_mesh();
  for (int64_t rows : {8, 6}) {
    const at::Tensor table = values({5, 4}, 7);
    const at::Tensor index = (at::arange(rows, at::kLong) * 3).remainder(5);
    const at::Tensor grad = values({rows, 4}, 8);
    at::Tensor t = distribute_tensor(table, mesh, {Replicate{}});
    at::Tensor out = at::index_add(t, 0, distribute_tensor(index, mesh, {Shard{0}}), distribute_tensor(grad, mesh, {Shard{0}}));
    EXPECT_EQ(get_spec(out).placements, std::vector<Placement>{Partial{}}) << rows << " rows";
    EXPECT_TRUE(at::allclose(full_tensor(out), at::index_add(table, 0, index, grad))) << rows << " rows";
    const at::Tensor index2d = index.unsqueeze(1).expand({rows, 4}).contiguous();
    out = at::scatter_add(t, 0, distribute_tensor(index2d, mesh, {Shard{0}}), distribute_tensor(grad, mesh, {Shard{0}}));
    EXPECT_EQ(get_spec(out).placements, std::vector<Placement>{Partial{}}) << rows << " rows";
    EXPECT_TRUE(at::allclose(full_tensor(out), at::scatter_add(table, 0, index2d, grad))) << rows << " rows";
  }
}

// A plain tensor written in place among DTensors keeps its layout, so the write lands in its
// own storage: cummax's backward formula is zeros(input.sizes()).scatter_add_(dim, indices,
// grad), with the indices and grad sharded on another dim; scatter_add_ may re-lay out a
// DTensor it writes, which for a plain tensor lost the write (wrong gradients of cummax).
DTENSOR_TEST_F(LossAndIndexRules, APlainTensorWrittenInPlaceReceivesTheWrite) {
  auto mesh = build_device_mesh();
  const at::Tensor index = (at::arange(32, at::kLong) * 7).remainder(8).view({8, 4});
  const at::Tensor src = values({8, 4}, 4);
  at::Tensor result = at::zeros({8, 4}, src.options());
  {
    ImplicitReplicationGuard replicate_plain_tensors;
    result.scatter_add_(0, distribute_tensor(index, mesh, {Shard{1}}), distribute_tensor(src, mesh, {Shard{1}}));
  }
  EXPECT_TRUE(at::allclose(result, at::zeros({8, 4}, src.options()).scatter_add_(0, index, src)));
  // And through autograd: the gradient of cummax over rows of a column-sharded input.
  const at::Tensor plain = values({8, 4}, 5).requires_grad_(true);
  const at::Tensor grad = values({8, 4}, 6);
  std::get<0>(at::cummax(plain, 0)).backward(grad);
  at::Tensor x = distribute_tensor(plain.detach(), mesh, {Shard{1}}).requires_grad_(true);
  std::get<0>(at::cummax(x, 0)).backward(distribute_tensor(grad, mesh, {Shard{1}}));
  EXPECT_TRUE(at::allclose(full_tensor(x.grad()), plain.grad()));
}

// NOTE: [Mean nll_loss stays Partial]: batch-sharded scores and targets give a Partial loss and
// the replicated global total weight, exact with class weights, an ignored class and uneven
// rows; the gradient stays sharded like the scores.
DTENSOR_TEST_F(LossAndIndexRules, MeanNllLossOnBatchShardsStaysPartial) {
  auto mesh = build_device_mesh();
  const at::Tensor scores = values({7, 5}, 2).log_softmax(1), weight = values({5}, 3).abs() + 0.5;
  const at::Tensor target = (at::arange(7, at::kLong) * 3).remainder(5);
  at::Tensor x = distribute_tensor(scores, mesh, {Shard{0}}).requires_grad_(true);
  at::Tensor t = distribute_tensor(target, mesh, {Shard{0}});
  at::Tensor w = distribute_tensor(weight, mesh, {Replicate{}});
  auto [loss, total_weight] = at::nll_loss_forward(x, t, w, /*mean*/ 1, /*ignore_index*/ 2);
  EXPECT_EQ(get_spec(loss).placements, std::vector<Placement>{Partial{}});
  EXPECT_EQ(get_spec(total_weight).placements, std::vector<Placement>{Replicate{}});
  auto [ref, ref_total] = at::nll_loss_forward(scores, target, weight, 1, 2);
  EXPECT_TRUE(at::allclose(full_tensor(loss), ref));
  EXPECT_TRUE(at::allclose(full_tensor(total_weight), ref_total));
  at::Tensor l = at::nll_loss(x, t, w, 1, 2);
  EXPECT_EQ(get_spec(l).placements, std::vector<Placement>{Partial{}});
  l.backward();
  EXPECT_EQ(get_spec(x.grad()).placements, std::vector<Placement>{Shard{0}});
  at::Tensor xs = scores.clone().requires_grad_(true);
  at::nll_loss(xs, target, weight, 1, 2).backward();
  EXPECT_TRUE(at::allclose(full_tensor(x.grad()), xs.grad()));
}

// nll_loss_forward.output / nll_loss2d_forward.output have rules (the functional's kernel rule
// does not serve them): out= tensors laid out as the functional's outputs (Partial loss,
// replicated total weight) are written without communicating the scores; replicated ones too.
DTENSOR_TEST_F(LossAndIndexRules, NllLossForwardOutWritesBothOutTensors) {
  auto mesh = build_device_mesh();
  const at::Tensor scores = values({6, 5, 3, 2}, 2).log_softmax(1), weight = values({5}, 3).abs() + 0.5;
  const at::Tensor target = (at::arange(36, at::kLong) * 3).remainder(5).reshape({6, 3, 2});
  at::Tensor x = distribute_tensor(scores, mesh, {Shard{0}});
  at::Tensor t = distribute_tensor(target, mesh, {Shard{0}});
  at::Tensor w = distribute_tensor(weight, mesh, {Replicate{}});
  const std::vector<Placement> rep{Replicate{}}, partial{Partial{}};
  for (const int64_t reduction : {1, 2}) {
    auto [ref, ref_total] = at::nll_loss2d_forward(scores, target, weight, reduction, /*ignore_index*/ 2);
    for (const bool keep_partial : {true, false}) {
      const std::vector<Placement>& loss_placement = keep_partial ? partial : rep;
      const std::vector<Placement>& total_placement = keep_partial && reduction == 2 ? partial : rep;
      at::Tensor loss = detail::redistribute_to_any(distribute_tensor(at::zeros({}, at::kDouble), mesh, rep), loss_placement);
      at::Tensor total =
          detail::redistribute_to_any(distribute_tensor(at::zeros({}, at::kDouble), mesh, rep), total_placement);
      auto [rl, rt] = at::nll_loss2d_forward_out(loss, total, x, t, w, reduction, 2);
      const std::string what = "reduction " + std::to_string(reduction) + (keep_partial ? ", Partial" : ", replicated");
      EXPECT_TRUE(rl.is_same(loss) && rt.is_same(total)) << what;
      EXPECT_EQ(get_spec(loss).placements, loss_placement) << what;
      EXPECT_EQ(get_spec(total).placements, total_placement) << what;
      EXPECT_TRUE(at::allclose(full_tensor(loss), ref)) << what;
      EXPECT_TRUE(at::allclose(full_tensor(total), ref_total)) << what;
    }
  }
  // The 1-D form, mean reduction on batch shards.
  const at::Tensor s1 = values({7, 5}, 4).log_softmax(1), t1 = (at::arange(7, at::kLong) * 3).remainder(5);
  at::Tensor loss = detail::redistribute_to_any(distribute_tensor(at::zeros({}, at::kDouble), mesh, rep), partial);
  at::Tensor total = distribute_tensor(at::zeros({}, at::kDouble), mesh, rep);
  at::nll_loss_forward_out(loss, total, distribute_tensor(s1, mesh, {Shard{0}}), distribute_tensor(t1, mesh, {Shard{0}}),
                           w, 1, 2);
  auto [ref, ref_total] = at::nll_loss_forward(s1, t1, weight, 1, 2);
  EXPECT_TRUE(at::allclose(full_tensor(loss), ref));
  EXPECT_TRUE(at::allclose(full_tensor(total), ref_total));
}

// is_same_size compares the global shapes: [7, 4] and [6, 4] shard to the same local shapes on
// the first ranks, and equal tensors on different placements have different local shapes.
DTENSOR_TEST_F(LossAndIndexRules, IsSameSizeComparesGlobalShapes) {
  auto mesh = build_device_mesh();
  at::Tensor a = distribute_tensor(values({7, 4}, 1), mesh, {Shard{0}});
  at::Tensor b = distribute_tensor(values({6, 4}, 2), mesh, {Shard{0}});
  at::Tensor c = distribute_tensor(values({7, 4}, 3), mesh, {Replicate{}});
  EXPECT_FALSE(a.is_same_size(b));
  EXPECT_TRUE(a.is_same_size(c));
  EXPECT_EQ(get_spec(a).placements, std::vector<Placement>{Shard{0}});
}

class LinalgRules : public testing::DTensorOpTestBase {};

// A batch of matrices sharded on the batch dim decomposes with no communication; the solves
// keep a Partial right-hand side Partial.
DTENSOR_TEST_F(LinalgRules, BatchShardsStayShardedAndSolvesKeepPartial) {
  auto mesh = build_device_mesh();
  const at::Tensor a = values({4, 5, 3}, 1);
  auto [u, s, vh] = at::_linalg_svd(distribute_tensor(a, mesh, {Shard{0}}), false, true);
  for (const at::Tensor& r : {u, s, vh}) EXPECT_EQ(get_spec(r).placements, std::vector<Placement>{Shard{0}});
  auto ref = at::_linalg_svd(a, false, true);
  EXPECT_TRUE(at::allclose(full_tensor(s), std::get<1>(ref)));
  EXPECT_TRUE(at::allclose(full_tensor(u), std::get<0>(ref)));
  const at::Tensor m = values({3, 3}, 2) + at::eye(3, at::kDouble) * 3, rhs = values({3, 2}, 3);
  const Partial avg(comm::ReduceOp::AVG);
  at::Tensor prhs = detail::redistribute_to_any(distribute_tensor(rhs, mesh, {Replicate{}}), {avg});
  at::Tensor x = at::linalg_solve(distribute_tensor(m, mesh, {Replicate{}}), prhs);
  EXPECT_EQ(get_spec(x).placements, std::vector<Placement>{avg});
  EXPECT_TRUE(at::allclose(full_tensor(x), at::linalg_solve(m, rhs)));
  // A singular matrix in the last rank's shard raises on every rank (info is replicated).
  at::Tensor singular = values({4, 3, 3}, 4);
  singular[3].zero_();
  EXPECT_PRED2(contains, error_of([&] { at::linalg_inv(distribute_tensor(singular, mesh, {Shard{0}})); }), "singular");
}

// cholesky / cholesky_inverse have no meta kernel in libtorch 1.13 and refuse the zero-filled
// stand-ins: their output shapes come from identity stand-ins, and batch shards stay sharded.
// aten::cholesky itself (deprecated since 1.9) is gone from today's libtorch: called through
// the dispatcher where it exists, skipped with the reason where it does not.
// NOTE: [In-place list ops]: _foreach_add_ writes every element of its list in place (it
// returns nothing); each keeps its placements, whatever the other list's are.
DTENSOR_TEST_F(LinalgRules, InPlaceListOpsWriteEveryElementWhereItIs) {
  auto mesh = build_device_mesh();
  std::vector<at::Tensor> plain{values({8, 4}, 1), values({5, 6}, 2), values({6}, 3)};
  const std::vector<at::Tensor> other{values({8, 4}, 4), values({5, 6}, 5), values({6}, 6)};
  std::vector<at::Tensor> self{distribute_tensor(plain[0], mesh, {Shard{0}}), distribute_tensor(plain[1], mesh, {Shard{1}}),
                               distribute_tensor(plain[2], mesh, {Replicate{}})};
  const std::vector<at::Tensor> others{distribute_tensor(other[0], mesh, {Replicate{}}),
                                       distribute_tensor(other[1], mesh, {Shard{1}}),
                                       distribute_tensor(other[2], mesh, {Shard{0}})};
  at::_foreach_add_(self, others, 2);
  at::_foreach_add_(plain, other, 2);
  const std::vector<std::vector<Placement>> kept{{Shard{0}}, {Shard{1}}, {Replicate{}}};
  for (size_t i = 0; i < self.size(); ++i) {
    EXPECT_EQ(get_spec(self[i]).placements, kept[i]) << "element " << i;
    EXPECT_TRUE(at::allclose(full_tensor(self[i]), plain[i])) << "element " << i;
  }
  at::_foreach_zero_(self);
  for (const auto& t : self) EXPECT_EQ(full_tensor(t).abs().sum().item<double>(), 0.0);
}

DTENSOR_TEST_F(LinalgRules, CholeskyAndItsInverseKeepBatchShards) {
  auto cholesky_op = c10::Dispatcher::singleton().findSchema({"aten::cholesky", ""});
  if (!cholesky_op)
    GTEST_SKIP() << "libtorch " << compat::kTorchVersion << " has no aten::cholesky (removed upstream)";
  auto cholesky = [&](const at::Tensor& t) {
    return cholesky_op->typed<at::Tensor(const at::Tensor&, bool)>().call(t, false);
  };
  auto mesh = build_device_mesh();
  const at::Tensor a = values({4, 3, 3}, 1);
  const at::Tensor spd = at::matmul(a, a.transpose(-2, -1)) + at::eye(3, at::kDouble) * 3;
  const at::Tensor l = cholesky(distribute_tensor(spd, mesh, {Shard{0}}));
  EXPECT_EQ(get_spec(l).placements, std::vector<Placement>{Shard{0}});
  EXPECT_TRUE(at::allclose(full_tensor(l), cholesky(spd)));
  const at::Tensor inv = at::cholesky_inverse(l);
  EXPECT_EQ(get_spec(inv).placements, std::vector<Placement>{Shard{0}});
  EXPECT_TRUE(at::allclose(full_tensor(inv), at::cholesky_inverse(cholesky(spd))));
}

// NOTE: [svd without U and V] (composite_ops.cpp): with compute_uv=false, U and V are DTensors
// of zeros (libtorch's composite made them plain tensors), and S is linalg_svdvals'; with
// compute_uv, the decomposition's values and shards. Plain tensors are unchanged.
DTENSOR_TEST_F(LinalgRules, SvdWithoutUAndVGivesDTensorZeros) {
  auto mesh = build_device_mesh();
  const at::Tensor a = values({4, 5, 3}, 1);
  const at::Tensor da = distribute_tensor(a, mesh, {Shard{0}});
  for (const bool some : {true, false}) {
    const auto plain = at::svd(a, some, /*compute_uv=*/false);
    const auto sharded = at::svd(da, some, /*compute_uv=*/false);
    ASSERT_TRUE(is_dtensor(std::get<0>(sharded)) && is_dtensor(std::get<2>(sharded))) << "some=" << some;
    EXPECT_EQ(get_spec(std::get<1>(sharded)).placements, std::vector<Placement>{Shard{0}});
    for (int i = 0; i < 3; ++i) {
      const at::Tensor got = full_tensor(i == 0 ? std::get<0>(sharded) : i == 1 ? std::get<1>(sharded) : std::get<2>(sharded));
      const at::Tensor want = i == 0 ? std::get<0>(plain) : i == 1 ? std::get<1>(plain) : std::get<2>(plain);
      EXPECT_EQ(got.sizes(), want.sizes()) << "output " << i << ", some=" << some;
      EXPECT_TRUE(at::allclose(got, want)) << "output " << i << ", some=" << some;
    }
  }
  const auto plain = at::svd(a);
  const auto sharded = at::svd(da);
  EXPECT_EQ(get_spec(std::get<0>(sharded)).placements, std::vector<Placement>{Shard{0}});
  EXPECT_TRUE(at::allclose(full_tensor(std::get<0>(sharded)), std::get<0>(plain)));
  EXPECT_TRUE(at::allclose(full_tensor(std::get<1>(sharded)), std::get<1>(plain)));
  EXPECT_TRUE(at::allclose(full_tensor(std::get<2>(sharded)), std::get<2>(plain)));
  EXPECT_FALSE(is_dtensor(std::get<0>(plain)));
}

// NOTE: [Inf norm of an empty shard] (reduction_rules.cpp): an inf norm over a dim with an
// empty shard (5 rows on 4 ranks: 2, 2, 1, 0) stays Partial(max); _foreach_norm's does when
// no shard is empty.
DTENSOR_TEST_F(LinalgRules, InfNormsStayPartialMax) {
  auto mesh = build_device_mesh();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<Placement> pmax{Partial(comm::ReduceOp::MAX)};
  const at::Tensor a = values({5, 6}, 1);
  const at::Tensor da = distribute_tensor(a, mesh, {Shard{0}});
  const at::Tensor whole = at::linalg_vector_norm(da, inf);
  EXPECT_EQ(get_spec(whole).placements, pmax);
  EXPECT_TRUE(at::allclose(full_tensor(whole), at::linalg_vector_norm(a, inf)));
  const at::Tensor cols = at::norm(da, inf, at::IntArrayRef{0});
  EXPECT_EQ(get_spec(cols).placements, pmax);
  EXPECT_TRUE(at::allclose(full_tensor(cols), at::norm(a, inf, at::IntArrayRef{0})));
  const at::Tensor b = values({8, 4}, 2);
  const auto norms = at::_foreach_norm({distribute_tensor(b, mesh, {Shard{0}})}, inf);
  EXPECT_EQ(get_spec(norms[0]).placements, pmax);
  EXPECT_TRUE(at::allclose(full_tensor(norms[0]), at::linalg_vector_norm(b, inf)));
}

// _foreach_* ops keep each element's shard; _foreach_norm with ord 1 gives Partial sums.
DTENSOR_TEST_F(LinalgRules, ForeachKeepsEachElementsLayout) {
  auto mesh = build_device_mesh();
  const std::vector<at::Tensor> plain{values({8, 4}, 1), values({5, 6}, 2), values({6}, 3)};
  const std::vector<at::Tensor> dts{distribute_tensor(plain[0], mesh, {Shard{0}}), distribute_tensor(plain[1], mesh, {Shard{1}}),
                                    distribute_tensor(plain[2], mesh, {Replicate{}})};
  const auto out = at::_foreach_mul(dts, dts);
  const auto norms = at::_foreach_norm(dts, 1);
  const auto ref = at::_foreach_mul(plain, plain);
  const auto ref_norms = at::_foreach_norm(plain, 1);
  for (size_t i = 0; i < plain.size(); ++i) {
    EXPECT_EQ(get_spec(out[i]).placements, get_spec(dts[i]).placements) << i;
    EXPECT_TRUE(at::allclose(full_tensor(out[i]), ref[i])) << i;
    EXPECT_TRUE(at::allclose(full_tensor(norms[i]), ref_norms[i])) << i;
  }
  EXPECT_EQ(get_spec(norms[0]).placements, std::vector<Placement>{Partial{}});
  EXPECT_EQ(get_spec(norms[2]).placements, std::vector<Placement>{Replicate{}});
}

// NOTE: [Partial elements of list ops] (linalg_rules.cpp): a Partial element goes through the
// _foreach ops whose pointwise form keeps it, and is reduced first by the others.
DTENSOR_TEST_F(LinalgRules, ForeachPartialElementsGoThroughLinearAndMonotoneOps) {
  auto mesh = build_device_mesh();
  const int64_t n = mesh.size();
  const at::Tensor g = values({8, 4}, 1), h = values({6}, 2);
  // Rank k holds a share of a sum; for max and min, the full value shifted by -k and +k.
  auto psum = [&](const at::Tensor& t) { return from_local(t / n, mesh, {Partial{}}); };
  auto pmax = [&](const at::Tensor& t) { return from_local(t - rank(), mesh, {Partial(comm::ReduceOp::MAX)}); };
  auto pmin = [&](const at::Tensor& t) { return from_local(t + rank(), mesh, {Partial(comm::ReduceOp::MIN)}); };
  auto rep = [&](const at::Tensor& t) { return distribute_tensor(t, mesh, {Replicate{}}); };
  using Tensors = std::vector<at::Tensor>;  // a list argument, never the 0-dim `other` of .Tensor
  const std::vector<Placement> sum{Partial{}}, max{Partial(comm::ReduceOp::MAX)}, min{Partial(comm::ReduceOp::MIN)};
  struct Case {
    const char* what;
    std::vector<at::Tensor> got, want;
    std::vector<std::vector<Placement>> placements;  // of each element
  };
  const std::vector<Case> cases = {
      {"mul by scalars", at::_foreach_mul({psum(g), pmax(h)}, at::ArrayRef<at::Scalar>{3, -2}),
       {g * 3, h * -2}, {sum, min}},
      {"neg", at::_foreach_neg({psum(g), pmax(h)}), {-g, -h}, {sum, min}},
      {"exp", at::_foreach_exp({pmax(g)}), {at::exp(g)}, {max}},
      {"erfc", at::_foreach_erfc({pmin(h)}), {at::erfc(h)}, {max}},
      {"add of two sums", at::_foreach_add({psum(g), psum(h)}, {psum(g * 2), psum(h)}, 0.5),
       {g * 2, h * 1.5}, {sum, sum}},
      {"sub of a replicated element", at::_foreach_sub({pmax(g), pmin(h)}, {rep(g * 0.5), rep(h * 2)}),
       {g * 0.5, -h}, {max, min}},
      {"mul by a replicated element", at::_foreach_mul({psum(g)}, Tensors{rep(g)}), {g * g}, {sum}},
      {"maximum of two maxima", at::_foreach_maximum({pmax(g)}, Tensors{pmax(g * 2)}), {at::maximum(g, g * 2)}, {max}},
      {"minimum with a replicated element", at::_foreach_minimum({pmin(g)}, Tensors{rep(at::full_like(g, 0.25))}),
       {at::clamp_max(g, 0.25)}, {min}},
      {"add a scalar to a maximum", at::_foreach_add({pmax(g)}, 1.5), {g + 1.5}, {max}},
      {"replicated minus a maximum", at::_foreach_sub({rep(g)}, Tensors{pmax(g * 2)}), {g - g * 2}, {min}},
      {"addcmul of two sums", at::_foreach_addcmul({psum(g)}, {psum(g * 2)}, {rep(g)}, 0.5), {g + g * g}, {sum}},
  };
  for (const auto& c : cases) {
    ASSERT_EQ(c.got.size(), c.want.size()) << c.what;
    for (size_t i = 0; i < c.got.size(); ++i) {
      EXPECT_EQ(get_spec(c.got[i]).placements, c.placements[i]) << c.what << ", element " << i;
      EXPECT_TRUE(at::allclose(full_tensor(c.got[i]), c.want[i])) << c.what << ", element " << i;
    }
  }
  // Not linear, or not monotone on the whole domain: the element is reduced first.
  const auto sq = at::_foreach_sqrt({pmax(g.abs() + n)});
  EXPECT_NE(get_spec(sq[0]).placements, max);
  EXPECT_TRUE(at::allclose(full_tensor(sq[0]), at::sqrt(g.abs() + n)));
  const auto shifted = at::_foreach_add({psum(g)}, 1.0);
  EXPECT_NE(get_spec(shifted[0]).placements, sum);
  EXPECT_TRUE(at::allclose(full_tensor(shifted[0]), g + 1));
  // In place an element keeps its placement: an op that keeps its kind runs where it is (before,
  // any Partial element made the call fail); one that would turn it is refused, naming the op.
  std::vector<at::Tensor> self{psum(g), pmax(h)};
  at::_foreach_mul_(self, at::ArrayRef<at::Scalar>{2, 3});
  EXPECT_EQ(get_spec(self[0]).placements, sum);
  EXPECT_EQ(get_spec(self[1]).placements, max);
  EXPECT_TRUE(at::allclose(full_tensor(self[0]), g * 2));
  EXPECT_TRUE(at::allclose(full_tensor(self[1]), h * 3));
  EXPECT_PRED2(contains, error_of([&] { at::_foreach_mul_(self, at::ArrayRef<at::Scalar>{1, -1}); }),
               "aten::_foreach_mul_.ScalarList");
  std::vector<at::Tensor> zeroed{pmin(g)};
  at::_foreach_zero_(zeroed);
  EXPECT_EQ(get_spec(zeroed[0]).placements, min);
  EXPECT_EQ(full_tensor(zeroed[0]).abs().sum().item<double>(), 0.0);
}

// libtorch 2.x's list max and sums of powers (clip_grad_norm_'s parts in PyTorch 2.15): each
// shard's result combines by max or sum, so the results are Partial with no communication.
DTENSOR_TEST_F(LinalgRules, ListMaxAndPowerSumsOfShardsArePartial) {
  auto& dispatcher = c10::Dispatcher::singleton();
  const auto max_op = dispatcher.findSchema({"aten::_foreach_max", ""});
  const auto powsum_op = dispatcher.findSchema({"aten::_foreach_powsum", "Scalar"});
  const auto linalg_op = dispatcher.findSchema({"aten::linalg__powsum", ""});
  if (!max_op || !powsum_op || !linalg_op) GTEST_SKIP() << "this libtorch has no _foreach_max, _foreach_powsum, linalg__powsum";
  auto mesh = build_device_mesh();
  const at::Tensor a = values({8, 4}, 1), b = values({6, 8}, 2);
  const std::vector<at::Tensor> dts{distribute_tensor(a, mesh, {Shard{0}}), distribute_tensor(b, mesh, {Shard{1}})};
  auto call = [](const c10::OperatorHandle& op, std::vector<c10::IValue> stack) {
    op.callBoxed(&stack);
    return stack.at(0);
  };
  testing::CommCounter counting;
  const std::vector<at::Tensor> maxes = call(*max_op, {c10::IValue(dts)}).toTensorVector();
  const std::vector<at::Tensor> sums = call(*powsum_op, {c10::IValue(dts), 3.0, c10::IValue()}).toTensorVector();
  const at::Tensor rows = call(*linalg_op, {dts[0], 2.0, std::vector<int64_t>{0}, false, c10::IValue()}).toTensor();
  EXPECT_EQ(counting.collectives(), 0);
  const std::vector<Placement> pmax{Partial(comm::ReduceOp::MAX)}, psum{Partial{}};
  for (size_t i = 0; i < 2; ++i) {
    const at::Tensor& whole = i == 0 ? a : b;
    EXPECT_EQ(get_spec(maxes[i]).placements, pmax) << i;
    EXPECT_EQ(get_spec(sums[i]).placements, psum) << i;
    EXPECT_TRUE(at::allclose(full_tensor(maxes[i]), whole.max())) << i;
    EXPECT_TRUE(at::allclose(full_tensor(sums[i]), whole.abs().pow(3).sum())) << i;
  }
  EXPECT_EQ(get_spec(rows).placements, psum);
  EXPECT_TRUE(at::allclose(full_tensor(rows), a.pow(2).sum(0)));
}

// NOTE: [Out= overloads with several outputs] (dispatch.cpp): each out= DTensor keeps its
// placements, receives the output of its position and is returned; a composite one (svd.U)
// reaches the rule of the op it decomposes into; an out= tensor of another shape is resized and
// its spec follows; a layout no strategy can write in place is refused naming the op.
class OutVariants : public testing::DTensorOpTestBase {};

DTENSOR_TEST_F(OutVariants, SeveralOutTensorsAreEachWrittenAndReturned) {
  auto mesh = build_device_mesh();
  const at::Tensor a = values({4, 6}, 1);
  const at::Tensor da = distribute_tensor(a, mesh, {Shard{0}});
  const std::vector<Placement> s0{Shard{0}};
  auto dzeros = [&](std::vector<int64_t> shape, at::ScalarType dtype, std::vector<Placement> p) {
    return distribute_tensor(at::zeros(shape, at::TensorOptions().dtype(dtype)), mesh, p);
  };
  at::Tensor sorted = dzeros({4, 6}, at::kDouble, s0), order = dzeros({4, 6}, at::kLong, s0);
  auto [rs, ro] = at::sort_out(sorted, order, da, 1);
  EXPECT_TRUE(rs.is_same(sorted) && ro.is_same(order));
  const auto ref = at::sort(a, 1);
  EXPECT_TRUE(at::equal(full_tensor(sorted), std::get<0>(ref)));
  EXPECT_TRUE(at::equal(full_tensor(order), std::get<1>(ref)));
  EXPECT_EQ(get_spec(order).placements, s0);

  at::Tensor top = dzeros({4, 2}, at::kDouble, s0), top_i = dzeros({4, 2}, at::kLong, s0);
  at::topk_out(top, top_i, da, 2, 1);
  EXPECT_TRUE(at::equal(full_tensor(top), std::get<0>(at::topk(a, 2, 1))));
  EXPECT_TRUE(at::equal(full_tensor(top_i), std::get<1>(at::topk(a, 2, 1))));

  const at::Tensor b = values({4, 5, 3}, 2);
  const at::Tensor db = distribute_tensor(b, mesh, s0);
  at::Tensor u = dzeros({4, 5, 3}, at::kDouble, s0), sv = dzeros({4, 3}, at::kDouble, s0),
             v = dzeros({4, 3, 3}, at::kDouble, s0);
  auto [ru, rsv, rv] = at::svd_out(u, sv, v, db);
  EXPECT_TRUE(ru.is_same(u) && rsv.is_same(sv) && rv.is_same(v));
  const auto svd = at::svd(b);
  EXPECT_TRUE(at::allclose(full_tensor(u), std::get<0>(svd)));
  EXPECT_TRUE(at::allclose(full_tensor(sv), std::get<1>(svd)));
  EXPECT_TRUE(at::allclose(full_tensor(v), std::get<2>(svd)));
  for (const at::Tensor& t : {u, sv, v}) EXPECT_EQ(get_spec(t).placements, s0);

  // var_mean.correction_out's kernel returns two references (libtorch 1.13's boxed wrapper
  // reads them from dropped stack slots: the shape inference keeps its stand-ins alive).
  at::Tensor var = dzeros({4}, at::kDouble, s0), mean = dzeros({4}, at::kDouble, s0);
  at::var_mean_out(var, mean, da, at::IntArrayRef{1}, c10::nullopt, false);
  const auto var_mean = at::var_mean(a, at::IntArrayRef{1}, c10::nullopt, false);
  EXPECT_TRUE(at::allclose(full_tensor(var), std::get<0>(var_mean)));
  EXPECT_TRUE(at::allclose(full_tensor(mean), std::get<1>(var_mean)));

  // Replicated out= tensors of shape [0]: resized by the op, their specs follow.
  const std::vector<Placement> rep{Replicate{}};
  at::Tensor mx = dzeros({0}, at::kDouble, rep), arg = dzeros({0}, at::kLong, rep);
  at::max_out(mx, arg, da, 1);
  EXPECT_EQ(get_spec(mx).tensor_meta.shape, (std::vector<int64_t>{4}));
  EXPECT_EQ(get_spec(arg).tensor_meta.shape, (std::vector<int64_t>{4}));
  EXPECT_TRUE(at::equal(full_tensor(mx), std::get<0>(at::max(a, 1))));
  EXPECT_TRUE(at::equal(full_tensor(arg), std::get<1>(at::max(a, 1))));

  // Sorting along dim 1 cannot give outputs sharded on dim 1.
  at::Tensor bad = dzeros({4, 6}, at::kDouble, {Shard{1}}), bad_i = dzeros({4, 6}, at::kLong, {Shard{1}});
  const std::string err = error_of([&] { at::sort_out(bad, bad_i, da, 1); });
  EXPECT_PRED2(contains, err, "aten::sort.values");
  EXPECT_PRED2(contains, err, "redistribute that tensor first");
}

// Ranks outside the mesh run nothing and get the out= DTensors back (NOTE: [Ranks outside the
// mesh] in api.cpp).
DTENSOR_TEST_F(OutVariants, RanksOutsideTheMeshReturnEachOutTensor) {
  DeviceMesh mesh(device_type(), at::arange(0, ranks(), 2, at::kLong));  // the even ranks
  const at::Tensor a = values({2, 6}, rank());
  const std::vector<Placement> s0{Shard{0}};
  at::Tensor x = from_local(a, mesh, s0);
  at::Tensor sorted = from_local(at::zeros({2, 6}, at::kDouble), mesh, s0);
  at::Tensor order = from_local(at::zeros({2, 6}, at::kLong), mesh, s0);
  auto [rs, ro] = at::sort_out(sorted, order, x, 1);
  EXPECT_TRUE(rs.is_same(sorted) && ro.is_same(order));
  EXPECT_EQ(get_spec(order).placements, s0);
  if (rank() % 2 == 0) {
    EXPECT_TRUE(at::equal(to_local(sorted), std::get<0>(at::sort(a, 1))));
    EXPECT_TRUE(at::equal(to_local(order), std::get<1>(at::sort(a, 1))));
  }
}

// NOTE: [Plain tensors made by backward formulas] (dispatch.cpp): libtorch's derivative formulas
// that build plain tensors (mvlgamma's arange, slice_scatter's zeros of src's size,
// masked_scatter's cat with plain zeros) work on DTensors: there the plain tensors are
// replicated. Gradients match the plain tensors' on every layout; forward code that mixes a plain
// tensor in is still refused, also with grad mode on and after a backward pass. Inputs are
// sharded, replicated and Partial.
class BackwardFormulas : public testing::DTensorOpTestBase {};

// The gradients of f's inputs for the output gradient `dy`, on plain tensors and on DTensors
// with the given placements (every input and dy laid out alike), compared.
void expect_same_gradients(const DeviceMesh& mesh, const std::vector<Placement>& placements,
                           const std::vector<at::Tensor>& inputs, const at::Tensor& dy,
                           const std::function<at::Tensor(const std::vector<at::Tensor>&)>& f, const std::string& what) {
  std::vector<at::Tensor> plain, dist;
  for (const auto& t : inputs) {
    plain.push_back(t.detach().clone().requires_grad_());
    dist.push_back(detail::redistribute_to_any(distribute_tensor(t.detach(), mesh, {Replicate{}}), placements)
                       .requires_grad_());
  }
  f(plain).backward(dy);
  f(dist).backward(detail::redistribute_to_any(distribute_tensor(dy, mesh, {Replicate{}}), placements));
  for (size_t i = 0; i < inputs.size(); ++i) {
    ASSERT_TRUE(dist[i].grad().defined()) << what << ": input " << i;
    ASSERT_TRUE(is_dtensor(dist[i].grad())) << what << ": input " << i;
    EXPECT_TRUE(at::allclose(full_tensor(dist[i].grad()), plain[i].grad())) << what << ": input " << i;
  }
}

DTENSOR_TEST_F(BackwardFormulas, PlainTensorsTheyMakeAreReplicated) {
  auto mesh = build_device_mesh();
  for (const std::vector<Placement>& pl :
       {std::vector<Placement>{Shard{0}}, std::vector<Placement>{Shard{1}}, std::vector<Placement>{Replicate{}},
        std::vector<Placement>{Partial{}}}) {
    const std::string where = to_string(pl);
    // mvlgamma_backward: grad * (self.unsqueeze(-1) + plain arange(p)).digamma_().sum(-1); with a
    // Partial self the sum is Partial, and digamma_ writes it in place (NOTE: [In-place ops of
    // backward formulas on Partial buffers]).
    expect_same_gradients(mesh, pl, {values({8, 6}, 1).abs() + 2}, values({8, 6}, 2),
                          [](const std::vector<at::Tensor>& t) { return at::mvlgamma(t[0], 3); },
                          "mvlgamma " + where);
    // slice_scatter's self gradient: slice_scatter(grad, plain zeros of src's size, ...).
    expect_same_gradients(mesh, pl, {values({8, 6}, 3), values({8, 2}, 4)}, values({8, 6}, 5),
                          [](const std::vector<at::Tensor>& t) { return at::slice_scatter(t[0], t[1], 1, 1, 5, 2); },
                          "slice_scatter " + where);
    // masked_scatter's source gradient: cat({grad.masked_select(mask), plain zeros}) (Tensor[]).
    const at::Tensor mask = values({8, 6}, 6) > 0.3;
    expect_same_gradients(
        mesh, pl, {values({8, 6}, 7), values({8, 6}, 8)}, values({8, 6}, 9),
        [&](const std::vector<at::Tensor>& t) {
          if (!is_dtensor(t[0])) return at::masked_scatter(t[0], mask, t[1]);
          const bool partial = is_partial(get_spec(t[0]).placements[0]);
          return at::masked_scatter(t[0], distribute_tensor(mask, mesh, partial ? std::vector<Placement>{Replicate{}} : get_spec(t[0]).placements), t[1]);
        },
        "masked_scatter " + where);
  }
}

DTENSOR_TEST_F(BackwardFormulas, PlainTensorsInForwardCodeAreStillRefused) {
  auto mesh = build_device_mesh();
  at::Tensor x = distribute_tensor(values({8, 6}, 1), mesh, {Shard{0}}).requires_grad_();
  auto refused = [&](const char* after) {
    EXPECT_TRUE(contains(error_of([&] { (void)(x * values({8, 6}, 2)); }), "aten::mul.Tensor got a plain tensor of shape [8, 6]"))
        << after;
    EXPECT_TRUE(contains(error_of([&] { (void)at::cat({x, values({2, 6}, 2)}); }), "got a list mixing DTensors and plain tensors"))
        << after;
  };
  refused("before backward");
  at::mvlgamma(x.abs() + 2, 3).sum().backward();
  ASSERT_TRUE(x.grad().defined());
  refused("after backward");
  // The guard still lets both through (a Tensor[] element too).
  ImplicitReplicationGuard implicit;
  EXPECT_TRUE(at::allclose(full_tensor(at::cat({x, values({2, 6}, 2)})), at::cat({values({8, 6}, 1), values({2, 6}, 2)})));
}

// NOTE: [In-place ops of backward formulas on Partial buffers] (dispatch.cpp): inside a backward
// pass (here a tensor hook, which runs in the engine's graph task), a non-linear in-place op on
// a Partial buffer nothing else aliases reduces it to Replicate first; an aliased one (a view of
// it is alive) and any outside backward are still refused.
DTENSOR_TEST_F(BackwardFormulas, InPlaceOnAPartialBufferReducesItOnlyWhenUnaliased) {
  auto mesh = build_device_mesh();
  const at::Tensor a = values({8, 6}, 1).abs() + 1;
  auto partial_buffer = [&] {
    return detail::redistribute_to_any(distribute_tensor(a, mesh, {Replicate{}}), {Partial{}});
  };
  const char* refusal = "no valid sharding for aten::digamma_";
  EXPECT_TRUE(contains(error_of([&] { (void)partial_buffer().digamma_(); }), refusal)) << "outside backward";
  std::string in_hook_error, aliased_error;
  at::Tensor reduced;
  at::Tensor x = distribute_tensor(values({8, 6}, 2), mesh, {Shard{0}}).requires_grad_();
  at::Tensor y = x * 2;
  y.register_hook([&](const at::Tensor& grad) {
    in_hook_error = error_of([&] { reduced = partial_buffer().digamma_(); });
    aliased_error = error_of([&] {
      at::Tensor buffer = partial_buffer();
      at::Tensor view = buffer.view({48});
      (void)buffer.digamma_();
    });
    return grad;
  });
  y.sum().backward();
  EXPECT_EQ(in_hook_error, "<no error>");
  ASSERT_TRUE(reduced.defined());
  EXPECT_EQ(get_spec(reduced).placements, std::vector<Placement>{Replicate{}});
  EXPECT_TRUE(at::allclose(full_tensor(reduced), a.digamma()));
  EXPECT_TRUE(contains(aliased_error, refusal)) << aliased_error;
}

// median / nanmedian / mode / kthvalue along a dim keep the other dims' shards (values and
// indices, .values out= tensors too) and replicate the reduced dim; without a dim, replicated.
class OrderStatistics : public testing::DTensorOpTestBase {};

DTENSOR_TEST_F(OrderStatistics, KeepTheOtherDimsShardsAndReplicateTheReducedDim) {
  auto mesh = build_device_mesh();
  const at::Tensor a = (at::arange(48, at::kDouble) * 7).remainder(48).reshape({8, 6}) / 5;  // distinct values
  const std::vector<Placement> s0{Shard{0}}, rep{Replicate{}};
  const at::Tensor rows = distribute_tensor(a, mesh, s0);
  auto expect = [&](const std::tuple<at::Tensor, at::Tensor>& got, const std::tuple<at::Tensor, at::Tensor>& want,
                    const std::vector<Placement>& placements, const std::string& what) {
    EXPECT_EQ(get_spec(std::get<0>(got)).placements, placements) << what;
    EXPECT_EQ(get_spec(std::get<1>(got)).placements, placements) << what;
    EXPECT_TRUE(at::equal(full_tensor(std::get<0>(got)), std::get<0>(want))) << what;
    EXPECT_TRUE(at::equal(full_tensor(std::get<1>(got)), std::get<1>(want))) << what;
  };
  expect(at::median(rows, 1), at::median(a, 1), s0, "median dim 1");
  expect(at::nanmedian(rows, 1, true), at::nanmedian(a, 1, true), s0, "nanmedian dim 1 keepdim");
  expect(at::kthvalue(rows, 2, 1), at::kthvalue(a, 2, 1), s0, "kthvalue dim 1");
  // Along the sharded dim: replicated first.
  expect(at::kthvalue(rows, 3, 0), at::kthvalue(a, 3, 0), rep, "kthvalue dim 0");
  const at::Tensor few = (at::arange(48, at::kDouble) * 5).remainder(3).reshape({8, 6});
  expect(at::mode(distribute_tensor(few, mesh, s0), 1), at::mode(few, 1), s0, "mode dim 1");
  // The whole tensor.
  const at::Tensor m = at::median(rows);
  EXPECT_EQ(get_spec(m).placements, rep);
  EXPECT_TRUE(at::equal(full_tensor(m), at::median(a)));
  // .values out= overloads write their out= DTensors.
  at::Tensor values = distribute_tensor(at::zeros({8}, at::kDouble), mesh, s0);
  at::Tensor indices = distribute_tensor(at::zeros({8}, at::kLong), mesh, s0);
  auto [rv, ri] = at::kthvalue_out(values, indices, rows, 2, 1);
  EXPECT_TRUE(rv.is_same(values) && ri.is_same(indices));
  expect({values, indices}, at::kthvalue(a, 2, 1), s0, "kthvalue.values");
  at::mode_out(values, indices, distribute_tensor(few, mesh, s0), 1);
  expect({values, indices}, at::mode(few, 1), s0, "mode.values");
}

}  // namespace
}  // namespace dtensor
