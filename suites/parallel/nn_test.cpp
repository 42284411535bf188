// dtensor::nn: parameter swap (registry + member, tied weights, errors, the set_data guard),
// forward hooks and call(), distribute_module, activation checkpointing, and attention on
// DTensors. Plain cases are ordinary tests; DTensor cases run as 4 threads.
#include "dtensor/compat.h"
#include "dtensor/nn/nn.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "models/models.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/errors.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <optional>
#include <thread>
#include <tuple>

namespace dtensor {
namespace {

using testing::contains;
using testing::error_of;
using testing::gathered;
using testing::values;

// A user-written module: two children called through dtensor::nn::call.
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl() {
    a = register_module("a", torch::nn::Linear(4, 6));
    b = register_module("b", torch::nn::Linear(6, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return nn::call(b, at::relu(nn::call(a, x))); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoLayer);

// A module with its own parameter member, unknown to swap_parameter until registered.
struct ScaleImpl : torch::nn::Module {
  ScaleImpl() { scale = register_parameter("scale", at::ones({3})); }
  at::Tensor forward(const at::Tensor& x) { return x * scale; }
  at::Tensor scale;
};
TORCH_MODULE(Scale);

// Several inputs and a tuple output.
struct PairImpl : torch::nn::Module {
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x, int64_t k, double f) {
    return {x * static_cast<double>(k), x + f};
  }
};
TORCH_MODULE(Pair);

void set_linear(torch::nn::LinearImpl& lin, double offset) {
  at::NoGradGuard no_grad;
  lin.weight.copy_(values(lin.weight.sizes().vec(), offset) * 0.5);
  if (lin.bias.defined()) lin.bias.copy_(values(lin.bias.sizes().vec(), offset + 1) * 0.1);
}

// ---- DeviceContext (NOTE: [Device context]) ------------------------------------------------

// As PyTorch's `with torch.device("meta"): model = Transformer(args)`: the model built in the
// context has the parameters, names and shapes of the one built on the CPU, all on the meta
// device; its forward runs there.
TEST(DeviceContext, BuildsAModelOnTheMetaDevice) {
  models::ModelArgs args;
  args.dropout_p = 0.0;
  models::Transformer cpu(args);
  std::optional<models::Transformer> meta;
  {
    nn::DeviceContext on_meta(c10::kMeta);
    ASSERT_TRUE(nn::DeviceContext::current().has_value());
    EXPECT_EQ(*nn::DeviceContext::current(), c10::Device(c10::kMeta));
    meta.emplace(args);
  }
  EXPECT_FALSE(nn::DeviceContext::current().has_value());
  const auto want = cpu->named_parameters(), got = (*meta)->named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].key(), want[i].key());
    EXPECT_TRUE(got[i].value().is_meta()) << got[i].key();
    EXPECT_EQ(got[i].value().sizes(), want[i].value().sizes()) << got[i].key();
    EXPECT_EQ(got[i].value().requires_grad(), want[i].value().requires_grad()) << got[i].key();
  }
  const at::Tensor tokens = at::zeros({2, 5}, at::kLong);
  const at::Tensor logits = nn::call(*meta, tokens.to(c10::kMeta));
  EXPECT_TRUE(logits.is_meta());
  EXPECT_EQ(logits.sizes(), nn::call(cpu, tokens).sizes());
}

// Only factories called without a device are redirected: a given device, ops on tensors and the
// ops' own work are as without the context; contexts nest; other threads are not affected.
TEST(DeviceContext, RedirectsOnlyFactoriesWithoutADevice) {
  const at::Tensor a = at::randn({3, 4}), b = at::randn({4, 2});
  nn::DeviceContext on_meta(c10::kMeta);
  EXPECT_TRUE(at::empty({2}).is_meta());
  EXPECT_TRUE(at::arange(5).is_meta());
  EXPECT_EQ(at::arange(5).sizes(), c10::IntArrayRef({5}));
  EXPECT_TRUE(at::randn({2, 2}).is_meta());
  EXPECT_TRUE(at::full({2}, 1.5, at::kDouble).is_meta());
  EXPECT_EQ(at::full({2}, 1.5, at::kDouble).scalar_type(), at::kDouble);
  EXPECT_EQ(at::zeros({2}, at::TensorOptions().device(c10::kCPU)).device(), c10::Device(c10::kCPU));
  EXPECT_EQ(at::empty_like(a).device(), c10::Device(c10::kCPU));
  EXPECT_EQ(a.to(at::kDouble).device(), c10::Device(c10::kCPU));
  // A CPU op's result, and its value, are what they are outside the context.
  const at::Tensor c = at::mm(a, b);
  EXPECT_EQ(c.device(), c10::Device(c10::kCPU));
  {
    nn::DeviceContext on_cpu(c10::kCPU);
    EXPECT_EQ(at::empty({2}).device(), c10::Device(c10::kCPU));
    EXPECT_TRUE(at::allclose(c, at::matmul(a, b)));
  }
  EXPECT_TRUE(at::empty({2}).is_meta()) << "the outer context again";
  c10::Device other_thread(c10::kMeta);
  std::thread([&] { other_thread = at::empty({2}).device(); }).join();
  EXPECT_EQ(other_thread, c10::Device(c10::kCPU));
}

// ---- swap_parameter ----------------------------------------------------------------------

TEST(SwapParameter, ReplacesRegistryAndMember) {
  torch::nn::Linear lin(4, 3);
  at::Tensor w = values({3, 4}).requires_grad_(true);
  nn::swap_parameter(*lin, "weight", w);
  EXPECT_TRUE(lin->weight.is_same(w));
  EXPECT_TRUE(lin->named_parameters()["weight"].is_same(w));
  at::Tensor x = values({2, 4}, 3);
  EXPECT_TRUE(at::allclose(lin->forward(x), at::linear(x, w, lin->bias)));
  // A non-leaf is detached (nn.Parameter semantics) and keeps the parameter's requires_grad.
  nn::swap_parameter(*lin, "bias", values({3}).requires_grad_(true) * 2);
  EXPECT_TRUE(lin->bias.is_leaf());
  EXPECT_TRUE(lin->bias.requires_grad());
  lin->weight.set_requires_grad(false);
  at::Tensor w2 = values({3, 4}, 1).requires_grad_(true);
  nn::swap_parameter(*lin, "weight", w2);
  EXPECT_FALSE(lin->weight.requires_grad());
}

TEST(SwapParameter, BuiltInMembers) {
  torch::nn::Embedding emb(5, 4);
  torch::nn::LayerNorm norm(torch::nn::LayerNormOptions({4}));
  nn::swap_parameter(*emb, "weight", values({5, 4}));
  nn::swap_parameter(*norm, "weight", values({4}, 1));
  nn::swap_parameter(*norm, "bias", values({4}, 2));
  EXPECT_TRUE(at::equal(emb->weight, values({5, 4})));
  EXPECT_TRUE(at::equal(norm->weight, values({4}, 1)));
  EXPECT_TRUE(at::equal(norm->bias, values({4}, 2)));
  EXPECT_TRUE(nn::has_parameter_member(*emb, "weight"));
  EXPECT_FALSE(nn::has_parameter_member(*emb, "bias"));
}

TEST(SwapParameter, ErrorsNameModuleAndParameter) {
  torch::nn::Linear lin(torch::nn::LinearOptions(4, 3).bias(false));
  EXPECT_PRED2(contains, error_of([&] { nn::swap_parameter(*lin, "weigth", values({3, 4})); }),
               "torch::nn::LinearImpl has no parameter 'weigth' to replace (its parameters: weight, bias (undefined))");
  EXPECT_PRED2(contains, error_of([&] { nn::swap_parameter(*lin, "bias", values({3})); }),
               "has no parameter 'bias' to replace");
  EXPECT_PRED2(contains, error_of([&] { nn::swap_parameter(*lin, "weight", values({4, 3})); }),
               "torch::nn::LinearImpl.weight has shape [3, 4] but the new value has shape [4, 3]");
  Scale s;
  EXPECT_PRED2(contains, error_of([&] { nn::swap_parameter(*s, "scale", values({3})); }),
               "no member of dtensor::(anonymous namespace)::ScaleImpl is known to hold parameter 'scale'. Register it once with "
               "dtensor::nn::register_parameter_member<YourModuleImpl>(\"scale\"");
  nn::register_parameter_member<ScaleImpl>("scale", &ScaleImpl::scale);
  nn::swap_parameter(*s, "scale", values({3}));
  EXPECT_TRUE(at::equal(s->forward(at::ones({3})), values({3})));
}

TEST(SwapParameter, TiedWeightIsListedOnceAndSharesGradients) {
  torch::nn::Embedding emb(6, 4);
  torch::nn::Linear out(torch::nn::LinearOptions(4, 6).bias(false));
  nn::swap_parameter(*out, "weight", emb->weight);
  auto root = std::make_shared<torch::nn::Module>();
  root->register_module("emb", emb);
  root->register_module("out", out);
  auto named = nn::named_parameters(*root);
  ASSERT_EQ(named.size(), 1u);
  EXPECT_EQ(named[0].first, "emb.weight");
  EXPECT_EQ(root->named_parameters().size(), 2u);  // libtorch's own listing repeats it
  at::Tensor tokens = at::tensor({1, 3, 5}, at::kLong);
  out->forward(emb->forward(tokens)).sum().backward();
  ASSERT_TRUE(emb->weight.grad().defined());
  EXPECT_TRUE(out->weight.grad().is_same(emb->weight.grad()));
}

// ---- hooks and call() --------------------------------------------------------------------

TEST(ForwardHooks, RunAroundForwardThroughCall) {
  TwoLayer m;
  set_linear(*m->a, 0);
  set_linear(*m->b, 2);
  const at::Tensor x = values({2, 4}, 5);
  const at::Tensor plain = m->forward(x);
  std::vector<std::string> order;
  auto pre = nn::register_forward_pre_hook(*m->a, [&](torch::nn::Module& mod, nn::ForwardInputs& in) {
    order.push_back("pre " + mod.name());
    in[0] = in[0].toTensor() * 2;
  });
  auto post = nn::register_forward_hook(*m->a, [&](torch::nn::Module&, const nn::ForwardInputs& in, c10::IValue& out) {
    order.push_back("post");
    EXPECT_TRUE(at::allclose(in[0].toTensor(), x * 2));  // the inputs forward saw
    out = out.toTensor() + 1;
  });
  EXPECT_EQ(nn::num_forward_hooks(*m->a), 2u);
  const at::Tensor hooked = m->forward(x);
  EXPECT_EQ(order, (std::vector<std::string>{"pre torch::nn::LinearImpl", "post"}));
  EXPECT_TRUE(at::allclose(hooked, m->b->forward(at::relu(m->a->forward(x * 2) + 1))));
  // Called directly, a child runs without its hooks.
  EXPECT_TRUE(at::allclose(m->a->forward(x), at::linear(x, m->a->weight, m->a->bias)));
  pre.remove();
  EXPECT_FALSE(pre.is_active());
  EXPECT_TRUE(post.is_active());
  post.remove();
  post.remove();  // twice: nothing
  EXPECT_EQ(nn::num_forward_hooks(*m->a), 0u);
  EXPECT_TRUE(at::allclose(m->forward(x), plain));
}

TEST(ForwardHooks, SeveralArgumentsAndTupleOutput) {
  Pair p;
  auto h = nn::register_forward_pre_hook(*p, [](torch::nn::Module&, nn::ForwardInputs& in) {
    in[1] = in[1].toInt() + 1;
  });
  auto g = nn::register_forward_hook(*p, [](torch::nn::Module&, const nn::ForwardInputs&, c10::IValue& out) {
    auto t = out.toTuple();
    out = c10::ivalue::Tuple::create({t->elements()[1], t->elements()[0]});
  });
  at::Tensor a, b;
  std::tie(a, b) = nn::call(p, at::ones({2}), int64_t{2}, 0.5);
  EXPECT_TRUE(at::allclose(a, at::full({2}, 1.5)));
  EXPECT_TRUE(at::allclose(b, at::full({2}, 3.0)));
}

TEST(ForwardHooks, Errors) {
  torch::nn::LinearImpl on_stack(4, 3);
  EXPECT_PRED2(contains, error_of([&] { nn::register_forward_pre_hook(on_stack, [](auto&, auto&) {}); }),
               "register_forward_pre_hook: the torch::nn::LinearImpl is not owned by a std::shared_ptr");
  torch::nn::Linear lin(4, 3);
  auto h = nn::register_forward_pre_hook(*lin, [](torch::nn::Module&, nn::ForwardInputs& in) {
    in.push_back(at::ones({1}));
  });
  EXPECT_PRED2(contains, error_of([&] { nn::call(lin, at::ones({2, 4})); }),
               "a forward pre-hook of torch::nn::LinearImpl changed the number of inputs from 1 to 2");
}

TEST(ForwardHooks, OverrideReplacesForwardBetweenTheHooks) {
  torch::nn::Linear lin(4, 3);
  set_linear(*lin, 1);
  const at::Tensor x = values({2, 4}, 3);
  std::vector<std::string> order;
  auto pre = nn::register_forward_pre_hook(*lin, [&](torch::nn::Module&, nn::ForwardInputs& in) {
    order.push_back("pre");
    in[0] = in[0].toTensor() * 2;
  });
  auto over = nn::register_forward_override(*lin, [&](torch::nn::Module& m, const nn::ForwardInputs& in) {
    order.push_back("override");
    auto& l = dynamic_cast<torch::nn::LinearImpl&>(m);
    return c10::IValue(at::matmul(in[0].toTensor(), l.weight.t()) - 5);  // no bias: not forward's result
  });
  auto post = nn::register_forward_hook(*lin, [&](torch::nn::Module&, const nn::ForwardInputs& in, c10::IValue& out) {
    order.push_back("post");
    EXPECT_TRUE(at::allclose(in[0].toTensor(), x * 2));
    out = out.toTensor() * 3;
  });
  EXPECT_EQ(nn::num_forward_hooks(*lin), 3u);
  EXPECT_TRUE(at::allclose(nn::call(lin, x), (at::matmul(x * 2, lin->weight.t()) - 5) * 3));
  EXPECT_EQ(order, (std::vector<std::string>{"pre", "override", "post"}));
  // One override per module.
  EXPECT_PRED2(contains, error_of([&] {
                 nn::register_forward_override(*lin, [](torch::nn::Module&, const nn::ForwardInputs&) {
                   return c10::IValue();
                 });
               }),
               "register_forward_override: the torch::nn::LinearImpl already has a forward override");
  // Removed, forward runs again (the hooks stay).
  over.remove();
  EXPECT_FALSE(over.is_active());
  EXPECT_TRUE(at::allclose(nn::call(lin, x), lin->forward(x * 2) * 3));
  pre.remove();
  post.remove();
  EXPECT_EQ(nn::num_forward_hooks(*lin), 0u);
}

TEST(ForwardHooks, DieWithTheirModule) {
  const torch::nn::Module* address = nullptr;
  auto captured = std::make_shared<int>(0);  // stands for what a style's hook holds (a mesh)
  {
    torch::nn::Linear lin(4, 3);
    address = lin.ptr().get();
    nn::register_forward_pre_hook(*lin, [captured](torch::nn::Module&, nn::ForwardInputs& in) {
      in[0] = in[0].toTensor() * 0;
    });
    EXPECT_EQ(nn::num_forward_hooks(*lin), 1u);
    EXPECT_EQ(captured.use_count(), 2);
  }
  // The next registration releases the dead module's hooks.
  torch::nn::Linear other(2, 2);
  nn::register_forward_hook(*other, [](torch::nn::Module&, const nn::ForwardInputs&, c10::IValue&) {});
  EXPECT_EQ(captured.use_count(), 1);
  // Allocations of the same size often reuse the address: the new module has no hooks either way.
  torch::nn::Linear next(4, 3);
  SCOPED_TRACE(next.ptr().get() == address ? "same address" : "other address");
  EXPECT_EQ(nn::num_forward_hooks(*next), 0u);
  const at::Tensor x = values({2, 4});
  EXPECT_TRUE(at::allclose(nn::call(next, x), next->forward(x)));
}

// ---- activation checkpointing ------------------------------------------------------------

TEST(Checkpoint, SameOutputAndGradientsAsPlainRun) {
  TwoLayer ref, ck;
  for (auto* m : {&ref, &ck}) {
    set_linear(*(*m)->a, 0);
    set_linear(*(*m)->b, 2);
  }
  const at::Tensor x0 = values({3, 4}, 7);
  at::Tensor x1 = x0.clone().requires_grad_(true), x2 = x0.clone().requires_grad_(true);
  at::Tensor y1 = ref->forward(x1);
  TwoLayer held = ck;
  at::Tensor y2 = nn::checkpoint([held](const at::Tensor& x) { return nn::call(held, x); }, x2);
  EXPECT_TRUE(at::allclose(y1, y2));
  EXPECT_EQ(y2.grad_fn()->name(), "dtensor::nn::CheckpointBackward");
  (y1 * y1).sum().backward();
  (y2 * y2).sum().backward();
  EXPECT_TRUE(at::allclose(x1.grad(), x2.grad()));
  EXPECT_TRUE(at::allclose(ref->a->weight.grad(), ck->a->weight.grad()));
  EXPECT_TRUE(at::allclose(ref->b->bias.grad(), ck->b->bias.grad()));
  // Without grad mode it is just the call.
  at::NoGradGuard no_grad;
  EXPECT_FALSE(nn::checkpoint([held](const at::Tensor& x) { return nn::call(held, x); }, x0).requires_grad());
}

TEST(Checkpoint, RestoresRngStateForRecomputation) {
  auto drop = [](const at::Tensor& x) { return at::dropout(x * 1.0, 0.5, /*train=*/true); };
  at::Tensor x = at::ones({64}).requires_grad_(true);
  at::Tensor y = nn::checkpoint(drop, x);
  y.sum().backward();
  // The recomputed dropout mask equals the forward one: the gradient is 2 where y kept a value.
  EXPECT_TRUE(at::equal(x.grad(), (y > 0).to(at::kFloat) * 2)) << x.grad() << y;
}

// ---- DTensor cases (threads) -------------------------------------------------------------

class NnRanks : public testing::DTensorOpTestBase {};

DTENSOR_TEST_F(NnRanks, SwappedDTensorParametersTrainLikePlain) {
  auto mesh = build_device_mesh();
  TwoLayer ref, dist;
  for (auto* m : {&ref, &dist}) {
    set_linear(*(*m)->a, 0);
    set_linear(*(*m)->b, 2);
  }
  nn::swap_parameter(*dist->a, "weight", distribute_tensor(dist->a->weight.detach(), mesh, {Shard{0}}));
  nn::swap_parameter(*dist->a, "bias", distribute_tensor(dist->a->bias.detach(), mesh, {Shard{0}}));
  nn::swap_parameter(*dist->b, "weight", distribute_tensor(dist->b->weight.detach(), mesh, {Shard{1}}));
  nn::distribute_parameters(*dist->b, mesh, {Replicate{}});  // the bias; the weight is left alone
  EXPECT_EQ(get_spec(dist->b->weight).placements, std::vector<Placement>{Shard{1}});
  EXPECT_TRUE(is_dtensor(dist->b->bias));
  for (const auto& p : dist->parameters()) EXPECT_TRUE(is_dtensor(p) && p.requires_grad() && p.is_leaf());
  const at::Tensor x = values({5, 4}, 3);
  at::Tensor y_ref = ref->forward(x);
  at::Tensor y = dist->forward(distribute_tensor(x, mesh, {Replicate{}}));
  EXPECT_TRUE(testing::tensors_close(y_ref, full_tensor(y), 1e-5, 1e-6));
  y_ref.pow(2).sum().backward();
  y.pow(2).sum().backward();
  auto rp = nn::named_parameters(*ref), dp = nn::named_parameters(*dist);
  ASSERT_EQ(rp.size(), dp.size());
  for (size_t i = 0; i < rp.size(); ++i) {
    SCOPED_TRACE(rp[i].first);
    EXPECT_TRUE(testing::tensors_close(rp[i].second.grad(), gathered(dp[i].second.grad()), 1e-4, 1e-5));
  }
}

DTENSOR_TEST_F(NnRanks, CloneOfDTensorModuleFailsClearly) {
  auto mesh = build_device_mesh();
  torch::nn::Linear lin(4, 3);
  nn::distribute_parameters(*lin, mesh, {Replicate{}});
  // Module::clone() calls plain.set_data(dtensor) (NOTE: [Plain tensor with the DTensor key]).
  auto copy = std::dynamic_pointer_cast<torch::nn::LinearImpl>(lin->clone());
  EXPECT_PRED2(contains, error_of([&] { copy->forward(distribute_tensor(at::ones({2, 4}), mesh, {Replicate{}})); }),
               "carries the DTensor dispatch key: it was given a DTensor's data with set_data()");
}

DTENSOR_TEST_F(NnRanks, DistributeModuleReplicatesAndRunsInputOutputFns) {
  auto mesh = build_device_mesh();
  TwoLayer m, ref;
  for (auto* t : {&m, &ref}) {
    set_linear(*(*t)->a, 0);
    set_linear(*(*t)->b, 2);
  }
  auto handles = nn::distribute_module(
      *m, mesh, nullptr,
      [](torch::nn::Module&, nn::ForwardInputs& in, const DeviceMesh& mesh) {
        in[0] = distribute_tensor(in[0].toTensor(), mesh, {Shard{0}});
      },
      [](torch::nn::Module&, c10::IValue& out, const DeviceMesh&) { out = full_tensor(out.toTensor()); });
  ASSERT_EQ(handles.size(), 2u);
  for (const auto& kv : m->named_parameters())
    EXPECT_EQ(get_spec(kv.value()).placements, std::vector<Placement>{Replicate{}}) << kv.key();
  const at::Tensor x = values({8, 4}, 1);
  at::Tensor y = nn::call(m, x);
  EXPECT_FALSE(is_dtensor(y));
  EXPECT_TRUE(testing::tensors_close(ref->forward(x), y));
  for (auto& h : handles) h.remove();
  EXPECT_TRUE(is_dtensor(nn::call(m, distribute_tensor(x, mesh, {Replicate{}}))));
}

DTENSOR_TEST_F(NnRanks, CheckpointOnDTensors) {
  auto mesh = build_device_mesh();
  TwoLayer ref, ck;
  for (auto* t : {&ref, &ck}) {
    set_linear(*(*t)->a, 0);
    set_linear(*(*t)->b, 2);
  }
  nn::distribute_parameters(*ck->a, mesh, {Replicate{}});
  nn::distribute_parameters(*ck->b, mesh, {Replicate{}});
  const at::Tensor x = values({8, 4}, 2);
  at::Tensor xr = x.clone().requires_grad_(true);
  at::Tensor xd = distribute_tensor(x, mesh, {Shard{0}}).requires_grad_(true);
  at::Tensor yr = ref->forward(xr);
  at::Tensor yd = nn::checkpoint([ck](const at::Tensor& t) { return nn::call(ck, t); }, xd);
  EXPECT_TRUE(testing::tensors_close(yr, full_tensor(yd)));
  yr.sum().backward();
  yd.sum().backward();
  EXPECT_TRUE(testing::tensors_close(xr.grad(), full_tensor(xd.grad()), 1e-5, 1e-6));
  EXPECT_TRUE(testing::tensors_close(ref->a->weight.grad(), full_tensor(ck->a->weight.grad()), 1e-4, 1e-5));
}

// ---- attention ---------------------------------------------------------------------------

TEST(ScaledDotProductAttention, PlainTensorsGoToLibtorch) {
  const at::Tensor q = values({2, 3, 5, 4}), k = values({2, 3, 5, 4}, 1), v = values({2, 3, 5, 2}, 2);
  for (bool causal : {false, true}) {
    const at::Tensor expected = compat::scaled_dot_product_attention(q, k, v, {}, 0.0, causal);
    EXPECT_TRUE(at::equal(nn::functional::scaled_dot_product_attention(q, k, v, {}, 0.0, causal), expected));
  }
}

DTENSOR_TEST_F(NnRanks, AttentionOnShardedDTensorsMatchesPlain) {
  auto mesh = build_device_mesh();
  const at::Tensor q = values({4, 4, 6, 3}), k = values({4, 4, 6, 3}, 1), v = values({4, 4, 6, 2}, 2);
  const at::Tensor mask = at::ones({6, 6}, at::kBool).triu(2).logical_not();
  struct Case {
    const char* what;
    Placement p;
    std::vector<Placement> expected;  // placements of the result
  };
  const std::vector<Case> cases = {{"batch", Shard{0}, {Shard{0}}},
                                   {"heads", Shard{1}, {Shard{1}}},
                                   {"sequence (gathered)", Shard{2}, {Replicate{}}},
                                   {"replicate", Replicate{}, {Replicate{}}},
                                   {"partial (reduced)", Partial{}, {Replicate{}}}};
  for (const auto& c : cases) {
    for (int variant = 0; variant < 3; ++variant) {  // causal, plain, with a mask
      SCOPED_TRACE(std::string(c.what) + " variant " + std::to_string(variant));
      const bool causal = variant == 0;
      const at::Tensor m = variant == 2 ? mask : at::Tensor();
      std::vector<at::Tensor> plain = {q.clone().requires_grad_(true), k.clone().requires_grad_(true),
                                       v.clone().requires_grad_(true)};
      at::Tensor expected = nn::functional::scaled_dot_product_attention(plain[0], plain[1], plain[2], m, 0.0, causal);
      std::vector<at::Tensor> dist;
      for (auto& t : plain) dist.push_back(distribute_tensor(t.detach(), mesh, {c.p}).requires_grad_(true));
      at::Tensor out = nn::functional::scaled_dot_product_attention(dist[0], dist[1], dist[2], m, 0.0, causal);
      EXPECT_EQ(get_spec(out).placements, c.expected);
      EXPECT_TRUE(testing::tensors_close(expected, full_tensor(out), 1e-5, 1e-6));
      (expected * expected).sum().backward();
      (out * out).sum().backward();
      for (size_t i = 0; i < 3; ++i)
        EXPECT_TRUE(testing::tensors_close(plain[i].grad(), full_tensor(dist[i].grad()), 1e-4, 1e-5)) << i;
    }
  }
}

DTENSOR_TEST_F(NnRanks, AttentionErrors) {
  auto mesh = build_device_mesh();
  const at::Tensor q = values({4, 4, 6, 3});
  at::Tensor dq = distribute_tensor(q, mesh, {Shard{1}});
  EXPECT_PRED2(contains, error_of([&] { nn::functional::scaled_dot_product_attention(dq, q, q); }),
               "query, key and value must all be DTensors or all plain tensors; got 1 DTensors");
  // A mask of size 1 along the sharded dim broadcasts; one with entries there cannot.
  EXPECT_EQ(nn::functional::scaled_dot_product_attention(dq, dq, dq, at::zeros({4, 1, 6, 6})).sizes(), q.sizes());
  at::Tensor db = distribute_tensor(q, mesh, {Shard{0}});
  EXPECT_PRED2(contains,
               error_of([&] { nn::functional::scaled_dot_product_attention(db, db, db, at::zeros({4, 1, 6, 6})); }),
               "attn_mask of shape [4, 1, 6, 6] has 4 entries along dim 0 of the query, which is sharded");
  EXPECT_PRED2(contains,
               error_of([&] { nn::functional::scaled_dot_product_attention(dq, dq, dq, at::zeros({4, 4, 6, 6})); }),
               "attn_mask of shape [4, 4, 6, 6] has 4 entries along dim 1 of the query, which is sharded");
}

}  // namespace
}  // namespace dtensor
