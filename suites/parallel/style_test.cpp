// Parallel styles, each alone against the plain module with every input/output layout option
// (forward, input and parameter gradients), parallelize_module's path matching and its errors,
// and a user-written module tree parallelized as the README shows. Ranks as threads.
#include "dtensor/nn/nn.h"
#include "dtensor/parallel/parallel.h"
#include "harness/harness.h"
#include "models/models.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/dropout.h>

namespace dtensor {
namespace {

using testing::contains;
using testing::error_of;
using testing::gathered;
using testing::set_parameters;
using testing::values;

class StyleRanks : public testing::DTensorOpTestBase {};

std::string layout_name(const Placement& p, bool local) {
  return to_string(p) + (local ? " local" : " dtensor");
}

// This rank's piece of `t` under `p`, as a fresh leaf (requires grad when `grad`).
at::Tensor shard_of(const at::Tensor& t, const DeviceMesh& mesh, const Placement& p, bool grad) {
  at::Tensor local = local_tensor(distribute_tensor(t, mesh, {p})).clone();
  if (grad) local.requires_grad_(true);
  return local;
}

// `tp` (a parallelized copy of `ref`) called on this rank's piece of `x` (laid out as
// `in_layout`) gives, once gathered, ref's output; gradients of the parameters and of the
// input match after backward through a weighted sum.
template <class Holder>
void check_style(const DeviceMesh& mesh, Holder ref, Holder tp, const at::Tensor& x, const Placement& in_layout,
                 const Placement& out_layout, bool use_local, bool input_grad, bool partial_grad_is_share = false) {
  at::Tensor x_ref = x.clone();
  if (input_grad) x_ref.requires_grad_(true);
  at::Tensor x_tp = shard_of(x, mesh, in_layout, input_grad);
  at::Tensor y_ref = nn::call(ref, x_ref);
  at::Tensor y = nn::call(tp, x_tp);
  ASSERT_EQ(is_dtensor(y), !use_local);
  const auto want = normalize_placements({out_layout}, y_ref.dim());
  if (use_local) {
    EXPECT_EQ(y.sizes().vec(), compute_local_shape(y_ref.sizes(), mesh, want));
    y = from_local(y, mesh, want, FromLocalOptions::contiguous(y_ref.sizes().vec()));
  } else {
    EXPECT_EQ(get_spec(y).placements, want);
  }
  const at::Tensor y_full = full_tensor(y);
  EXPECT_TRUE(testing::tensors_close(y_ref, y_full, 1e-5, 1e-6)) << "output";
  const at::Tensor w = values(y_ref.sizes().vec(), 9);
  (y_ref * w).sum().backward();
  (y_full * w).sum().backward();
  for (const auto& kv : ref->named_parameters()) {
    SCOPED_TRACE(kv.key());
    const at::Tensor& g = tp->named_parameters()[kv.key()].grad();
    ASSERT_TRUE(g.defined());
    EXPECT_TRUE(testing::tensors_close(kv.value().grad(), gathered(g), 1e-4, 1e-5));
  }
  if (input_grad) {
    // Each rank's piece of a Partial input contributes to the sum: its gradient is the whole one,
    // unless the gradient comes back Partial (a column-sharded matmul's input gradient): then it
    // stays Partial, each rank holding its share, and the shares sum to the whole gradient (as
    // PyTorch; NOTE: [Gradients of Partial inputs] in dtensor/tensor/api.cpp).
    ASSERT_TRUE(x_tp.grad().defined());
    const at::Tensor expected = is_partial(in_layout) ? x_ref.grad() : shard_of(x_ref.grad(), mesh, in_layout, false);
    at::Tensor got = x_tp.grad();
    if (is_partial(in_layout) && partial_grad_is_share) got = full_tensor(from_local(got, mesh, {Partial{}}));
    EXPECT_TRUE(testing::tensors_close(expected, got, 1e-4, 1e-5)) << "input gradient";
  }
}

torch::nn::Linear make_linear(bool bias) {
  torch::nn::Linear l(torch::nn::LinearOptions(8, 12).bias(bias));
  set_parameters(*l, 0);
  return l;
}

torch::nn::Embedding make_embedding() {
  torch::nn::Embedding e(12, 8);
  set_parameters(*e, 1);
  return e;
}

// [n, n] token ids for n ranks: a Shard(0) or Shard(-1) input is even (from_local of a style's
// input assumes even shards, as PyTorch's does).
at::Tensor tokens(int64_t n) { return (at::arange(n * n, at::kLong) * 5 + 2).remainder(12).view({n, n}); }

DTENSOR_TEST_F(StyleRanks, ColwiseParallelLinearEveryLayout) {
  auto mesh = build_device_mesh();
  for (bool bias : {true, false})
    for (const Placement& in : std::vector<Placement>{Replicate{}, Shard{0}, Shard{-1}, Partial{}})
      for (const Placement& out : std::vector<Placement>{Shard{-1}, Replicate{}, Shard{0}})
        for (bool local : {true, false}) {
          SCOPED_TRACE("bias=" + std::to_string(bias) + " in=" + to_string(in) + " out=" + layout_name(out, local));
          torch::nn::Linear ref = make_linear(bias), tp = make_linear(bias);
          parallelize_module(tp, mesh, ColwiseParallel().input_layouts(in).output_layouts(out).use_local_output(local));
          EXPECT_EQ(to_string(get_spec(tp->weight).placements), "(Shard(dim=0),)");
          check_style(mesh, ref, tp, values({8, 8}, 2), in, out, local, true, /*partial_grad_is_share=*/true);
        }
}

DTENSOR_TEST_F(StyleRanks, RowwiseParallelLinearEveryLayout) {
  auto mesh = build_device_mesh();
  for (bool bias : {true, false})
    for (const Placement& in : std::vector<Placement>{Shard{-1}, Replicate{}, Shard{0}, Partial{}})
      for (const Placement& out : std::vector<Placement>{Replicate{}, Shard{0}, Shard{-1}})
        for (bool local : {true, false}) {
          SCOPED_TRACE("bias=" + std::to_string(bias) + " in=" + to_string(in) + " out=" + layout_name(out, local));
          torch::nn::Linear ref = make_linear(bias), tp = make_linear(bias);
          parallelize_module(tp, mesh, RowwiseParallel().input_layouts(in).output_layouts(out).use_local_output(local));
          EXPECT_EQ(to_string(get_spec(tp->weight).placements), "(Shard(dim=1),)");
          if (bias) EXPECT_EQ(to_string(get_spec(tp->bias).placements), "(Replicate(),)");
          check_style(mesh, ref, tp, values({8, 8}, 2), in, out, local, true);
        }
}

DTENSOR_TEST_F(StyleRanks, ColwiseParallelEmbeddingEveryLayout) {
  auto mesh = build_device_mesh();
  for (const Placement& in : std::vector<Placement>{Replicate{}, Shard{0}})
    for (const Placement& out : std::vector<Placement>{Shard{-1}, Replicate{}, Shard{1}})
      for (bool local : {true, false}) {
        SCOPED_TRACE("in=" + to_string(in) + " out=" + layout_name(out, local));
        torch::nn::Embedding ref = make_embedding(), tp = make_embedding();
        parallelize_module(tp, mesh, ColwiseParallel().input_layouts(in).output_layouts(out).use_local_output(local));
        EXPECT_EQ(to_string(get_spec(tp->weight).placements), "(Shard(dim=1),)");
        check_style(mesh, ref, tp, tokens(ranks()), in, out, local, false);
      }
}

DTENSOR_TEST_F(StyleRanks, RowwiseParallelEmbeddingEveryLayout) {
  auto mesh = build_device_mesh();
  for (const Placement& in : std::vector<Placement>{Replicate{}, Shard{0}, Shard{-1}})
    for (const Placement& out : std::vector<Placement>{Replicate{}, Shard{0}, Shard{1}, Shard{-1}})
      for (bool local : {true, false}) {
        SCOPED_TRACE("in=" + to_string(in) + " out=" + layout_name(out, local));
        torch::nn::Embedding ref = make_embedding(), tp = make_embedding();
        parallelize_module(tp, mesh, RowwiseParallel().input_layouts(in).output_layouts(out).use_local_output(local));
        EXPECT_EQ(to_string(get_spec(tp->weight).placements), "(Shard(dim=0),)");
        check_style(mesh, ref, tp, tokens(ranks()), in, out, local, false);
      }
}

DTENSOR_TEST_F(StyleRanks, SequenceParallelNormsAndDropout) {
  auto mesh = build_device_mesh();
  const at::Tensor x = values({2, 8, 6}, 3);
  for (bool local : {false, true})
    for (const Placement& in : std::vector<Placement>{Shard{1}, Replicate{}}) {
      SCOPED_TRACE(std::string(local ? "local" : "dtensor") + " output, input " + to_string(in));
      // A Replicate input is given as a DTensor (redistributed to Shard(1)); a Shard(1) one as
      // this rank's plain piece.
      auto input = [&](bool grad) {
        if (is_shard(in)) return shard_of(x, mesh, in, grad);
        at::Tensor d = distribute_tensor(x, mesh, {Replicate{}});
        return grad ? d.requires_grad_(true) : d;
      };
      auto check = [&](auto ref, auto tp) {
        set_parameters(*ref, 4);
        set_parameters(*tp, 4);
        parallelize_module(tp, mesh, SequenceParallel().use_local_output(local));
        for (const auto& p : tp->parameters()) EXPECT_EQ(to_string(get_spec(p).placements), "(Replicate(),)");
        at::Tensor xr = x.clone().requires_grad_(true), xt = input(true);
        at::Tensor yr = nn::call(ref, xr), yt = nn::call(tp, xt);
        EXPECT_EQ(is_dtensor(yt), !local);
        if (local) yt = from_local(yt, mesh, {Shard{1}});
        else EXPECT_EQ(to_string(get_spec(yt).placements), "(Shard(dim=1),)");
        EXPECT_TRUE(testing::tensors_close(yr, full_tensor(yt), 1e-5, 1e-6));
        (yr * yr).sum().backward();
        (yt * yt).sum().backward();
        for (const auto& kv : ref->named_parameters())
          EXPECT_TRUE(testing::tensors_close(kv.value().grad(), gathered(tp->named_parameters()[kv.key()].grad()),
                                             1e-4, 1e-5))
              << kv.key();
        EXPECT_TRUE(testing::tensors_close(is_shard(in) ? shard_of(xr.grad(), mesh, in, false) : xr.grad(),
                                           gathered(xt.grad()), 1e-4, 1e-5));
      };
      check(torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})),
            torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})));
      check(models::RMSNorm(6), models::RMSNorm(6));
      check(torch::nn::Dropout(0.0), torch::nn::Dropout(0.0));
    }
}

// forward(x, y, k): x * y.sum() * k, with the layouts of its inputs recorded.
struct ThreeInputsImpl : torch::nn::Module {
  at::Tensor forward(const at::Tensor& x, const at::Tensor& y, int64_t k) {
    seen = (is_dtensor(x) ? to_string(get_spec(x).placements) : "plain") + " " +
           (is_dtensor(y) ? to_string(get_spec(y).placements) : "plain");
    return x * gathered(y).sum() * k;
  }
  std::string seen;
};
TORCH_MODULE(ThreeInputs);

// forward(x): (x * 2 as given, x + 1)
struct TwoOutputsImpl : torch::nn::Module {
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x) { return {x * 2, x + 1}; }
};
TORCH_MODULE(TwoOutputs);

DTENSOR_TEST_F(StyleRanks, PrepareModuleInputConvertsEachPosition) {
  auto mesh = build_device_mesh();
  // Shard(0) inputs even over the ranks (from_local assumes even shards).
  const at::Tensor x = values({2 * ranks(), 3}), y = values({ranks()}, 1);
  for (bool local : {false, true}) {
    ThreeInputs m;
    parallelize_module(m, mesh,
                       PrepareModuleInput()
                           .input_layouts({Shard{0}, std::nullopt, std::nullopt})
                           .desired_input_layouts({Replicate{}, std::nullopt, std::nullopt})
                           .use_local_output(local));
    at::Tensor out = nn::call(m, shard_of(x, mesh, Shard{0}, false), y, int64_t{3});
    EXPECT_EQ(m->seen, local ? "plain plain" : "(Replicate(),) plain");
    EXPECT_TRUE(testing::tensors_close(x * y.sum() * 3, gathered(out)));
  }
  // A DTensor input in another layout is redistributed to the desired one.
  ThreeInputs m;
  parallelize_module(m, mesh,
                     PrepareModuleInput()
                         .input_layouts({Shard{0}, Shard{0}, std::nullopt})
                         .desired_input_layouts({Shard{1}, Replicate{}, std::nullopt}));
  nn::call(m, distribute_tensor(x, mesh, {Replicate{}}), shard_of(y, mesh, Shard{0}, false), int64_t{1});
  EXPECT_EQ(m->seen, "(Shard(dim=1),) (Replicate(),)");
}

DTENSOR_TEST_F(StyleRanks, PrepareModuleOutputConvertsTupleElements) {
  auto mesh = build_device_mesh();
  const at::Tensor x = values({8, 2});
  TwoOutputs m;
  parallelize_module(m, mesh,
                     PrepareModuleOutput()
                         .output_layouts({Shard{0}, std::nullopt})
                         .desired_output_layouts({Replicate{}, std::nullopt}));
  auto [a, b] = nn::call(m, shard_of(x, mesh, Shard{0}, false));
  EXPECT_FALSE(is_dtensor(a));  // use_local_output defaults to true
  EXPECT_TRUE(testing::tensors_close(x * 2, a));
  EXPECT_TRUE(testing::tensors_close(shard_of(x, mesh, Shard{0}, false) + 1, b));
}

// ---- parallelize_module: paths and errors ------------------------------------------------------

DTENSOR_TEST_F(StyleRanks, PathsWithWildcards) {
  models::MLPStacked m(c10::Device(c10::kCPU), 3);
  using V = std::vector<std::string>;
  EXPECT_EQ(match_module_paths(*m, "layers.*.net1"), (V{"layers.0.net1", "layers.1.net1", "layers.2.net1"}));
  EXPECT_EQ(match_module_paths(*m, "layers.?.net?"),
            (V{"layers.0.net1", "layers.0.net2", "layers.1.net1", "layers.1.net2", "layers.2.net1", "layers.2.net2"}));
  EXPECT_EQ(match_module_paths(*m, "layers.1*.*2"), (V{"layers.1.net2"}));
  EXPECT_EQ(match_module_paths(*m, "*"), (V{"layers"}));
  EXPECT_TRUE(match_module_paths(*m, "layers.3").empty());
  // A plan with wildcards parallelizes every match.
  auto mesh = build_device_mesh();
  parallelize_module(m, mesh, {{"layers.*.net1", ColwiseParallel()}, {"layers.*.net2", RowwiseParallel()}});
  for (const auto& kv : m->named_parameters()) EXPECT_TRUE(is_dtensor(kv.value())) << kv.key();
}

DTENSOR_TEST_F(StyleRanks, PlanErrorsRaiseBeforeAnythingIsApplied) {
  auto mesh = build_device_mesh();
  models::MLPStacked m(c10::Device(c10::kCPU), 2);
  struct Case {
    ParallelizePlan plan;
    std::string message;
  };
  const std::vector<Case> cases = {
      // (A path that matches nothing is a warning: TpParity.UnmatchedPlanKeysWarnAndAreSkipped.)
      {{{"layers.0.relu", ColwiseParallel()}},
       "ColwiseParallel: 'layers.0.relu' is a torch::nn::ReLUImpl; ColwiseParallel supports torch::nn::Linear and "
       "torch::nn::Embedding"},
      {{{"layers.1", RowwiseParallel()}}, "RowwiseParallel: 'layers.1' is a dtensor::models::MLPModuleImpl"},
      {{{"layers..net1", ColwiseParallel()}},
       "the plan path 'layers..net1' has an empty component; use dotted child names"},
      {{{"", ColwiseParallel()}}, "ColwiseParallel: the root module is a dtensor::models::MLPStackedImpl"},
      {{{"layers.0.net1", ColwiseParallel()}, {"layers.*.net1", RowwiseParallel()}},
       "'layers.0.net1' is matched by the plan entries 'layers.0.net1' and 'layers.*.net1', which both distribute "
       "its parameters"},
      {{{"layers.0", PrepareModuleInput().input_layouts({Shard{0}, Shard{1}}).desired_input_layouts({Replicate{}})}},
       "PrepareModuleInput at 'layers.0': input_layouts (Shard(dim=0), Shard(dim=1)) and desired_input_layouts "
       "(Replicate(),) must have the same length"},
      {{{"layers.0", PrepareModuleOutput().output_layouts({std::nullopt}).desired_output_layouts({Replicate{}})}},
       "PrepareModuleOutput at 'layers.0': entry 0 of desired_output_layouts is Replicate() but its output_layouts "
       "entry is None"},
  };
  for (const auto& c : cases) EXPECT_PRED2(contains, error_of([&] { parallelize_module(m, mesh, c.plan); }), c.message);
  for (const auto& kv : m->named_parameters()) EXPECT_FALSE(is_dtensor(kv.value())) << kv.key();
  auto mesh2 = init_device_mesh(device_type(), {1, ranks()}, {}, group_ptr());
  EXPECT_PRED2(contains, error_of([&] { parallelize_module(m, mesh2, {{"layers.0.net1", ColwiseParallel()}}); }),
               "parallelize_module: tensor parallelism takes a 1-D device mesh, got " + mesh2.to_string() +
                   "; slice the tensor-parallel dim, e.g. mesh[\"tp\"]");
  // Applying a parameter style twice names the earlier parallelization.
  parallelize_module(m, mesh, {{"layers.0.net1", ColwiseParallel()}});
  EXPECT_PRED2(contains, error_of([&] { parallelize_module(m, mesh, {{"layers.0.net1", RowwiseParallel()}}); }),
               "RowwiseParallel: 'layers.0.net1' was parallelized before (its weight is a DTensor with "
               "(Shard(dim=0),)); a module takes one parameter-distributing style");
  EXPECT_PRED2(contains, error_of([&] { parallelize_module(*m->layers[0], mesh, SequenceParallel()); }),
               "SequenceParallel: parameter 'net1.weight' of the root module is already a DTensor");
  // Nobody is left inside a collective: the group still works.
  EXPECT_EQ(full_tensor(m->layers->ptr<models::MLPModuleImpl>(0)->net1->weight).size(0), 16);
}

// A module type whose parameter member swap_parameter does not know.
struct ScaleImpl : torch::nn::Module {
  ScaleImpl() { scale = register_parameter("scale", at::ones({6})); }
  at::Tensor forward(const at::Tensor& x) { return x * scale; }
  at::Tensor scale;
};
TORCH_MODULE(Scale);

DTENSOR_TEST_F(StyleRanks, CallErrorsNameTheStyleAndModule) {
  auto mesh = build_device_mesh();
  Scale s;
  EXPECT_PRED2(contains, error_of([&] { parallelize_module(s, mesh, SequenceParallel()); }),
               "SequenceParallel: the root module (dtensor::(anonymous namespace)::ScaleImpl) cannot be replicated: "
               "parameter 'scale' of dtensor::(anonymous namespace)::ScaleImpl has no known member");
  ThreeInputs m;
  parallelize_module(m, mesh, PrepareModuleInput().input_layouts({Shard{0}}).desired_input_layouts({Replicate{}}));
  EXPECT_PRED2(contains, error_of([&] { nn::call(m, values({4}), values({4}), int64_t{1}); }),
               "PrepareModuleInput at the root module: the module has 3 inputs but the layouts have 1 entries");
  ThreeInputs n;
  parallelize_module(n, mesh,
                     PrepareModuleInput()
                         .input_layouts({std::nullopt, std::nullopt, Replicate{}})
                         .desired_input_layouts({std::nullopt, std::nullopt, std::nullopt}));
  EXPECT_PRED2(contains, error_of([&] { nn::call(n, values({4}), values({4}), int64_t{1}); }),
               "PrepareModuleInput at the root module: input 2 is a Int, not a tensor");
  EXPECT_EQ(ColwiseParallel().to_string(),
            "ColwiseParallel(input_layouts=Replicate(), output_layouts=Shard(dim=-1), use_local_output=true)");
  EXPECT_EQ(SequenceParallel().to_string(), "SequenceParallel(sequence_dim=1, use_local_output=false)");
}

// ---- a user-written module tree (README) -----------------------------------------------------

// As the README shows: children called through dtensor::nn::call. The hidden dim is 3 per rank:
// column-sharded outputs are even (from_local of a style's input assumes even shards).
struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t ranks) {
    up = register_module("up", torch::nn::Linear(6, 3 * ranks));
    down = register_module("down", torch::nn::Linear(3 * ranks, 6));
    norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({6})));
  }
  at::Tensor forward(const at::Tensor& x) {
    return x + nn::call(down, at::gelu(nn::call(up, nn::call(norm, x))));
  }
  torch::nn::Linear up{nullptr}, down{nullptr};
  torch::nn::LayerNorm norm{nullptr};
};
TORCH_MODULE(Block);

DTENSOR_TEST_F(StyleRanks, UserModuleTreeWithCall) {
  auto mesh = build_device_mesh();
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    Block ref(ranks()), tp(ranks());
    set_parameters(*ref, 2);
    set_parameters(*tp, 2);
    ParallelizePlan plan = {{"up", ColwiseParallel()}, {"down", RowwiseParallel()}};
    if (sp) {
      plan = {{"norm", SequenceParallel()},
              {"up", ColwiseParallel().input_layouts(Shard{1})},
              {"down", RowwiseParallel().output_layouts(Shard{1})}};
    }
    parallelize_module(tp, mesh, plan);
    const at::Tensor x = values({2, 2 * ranks(), 6}, 1);
    // With sequence parallelism the block's input and output are this rank's sequence shard.
    at::Tensor y = nn::call(tp, sp ? shard_of(x, mesh, Shard{1}, false) : x);
    if (sp) y = from_local(y, mesh, {Shard{1}});
    EXPECT_TRUE(testing::tensors_close(nn::call(ref, x), gathered(y), 1e-5, 1e-6));
  }
}

// from_local keeps a contiguous local tensor (its spec's strides are contiguous).
// PyTorch's global strides of a permuted local tensor (compute_global_tensor_info: [1, 2n] for
// a [2, 3] local with strides [1, 2] sharded n ways on dim 0): view() refuses as it does on a
// plain tensor with those strides, and reshape() copies.
DTENSOR_TEST_F(StyleRanks, FromLocalOfTransposedTensorHasPyTorchStrides) {
  auto mesh = build_device_mesh();
  at::Tensor local = values({3, 2}).t();  // [2, 3], not contiguous
  at::Tensor d = from_local(local, mesh, {Shard{0}});
  EXPECT_TRUE(local_tensor(d).is_contiguous());
  EXPECT_EQ(d.strides(), (c10::IntArrayRef{1, 2 * ranks()}));
  EXPECT_PRED2(contains, error_of([&] { (void)d.view({6 * ranks()}); }), "view size is not compatible");
  at::Tensor v = d.reshape({6 * ranks()});
  EXPECT_TRUE(at::equal(gathered(v), at::cat(std::vector<at::Tensor>(static_cast<size_t>(ranks()), local)).reshape({6 * ranks()})));
}

}  // namespace
}  // namespace dtensor
