// converters/samples/matrix_samples.cpp: samples of the matrix products: shapes whose free
// and contracted dims divide the mesh, and ones that do not; the composite products (matmul,
// linear, einsum, outer/ger, inner, tensordot, chain_matmul) in the cases that decompose
// differently; attention.
#include "converters/samples/samples.h"
#include "dtensor/compat.h"

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <string>

namespace dtensor {
namespace testing {
namespace samples {

namespace {

void add_products(OpDb& db) {
  db.add("aten::mm", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({4, 8})}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), g.tensor({6, 3}, at::kDouble)})};
  });
  db.add("aten::addmm", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 8}), g.tensor({8, 4}), g.tensor({4, 8})}),
                   OpSample("bias_row", {g.tensor({8}), g.tensor({8, 4}), g.tensor({4, 8})}).kw("beta", 0.5).kw("alpha", 2),
                   OpSample("uneven_f64", {g.tensor({5, 3}, at::kDouble), g.tensor({5, 6}, at::kDouble),
                                           g.tensor({6, 3}, at::kDouble)})};
  });
  // In place: self has the result's shape.
  db.add("aten::addmm_", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 8}), g.tensor({8, 4}), g.tensor({4, 8})}).kw("beta", 0.5),
                   OpSample("uneven_f64", {g.tensor({5, 3}, at::kDouble), g.tensor({5, 6}, at::kDouble),
                                           g.tensor({6, 3}, at::kDouble)})};
  });
  db.add("aten::baddbmm_", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({4, 8, 8}), g.tensor({4, 8, 4}), g.tensor({4, 4, 8})}).kw("alpha", 2),
                   OpSample("uneven_f64", {g.tensor({3, 5, 2}, at::kDouble), g.tensor({3, 5, 6}, at::kDouble),
                                           g.tensor({3, 6, 2}, at::kDouble)})};
  });
  db.add("aten::bmm", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({4, 8, 4}), g.tensor({4, 4, 8})}),
                   OpSample("uneven_f64", {g.tensor({3, 5, 6}, at::kDouble), g.tensor({3, 6, 2}, at::kDouble)})};
  });
  db.add("aten::baddbmm", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({4, 8, 8}), g.tensor({4, 8, 4}), g.tensor({4, 4, 8})}),
                   OpSample("broadcast_self", {g.tensor({8}), g.tensor({4, 8, 4}), g.tensor({4, 4, 8})}).kw("beta", 0.5),
                   OpSample("uneven_f64", {g.tensor({3, 5, 2}, at::kDouble), g.tensor({3, 5, 6}, at::kDouble),
                                           g.tensor({3, 6, 2}, at::kDouble)})};
  });
  db.add("aten::addbmm", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 8}), g.tensor({4, 8, 4}), g.tensor({4, 4, 8})}),
                   OpSample("broadcast_self", {g.tensor({8}), g.tensor({4, 8, 4}), g.tensor({4, 4, 8})})
                       .kw("beta", 0.5)
                       .kw("alpha", 2),
                   OpSample("uneven_f64", {g.tensor({5, 2}, at::kDouble), g.tensor({3, 5, 6}, at::kDouble),
                                           g.tensor({3, 6, 2}, at::kDouble)})};
  });
  db.add("aten::dot", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8}), g.tensor({8})}),
                   OpSample("uneven_f64", {g.tensor({6}, at::kDouble), g.tensor({6}, at::kDouble)})};
  });
  db.add("aten::vdot", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8}), g.tensor({8})}),
                   OpSample("uneven_f64", {g.tensor({6}, at::kDouble), g.tensor({6}, at::kDouble)}),
                   OpSample("complex", {g.tensor({8}, at::kComplexFloat), g.tensor({8}, at::kComplexFloat)})};
  });
  db.add("aten::mv", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({4})}),
                   OpSample("uneven_f64", {g.tensor({5, 6}, at::kDouble), g.tensor({6}, at::kDouble)})};
  });
  db.add("aten::addmv", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8}), g.tensor({8, 4}), g.tensor({4})}),
                   OpSample("broadcast_self", {g.tensor({1}), g.tensor({8, 4}), g.tensor({4})}).kw("beta", 0.5).kw("alpha", 2),
                   OpSample("uneven_f64", {g.tensor({5}, at::kDouble), g.tensor({5, 6}, at::kDouble),
                                           g.tensor({6}, at::kDouble)})};
  });
  db.add("aten::addr", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({8}), g.tensor({4})}),
                   OpSample("broadcast_self", {g.tensor({4}), g.tensor({8}), g.tensor({4})}).kw("beta", 0.5).kw("alpha", 2),
                   OpSample("uneven_f64", {g.tensor({5, 3}, at::kDouble), g.tensor({5}, at::kDouble),
                                           g.tensor({3}, at::kDouble)})};
  });
  // outer / ger are composite: vec1.reshape({-1, 1}) * vec2.
  for (const char* op : {"aten::outer", "aten::ger"})
    db.add(op, "matrix", [](SampleGen& g) {
      return Samples{OpSample("even", {g.tensor({8}), g.tensor({4})}),
                     OpSample("uneven_f64", {g.tensor({5}, at::kDouble), g.tensor({3}, at::kDouble)})};
    });
}

// matmul is composite: 1-D x 1-D is dot, 2-D x 1-D mv, 1-D x 2-D unsqueeze + mm + squeeze_,
// 2-D x 2-D mm, N-D x 1-D/2-D folds the batch into the rows (view + mm + _unsafe_view), and
// batched x batched broadcasts the batch dims (expand + reshape + bmm + _unsafe_view).
void add_composites(OpDb& db) {
  db.add("aten::matmul", "matrix", [](SampleGen& g) {
    return Samples{
        OpSample("1d_1d", {g.tensor({8}), g.tensor({8})}),
        OpSample("2d_1d", {g.tensor({8, 4}), g.tensor({4})}),
        OpSample("1d_2d", {g.tensor({4}), g.tensor({4, 8})}),
        OpSample("2d_2d", {g.tensor({8, 4}), g.tensor({4, 8})}),
        OpSample("3d_2d", {g.tensor({4, 8, 4}), g.tensor({4, 6})}),
        OpSample("3d_1d", {g.tensor({4, 8, 4}), g.tensor({4})}),
        OpSample("1d_3d", {g.tensor({4}), g.tensor({2, 4, 6})}),
        OpSample("2d_3d", {g.tensor({8, 4}), g.tensor({2, 4, 6})}),
        OpSample("batched", {g.tensor({4, 8, 4}), g.tensor({4, 4, 6})}),
        OpSample("broadcast", {g.tensor({2, 1, 8, 4}), g.tensor({4, 4, 6})}),
        OpSample("uneven_f64", {g.tensor({3, 5, 6}, at::kDouble), g.tensor({6, 7}, at::kDouble)}),
    };
  });
  // linear: 2-D with bias is addmm; 3-D contiguous with bias folds into addmm; otherwise
  // matmul (+ add_ of the bias).
  db.add("aten::linear", "matrix", [](SampleGen& g) {
    return Samples{
        OpSample("2d_bias", {g.tensor({8, 4}), g.tensor({6, 4}), g.tensor({6})}),
        OpSample("3d_bias", {g.tensor({2, 8, 4}), g.tensor({6, 4}), g.tensor({6})}),
        OpSample("3d_no_bias", {g.tensor({2, 8, 4}), g.tensor({6, 4})}),
        OpSample("1d_bias", {g.tensor({4}), g.tensor({6, 4}), g.tensor({6})}),
        OpSample("uneven_f64", {g.tensor({5, 3}, at::kDouble), g.tensor({7, 3}, at::kDouble), g.tensor({7}, at::kDouble)}),
    };
  });
  db.add("aten::inner", "matrix", [](SampleGen& g) {  // composite: tensordot over the last dims
    return Samples{OpSample("2d_2d", {g.tensor({8, 4}), g.tensor({6, 4})}),
                   OpSample("uneven_f64", {g.tensor({5}, at::kDouble), g.tensor({3, 5}, at::kDouble)})};
  });
  db.add("aten::tensordot", "matrix", [](SampleGen& g) {  // composite: permute + reshape + mm
    return Samples{OpSample("even", {g.tensor({4, 8, 2}), g.tensor({2, 8, 6}), std::vector<int64_t>{1, 2},
                                     std::vector<int64_t>{1, 0}})};
  });
  db.add("aten::chain_matmul", "matrix", [](SampleGen& g) {  // composite: mm chain
    return Samples{OpSample("three", {std::vector<at::Tensor>{g.tensor({8, 4}), g.tensor({4, 6}), g.tensor({6, 4})}})};
  });
  // einsum is composite (permute / reshape / bmm / sum, by the equation).
  db.add("aten::einsum", "matrix", [](SampleGen& g) {
    auto sample = [](const char* variant, const char* eq, std::vector<at::Tensor> ts) {
      return OpSample(variant, {std::string(eq), std::move(ts)});
    };
    return Samples{
        sample("bmm", "bij,bjk->bik", {g.tensor({4, 8, 4}), g.tensor({4, 4, 6})}),
        sample("mm", "ij,jk->ik", {g.tensor({8, 4}), g.tensor({4, 8})}),
        sample("attention", "bhqd,bhkd->bhqk", {g.tensor({2, 4, 8, 4}), g.tensor({2, 4, 6, 4})}),
        sample("dot", "i,i->", {g.tensor({8}), g.tensor({8})}),
        sample("mm_uneven_f64", "ij,jk->ik", {g.tensor({5, 6}, at::kDouble), g.tensor({6, 3}, at::kDouble)}),
    };
  });
}

// NOTE: [Attention forward] (dtensor/ops/matrix_rules.cpp): the public attention op
// (compat::kSdpaPublicOp) calls the fused compat::kSdpaFusedOp (1.13: without grad; 2.x: on 4-D
// inputs without dropout) or decomposes (matmul, _softmax, dropout). The samples are 4-D, which
// 2.x's fused CPU kernel needs.
void add_attention(OpDb& db) {
  auto qkv = [](SampleGen& g, std::vector<int64_t> q, std::vector<int64_t> kv,
                at::ScalarType dtype = at::kFloat) -> std::vector<c10::IValue> {
    return {g.tensor(q, dtype), g.tensor(kv, dtype), g.tensor(kv, dtype)};
  };
  using compat::SdpaOp;
  auto with = [](std::string variant, SdpaOp op, std::vector<c10::IValue> qkv, c10::IValue mask, double dropout_p,
                 bool weights, bool causal) {
    auto a = compat::sdpa_args(op, std::move(qkv), std::move(mask), dropout_p, weights, causal);
    OpSample s(std::move(variant), std::move(a.args));
    for (auto& kv : a.kwargs) s.kw(kv.first, std::move(kv.second));
    return s;
  };
  db.add(compat::kSdpaFusedOp, "matrix", [=](SampleGen& g) {
    return Samples{
        OpSample("even", qkv(g, {2, 4, 8, 4}, {2, 4, 8, 4})).no_backward(),
        with("weights", SdpaOp::kFused, qkv(g, {2, 4, 8, 4}, {2, 4, 6, 4}), c10::IValue(), 0.0, true, false).no_backward(),
        with("mask", SdpaOp::kFused, qkv(g, {2, 4, 8, 4}, {2, 4, 6, 4}), g.tensor({8, 6}), 0.0, false, false).no_backward(),
        with("causal", SdpaOp::kFused, qkv(g, {2, 4, 8, 4}, {2, 4, 8, 4}), c10::IValue(), 0.0, true, true).no_backward(),
        OpSample("uneven_f64", qkv(g, {1, 3, 5, 4}, {1, 3, 6, 4}, at::kDouble)).no_backward(),
    };
  });
  db.add(compat::kSdpaPublicOp, "matrix", [=](SampleGen& g) {
    return Samples{
        OpSample("even", qkv(g, {2, 4, 8, 4}, {2, 4, 8, 4})),
        OpSample("no_grad", qkv(g, {2, 4, 8, 4}, {2, 4, 8, 4})).no_backward(),
        with("no_grad_mask_weights", SdpaOp::kPublic, qkv(g, {2, 4, 8, 4}, {2, 4, 6, 4}), g.tensor({8, 6}), 0.0, true, false)
            .no_backward(),
        with("causal", SdpaOp::kPublic, qkv(g, {2, 4, 8, 4}, {2, 4, 8, 4}), c10::IValue(), 0.0, false, true),
        with("dropout", SdpaOp::kPublic, qkv(g, {2, 4, 8, 4}, {2, 4, 8, 4}), c10::IValue(), 0.5, false, false).seeded(1234),
    };
  });
  // 2.x: the fused op's backward, fed with the forward's output and logsumexp.
  if (compat::kSdpaFusedBackwardOp)
    db.add(compat::kSdpaFusedBackwardOp, "matrix", [=](SampleGen& g) {
      const auto& fwd = c10::Dispatcher::singleton().findSchemaOrThrow(compat::kSdpaFusedOp, "");
      auto make = [&](std::string variant, std::vector<int64_t> q, std::vector<int64_t> kv, bool causal) {
        auto a = compat::sdpa_args(SdpaOp::kFused, qkv(g, q, kv), c10::IValue(), 0.0, false, causal);
        std::vector<c10::IValue> args(a.args.begin(), a.args.begin() + 3);
        torch::jit::Stack st = boxed_args(fwd.schema(), a.args, a.kwargs);
        fwd.callBoxed(&st);
        const at::Tensor out = st[0].toTensor(), lse = st[1].toTensor();
        std::vector<c10::IValue> b{g.tensor(out.sizes().vec())};
        b.insert(b.end(), args.begin(), args.end());
        b.insert(b.end(), {out, lse, 0.0, causal});
        return OpSample(std::move(variant), std::move(b)).no_backward();
      };
      return Samples{make("even", {2, 4, 8, 4}, {2, 4, 8, 4}, false), make("causal", {2, 4, 8, 4}, {2, 4, 8, 4}, true),
                     make("cross", {2, 4, 8, 4}, {2, 4, 6, 4}, false), make("uneven", {1, 3, 5, 4}, {1, 3, 5, 4}, false)};
    });
  // 2.x: the kernel choice (NOTE: [Attention kernel choice]); "uneven" has empty shards.
  if (compat::kSdpaChoiceOp)
    db.add(compat::kSdpaChoiceOp, "matrix", [=](SampleGen& g) {
      return Samples{
          OpSample("flash", qkv(g, {2, 4, 8, 4}, {2, 4, 8, 4})).no_backward(),
          OpSample("uneven", qkv(g, {2, 3, 5, 4}, {2, 3, 5, 4})).no_backward(),
          with("dropout", SdpaOp::kPublic, qkv(g, {2, 4, 8, 4}, {2, 4, 8, 4}), c10::IValue(), 0.5, false, false)
              .no_backward(),
      };
    });
}

}  // namespace

void add_matrix_samples(OpDb& db) {
  add_products(db);
  add_composites(db);
  add_attention(db);
  // out= overloads are served by the functional rule (NOTE: [Rules of functional ops serve
  // their out= overloads] in dtensor/ops/registry.cpp).
  db.add("aten::mm.out", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({8, 4}), g.tensor({4, 8})}).kw("out", g.tensor({8, 8}))};
  });
  db.add("aten::bmm.out", "matrix", [](SampleGen& g) {
    return Samples{OpSample("even", {g.tensor({4, 8, 4}), g.tensor({4, 4, 8})}).kw("out", g.tensor({4, 8, 8}))};
  });
}

}  // namespace samples
}  // namespace testing
}  // namespace dtensor
