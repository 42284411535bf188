// FSDP2 (dtensor/fsdp): fully_shard training parity with one rank trained on the global batch
// (MLPStacked, a MLP with uneven dims 7/15/17/3 whose shards are uneven and empty, and the
// Transformer), SGD and Adam, reshard_after_forward true / false / 2; collectives per step
// against PyTorch's counts (test_fully_shard_comm.py); gradient accumulation; the FSDPModule
// API; the errors of fully_shard on every rank. PyTorch's parity check: each sharded parameter
// and gradient equals distribute_tensor of the reference on the same mesh and placements.
#include "dtensor/fsdp/fsdp.h"
#include "dtensor/nn/nn.h"
#include "harness/harness.h"
#include "models/models.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/counting_group.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

namespace dtensor {
namespace {

using models::ModelArgs;
using testing::values;

constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;

void init_deterministic(torch::nn::Module& m) {
  at::NoGradGuard no_grad;
  double offset = 0;
  for (auto& kv : nn::named_parameters(m)) {
    at::Tensor& p = kv.second;
    const bool norm_weight = kv.first.find("norm.weight") != std::string::npos;
    p.copy_(norm_weight ? 1 + 0.1 * values(p.sizes().vec(), offset) : 0.4 * values(p.sizes().vec(), offset));
    offset += 1.3;
  }
}

// Linear + ReLU; its children are called through nn::call.
class BlockImpl : public torch::nn::Module {
 public:
  BlockImpl(int64_t in, int64_t out) : lin(register_module("lin", torch::nn::Linear(in, out))) {}
  at::Tensor forward(const at::Tensor& x) { return at::relu(nn::call(lin, x)); }
  torch::nn::Linear lin;
};
TORCH_MODULE(Block);

// Dims 7 -> 15 -> 17 -> 3 -> 7 on 4 ranks: rows 2,2,2,1 / 4,4,4,3 / 5,5,5,2 / 1,1,1,0 (an empty
// shard); the head stays with the root.
class UnevenMLPImpl : public torch::nn::Module {
 public:
  UnevenMLPImpl() {
    layers = register_module("layers", torch::nn::ModuleList());
    layers->push_back(Block(7, 15));
    layers->push_back(Block(15, 17));
    layers->push_back(Block(17, 3));
    head = register_module("head", torch::nn::Linear(3, 7));
  }
  at::Tensor forward(at::Tensor x) {
    for (size_t i = 0; i < layers->size(); ++i) x = nn::call(layers->ptr<BlockImpl>(i), x);
    return nn::call(head, x);
  }
  torch::nn::ModuleList layers{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(UnevenMLP);

enum class Optim { kSGD, kAdam };
std::unique_ptr<torch::optim::Optimizer> make_optimizer(Optim o, const std::vector<at::Tensor>& params) {
  if (o == Optim::kSGD) return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
  return std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(0.01));
}

// PyTorch's check_sharded_parity: every sharded parameter (or gradient) of `sharded` equals
// distribute_tensor of `ref`'s on the same mesh and placements. Collective.
void expect_sharded_parity(torch::nn::Module& ref, torch::nn::Module& sharded, bool grads, const std::string& when) {
  auto r = nn::named_parameters(ref), s = nn::named_parameters(sharded);
  ASSERT_EQ(r.size(), s.size()) << when;
  for (size_t i = 0; i < r.size(); ++i) {
    SCOPED_TRACE(when + ": " + r[i].first + (grads ? " (gradient)" : ""));
    ASSERT_EQ(r[i].first, s[i].first);
    ASSERT_TRUE(is_dtensor(s[i].second)) << "not sharded";
    const at::Tensor& a = grads ? r[i].second.grad() : r[i].second;
    const at::Tensor& b = grads ? s[i].second.grad() : s[i].second;
    ASSERT_TRUE(a.defined() && b.defined());
    ASSERT_TRUE(is_dtensor(b));
    const DTensorSpec& spec = get_spec(s[i].second);
    EXPECT_EQ(get_spec(b).placements.size(), spec.placements.size());
    at::Tensor expected = distribute_tensor(a.detach(), spec.mesh, spec.placements);
    EXPECT_TRUE(testing::tensors_close(local_tensor(expected), local_tensor(b), kRtol, kAtol));
  }
}

at::Tensor mean_square(const at::Tensor& out) { return out.pow(2).mean(); }

// This rank's rows of a global batch.
at::Tensor my_rows(const at::Tensor& global, int rank, int world) {
  const int64_t per = global.size(0) / world;
  return global.narrow(0, rank * per, per);
}

// The mean of a scalar over the ranks (collective).
double mean_over_ranks(testing::MultiRankTest& t, const at::Tensor& scalar) {
  at::Tensor v = scalar.detach().clone().reshape({1});
  t.group().all_reduce(v, comm::ReduceOp::SUM);
  return v.item<double>() / t.group().size();
}

struct ParityCase {
  std::optional<fsdp::ReshardAfterForward> reshard_after_forward;
  Optim optim = Optim::kSGD;
  int steps = 5;
};

std::string describe(const ParityCase& c) {
  return std::string(c.optim == Optim::kSGD ? "SGD" : "Adam") + " reshard_after_forward=" +
         (c.reshard_after_forward ? c.reshard_after_forward->to_string() : "default");
}

// Trains `ref` on the global batch and `model` (sharded by `shard`) on this rank's rows for
// c.steps steps, checking loss, gradients and parameters each step, and the collectives of
// each step: forward all-gathers = groups, backward all-gathers = expected_backward_ag,
// reduce-scatters = groups.
template <class Model>
void check_parity(testing::MultiRankTest& t, const std::function<Model()>& make,
                  const std::function<int(Model&, const DeviceMesh&, const fsdp::FullyShardOptions&)>& shard,
                  const at::Tensor& global_input, const ParityCase& c,
                  const std::function<int(int groups)>& expected_backward_ag) {
  SCOPED_TRACE(describe(c));
  auto counting = std::make_shared<testing::CountingGroup>(t.group_ptr());
  auto mesh = init_device_mesh("cpu", {t.group().size()}, {}, counting);
  Model ref = make(), model = make();
  init_deterministic(*ref);
  init_deterministic(*model);
  fsdp::FullyShardOptions opts;
  opts.mesh = mesh;
  opts.reshard_after_forward = c.reshard_after_forward;
  const int groups = shard(model, mesh, opts);
  auto opt_ref = make_optimizer(c.optim, nn::parameters(*ref));
  auto opt = make_optimizer(c.optim, nn::parameters(*model));
  const at::Tensor input = my_rows(global_input, t.rank(), t.group().size());
  for (int step = 0; step < c.steps; ++step) {
    const std::string when = "step " + std::to_string(step);
    opt_ref->zero_grad();
    opt->zero_grad();
    at::Tensor loss_ref = mean_square(nn::call(ref, global_input));
    counting->reset();
    at::Tensor loss = mean_square(nn::call(model, input));
    auto fwd = counting->counts();
    EXPECT_EQ(fwd["all_gather_into"], groups) << when << " forward all-gathers";
    EXPECT_EQ(fwd["reduce_scatter_into"], 0) << when;
    EXPECT_NEAR(loss_ref.item<double>(), mean_over_ranks(t, loss), 1e-5) << when << " loss";
    loss_ref.backward();
    counting->reset();
    loss.backward();
    auto bwd = counting->counts();
    EXPECT_EQ(bwd["all_gather_into"], expected_backward_ag(groups)) << when << " backward all-gathers";
    EXPECT_EQ(bwd["reduce_scatter_into"], groups) << when << " reduce-scatters";
    expect_sharded_parity(*ref, *model, /*grads=*/true, when);
    opt_ref->step();
    opt->step();
    expect_sharded_parity(*ref, *model, /*grads=*/false, when + " after the step");
  }
}

int backward_all_gathers(const ParityCase& c, int groups) {
  if (!c.reshard_after_forward) return groups - 1;  // the root keeps its parameters
  const auto& r = *c.reshard_after_forward;
  if (!r.is_int() && r.value() == 1) return 0;       // false
  return groups;                                     // true or 2, set on the root too
}

int shard_uneven(UnevenMLP& m, const DeviceMesh&, const fsdp::FullyShardOptions& opts) {
  for (size_t i = 0; i < m->layers->size(); ++i) fsdp::fully_shard(*m->layers->ptr(i), opts);
  fsdp::fully_shard(m, opts);
  return static_cast<int>(m->layers->size()) + 1;
}

int shard_stacked(models::MLPStacked& m, const DeviceMesh&, const fsdp::FullyShardOptions& opts) {
  for (size_t i = 0; i < m->layers->size(); ++i) fsdp::fully_shard(*m->layers->ptr(i), opts);
  fsdp::fully_shard(m, opts);  // no parameters of its own: no group
  return static_cast<int>(m->layers->size());
}

int shard_transformer(models::Transformer& m, const DeviceMesh&, const fsdp::FullyShardOptions& opts) {
  for (size_t i = 0; i < m->layers->size(); ++i) fsdp::fully_shard(*m->layers->ptr(i), opts);
  fsdp::fully_shard(m, opts);
  return static_cast<int>(m->layers->size()) + 1;
}

ModelArgs uneven_args() {
  ModelArgs args;
  args.dropout_p = 0.0;
  args.vocab_size = 7;    // tok_embeddings and the tied output: 7 rows
  args.max_seq_len = 15;  // pos_embeddings: 15 rows
  return args;
}

at::Tensor tokens_for(const ModelArgs& args, int64_t batch, int64_t seq) {
  return (at::arange(batch * seq, at::kLong) * 5 + 3).remainder(args.vocab_size).view({batch, seq});
}

std::vector<ParityCase> parity_cases() {
  std::vector<ParityCase> out;
  for (Optim o : {Optim::kSGD, Optim::kAdam}) {
    out.push_back({std::nullopt, o});
    out.push_back({fsdp::ReshardAfterForward(false), o});
    out.push_back({fsdp::ReshardAfterForward(2), o});
  }
  return out;
}

void uneven_mlp_parity(testing::MultiRankTest& t, const std::vector<ParityCase>& cases) {
  for (const auto& c : cases) {
    check_parity<UnevenMLP>(t, [] { return UnevenMLP(); }, shard_uneven, values({8, 7}, 0.3), c,
                            [&](int g) { return backward_all_gathers(c, g); });
  }
}

void stacked_parity(testing::MultiRankTest& t, const std::vector<ParityCase>& cases) {
  for (const auto& c : cases) {
    // The root has no parameters: every group is a block, resharded after forward unless false.
    check_parity<models::MLPStacked>(
        t, [] { return models::MLPStacked(c10::Device(c10::kCPU), 3); }, shard_stacked, values({8, 10}, 0.1), c,
        [&](int g) {
          return c.reshard_after_forward && !c.reshard_after_forward->is_int() && c.reshard_after_forward->value() == 1
                     ? 0
                     : g;
        });
  }
}

void transformer_parity(testing::MultiRankTest& t, const std::vector<ParityCase>& cases) {
  const ModelArgs args = uneven_args();
  for (const auto& c : cases) {
    check_parity<models::Transformer>(t, [args] { return models::Transformer(args); }, shard_transformer,
                                      tokens_for(args, 8, 6), c, [&](int g) { return backward_all_gathers(c, g); });
  }
}

class FsdpGloo : public testing::DTensorTestBase {};
class FsdpThreads : public testing::DTensorOpTestBase {};

DTENSOR_TEST_F(FsdpThreads, UnevenMLPTrainingMatchesOneRank) { uneven_mlp_parity(*this, parity_cases()); }
DTENSOR_TEST_F(FsdpThreads, MLPStackedTrainingMatchesOneRank) { stacked_parity(*this, parity_cases()); }
DTENSOR_TEST_F(FsdpThreads, TransformerTrainingMatchesOneRank) { transformer_parity(*this, parity_cases()); }
DTENSOR_TEST_F(FsdpGloo, UnevenMLPTrainingMatchesOneRank) {
  uneven_mlp_parity(*this, {{std::nullopt, Optim::kAdam}, {fsdp::ReshardAfterForward(2), Optim::kSGD}});
}
DTENSOR_TEST_F(FsdpGloo, TransformerTrainingMatchesOneRank) {
  transformer_parity(*this, {{std::nullopt, Optim::kAdam}, {fsdp::ReshardAfterForward(false), Optim::kSGD}});
}

// The sharded parameters: DTensor Shard(0) leaves holding torch.chunk's rows, empty shards
// included; fully_shard itself does not communicate.
DTENSOR_TEST_F(FsdpThreads, ParametersAreShardedLikeTorchChunk) {
  auto counting = std::make_shared<testing::CountingGroup>(group_ptr());
  auto mesh = init_device_mesh("cpu", {4}, {}, counting);
  UnevenMLP m;
  init_deterministic(*m);
  auto full = nn::named_parameters(*m);
  std::vector<at::Tensor> originals;
  for (auto& kv : full) originals.push_back(kv.second.detach().clone());
  fsdp::FullyShardOptions opts;
  opts.mesh = mesh;
  counting->reset();
  shard_uneven(m, mesh, opts);
  EXPECT_EQ(counting->collectives(), 0);
  auto sharded = nn::named_parameters(*m);
  ASSERT_EQ(sharded.size(), full.size());
  for (size_t i = 0; i < sharded.size(); ++i) {
    SCOPED_TRACE(sharded[i].first);
    const at::Tensor& p = sharded[i].second;
    ASSERT_TRUE(is_dtensor(p));
    EXPECT_TRUE(p.is_leaf());
    EXPECT_TRUE(p.requires_grad());
    EXPECT_EQ(p.sizes(), originals[i].sizes());
    const int64_t d = originals[i].size(0), chunk = (d + 3) / 4;
    const int64_t start = std::min(d, rank() * chunk), rows = std::max<int64_t>(0, std::min(chunk, d - rank() * chunk));
    EXPECT_TRUE(local_tensor(p).equal(originals[i].narrow(0, start, rows)));
    EXPECT_TRUE(std::holds_alternative<Shard>(get_spec(p).placements[0]));
  }
  // Layer 2's bias has 3 rows: rank 3 holds none.
  const at::Tensor& bias = nn::named_parameters(*m->layers[2])[1].second;
  EXPECT_EQ(local_tensor(bias).size(0), rank() == 3 ? 0 : 1);
}

// Two micro-batches without gradient sync, then one with it, equal one step on the whole
// batch; the micro-batches without sync reduce nothing.
DTENSOR_TEST_F(FsdpThreads, GradientAccumulationEqualsOneLargeBatch) {
  auto counting = std::make_shared<testing::CountingGroup>(group_ptr());
  auto mesh = init_device_mesh("cpu", {4}, {}, counting);
  UnevenMLP ref, model;
  init_deterministic(*ref);
  init_deterministic(*model);
  fsdp::FullyShardOptions opts;
  opts.mesh = mesh;
  shard_uneven(model, mesh, opts);
  auto root = *fsdp::get_fsdp_module(*model);
  const at::Tensor global = values({24, 7}, 0.2);
  mean_square(nn::call(ref, global)).backward();
  const at::Tensor mine = my_rows(global, rank(), 4);  // 6 rows: 3 micro-batches of 2
  for (int micro = 0; micro < 3; ++micro) {
    root.set_requires_gradient_sync(micro == 2);
    counting->reset();
    (mean_square(nn::call(model, mine.narrow(0, 2 * micro, 2))) / 3).backward();
    EXPECT_EQ(counting->counts()["reduce_scatter_into"], micro == 2 ? 4 : 0) << "micro-batch " << micro;
    if (micro < 2) {
      for (auto& p : nn::parameters(*model)) EXPECT_FALSE(p.grad().defined());
    }
  }
  expect_sharded_parity(*ref, *model, /*grads=*/true, "accumulated");
}

// unshard() all-gathers once and the next forward does not; reshard() swaps the DTensors back.
DTENSOR_TEST_F(FsdpThreads, ExplicitUnshardAndReshard) {
  auto counting = std::make_shared<testing::CountingGroup>(group_ptr());
  auto mesh = init_device_mesh("cpu", {4}, {}, counting);
  UnevenMLP ref, model;
  init_deterministic(*ref);
  init_deterministic(*model);
  fsdp::FullyShardOptions opts;
  opts.mesh = mesh;
  opts.reshard_after_forward = false;
  fsdp::FSDPModule root = fsdp::fully_shard(model, opts);
  EXPECT_FALSE(root.is_unsharded());
  counting->reset();
  root.unshard();
  EXPECT_EQ(counting->counts()["all_gather_into"], 1);
  EXPECT_TRUE(root.is_unsharded());
  auto params = nn::named_parameters(*model), full = nn::named_parameters(*ref);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_FALSE(is_dtensor(params[i].second)) << params[i].first;
    EXPECT_TRUE(params[i].second.equal(full[i].second)) << params[i].first;
  }
  counting->reset();
  at::Tensor out = nn::call(model, values({2, 7}));
  EXPECT_EQ(counting->counts()["all_gather_into"], 0);
  EXPECT_TRUE(testing::tensors_close(nn::call(ref, values({2, 7})), out, kRtol, kAtol));
  root.reshard();
  EXPECT_FALSE(root.is_unsharded());
  for (auto& p : nn::parameters(*model)) EXPECT_TRUE(is_dtensor(p));
}

// set_gradient_divide_factor: gradients summed then divided by the factor (1: the sum).
DTENSOR_TEST_F(FsdpThreads, GradientDivideFactor) {
  auto mesh = init_device_mesh("cpu", {4}, {}, group_ptr());
  UnevenMLP ref, model;
  init_deterministic(*ref);
  init_deterministic(*model);
  fsdp::FullyShardOptions opts;
  opts.mesh = mesh;
  shard_uneven(model, mesh, opts);
  fsdp::get_fsdp_module(*model)->set_gradient_divide_factor(1.0);
  for (size_t i = 0; i < model->layers->size(); ++i) fsdp::get_fsdp_module(*model->layers[i])->set_gradient_divide_factor(1.0);
  const at::Tensor global = values({8, 7}, 0.4);
  (mean_square(nn::call(ref, global)) * 4).backward();  // the sum over ranks of the local means
  mean_square(nn::call(model, my_rows(global, rank(), 4))).backward();
  expect_sharded_parity(*ref, *model, /*grads=*/true, "sum");
}

// Collectives per step with the root resharded too (reshard_after_forward=true set explicitly
// on every module): backward all-gathers = groups; and with the root left alone: groups - 1.
DTENSOR_TEST_F(FsdpThreads, CollectivesPerStepMatchPyTorch) {
  const ModelArgs args = uneven_args();
  for (int explicit_true = 0; explicit_true < 2; ++explicit_true) {
    auto counting = std::make_shared<testing::CountingGroup>(group_ptr());
    auto mesh = init_device_mesh("cpu", {4}, {}, counting);
    models::Transformer model(args);
    fsdp::FullyShardOptions opts;
    opts.mesh = mesh;
    if (explicit_true) opts.reshard_after_forward = true;
    const int groups = shard_transformer(model, mesh, opts);
    for (int step = 0; step < 2; ++step) {
      counting->reset();
      at::Tensor loss = nn::call(model, tokens_for(args, 2, 6)).sum();
      EXPECT_EQ(counting->counts(), (std::map<std::string, int64_t>{{"all_gather_into", groups}}));
      counting->reset();
      loss.backward();
      EXPECT_EQ(counting->counts(), (std::map<std::string, int64_t>{{"all_gather_into", explicit_true ? groups : groups - 1},
                                                                     {"reduce_scatter_into", groups}}))
          << "explicit_true=" << explicit_true << " step " << step;
    }
  }
}

}  // namespace
}  // namespace dtensor
