// dtensor/checkpoint/state_dict.h: model and optimizer state dicts of plain and
// tensor-parallel models (SGD, Adam, AdamW keyed by parameter name; full_state_dict,
// cpu_offload, broadcast_from_rank0, strict), and a TP Transformer whose training is
// interrupted by save + load, into the same layout (the losses are bitwise those of the
// uninterrupted run) and into a plain model on every rank (equal up to rounding), and between
// TP and FSDP layouts.
#include "dtensor/checkpoint/checkpoint.h"
#include "dtensor/comm/comm.h"
#include "dtensor/fsdp/fsdp.h"
#include "dtensor/nn/nn.h"
#include "dtensor/parallel/parallel.h"
#include "dtensor/tensor/dtensor.h"
#include "harness/harness.h"
#include "models/models.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/child_process.h"
#include "suites/testing/errors.h"
#include "suites/testing/rank_modes.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <functional>

namespace dtensor {
namespace {

namespace dcp = checkpoint;
using checkpoint::StateDict;
using checkpoint::StateDictOptions;
using models::ModelArgs;
using testing::contains;
using testing::gathered;

DTENSOR_RANK_FIXTURES(StateDictGloo, StateDictThreads);

class SharedDir {
 public:
  explicit SharedDir(comm::Group& g) : group_(g) {
    if (g.rank() == 0) owned_ = std::make_unique<testing::TempDir>();
    path_ = comm::all_gather_object(g, owned_ ? owned_->path() : std::string())[0];
  }
  ~SharedDir() { group_.barrier(); }
  std::string sub(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

 private:
  comm::Group& group_;
  std::unique_ptr<testing::TempDir> owned_;
  std::string path_;
};

// Parameters from `offset` (deterministic; the same on every rank).
void init_params(torch::nn::Module& m, double offset) {
  at::NoGradGuard no_grad;
  for (auto& kv : nn::named_parameters(m)) {
    kv.second.copy_(0.4 * testing::values(kv.second.sizes().vec(), offset));
    offset += 1.3;
  }
}

at::Tensor& tensor_at(StateDict& sd, const std::string& key) { return std::get<at::Tensor>(sd.at(key)); }

// ---- the Transformer, interrupted -------------------------------------------------------------

struct Trainer {
  ModelArgs args;
  at::Tensor tokens, targets;
  Trainer() {
    args.dropout_p = 0.0;
    tokens = (at::arange(16, at::kLong) * 5 + 3).remainder(args.vocab_size).view({2, 8});
    targets = tokens.roll(1, 1).flatten();
  }
  float step(models::Transformer& model, torch::optim::Optimizer& opt) const {
    opt.zero_grad();
    at::Tensor logits = gathered(nn::call(model, tokens));
    at::Tensor loss = torch::nn::functional::cross_entropy(logits.view({-1, args.vocab_size}), targets);
    loss.backward();
    opt.step();
    return loss.item<float>();
  }
};

StateDict train_state(models::Transformer& model, torch::optim::Optimizer& opt) {
  StateDict sd = dcp::with_prefix(dcp::get_model_state_dict(*model), "model.");
  sd.merge(dcp::with_prefix(dcp::get_optimizer_state_dict(*model, opt), "optim."));
  return sd;
}

void load_train_state(models::Transformer& model, torch::optim::Optimizer& opt, const std::string& dir) {
  StateDict sd = train_state(model, opt);
  dcp::load(sd, dir);
  dcp::set_model_state_dict(*model, dcp::strip_prefix(sd, "model."));
  dcp::set_optimizer_state_dict(*model, opt, dcp::strip_prefix(sd, "optim."));
}

DTENSOR_TEST_BOTH(StateDictGloo, StateDictThreads, InterruptedTpTransformerTrainingContinuesWithTheSameLosses) {
  SharedDir dir(t.group());
  Trainer tr;
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  auto make_tp = [&](double init) {
    models::Transformer m(tr.args);
    init_params(*m, init);
    return models::Transformer::parallelize(m, mesh, /*use_seq_parallel=*/true);
  };
  // Uninterrupted: 4 Adam steps.
  std::vector<float> ref;
  {
    auto model = make_tp(0.5);
    torch::optim::Adam opt(nn::parameters(*model), torch::optim::AdamOptions(0.01));
    for (int i = 0; i < 4; ++i) ref.push_back(tr.step(model, opt));
  }
  // Interrupted after 2 steps: saved ...
  {
    auto model = make_tp(0.5);
    torch::optim::Adam opt(nn::parameters(*model), torch::optim::AdamOptions(0.01));
    for (int i = 0; i < 2; ++i) EXPECT_EQ(tr.step(model, opt), ref[i]);
    dcp::save(train_state(model, opt), dir.sub("step2"));
  }
  // ... loaded into a fresh model and optimizer (other initial values, lr changed) of the
  // same layout: bitwise the same losses.
  {
    auto model = make_tp(2.0);
    torch::optim::Adam opt(nn::parameters(*model), torch::optim::AdamOptions(0.5));
    load_train_state(model, opt, dir.sub("step2"));
    EXPECT_EQ(static_cast<torch::optim::AdamOptions&>(opt.param_groups()[0].options()).lr(), 0.01);
    for (int i = 2; i < 4; ++i) EXPECT_EQ(tr.step(model, opt), ref[i]) << "step " << i;
  }
  // ... and into a plain model on every rank: the same losses up to rounding.
  {
    models::Transformer model(tr.args);
    init_params(*model, 3.0);
    torch::optim::Adam opt(nn::parameters(*model), torch::optim::AdamOptions(0.5));
    load_train_state(model, opt, dir.sub("step2"));
    for (int i = 2; i < 4; ++i) EXPECT_NEAR(tr.step(model, opt), ref[i], 1e-5 * std::abs(ref[i])) << "step " << i;
  }
}

// ---- options ------------------------------------------------------------------------------------

models::MLPModule tp_mlp(const DeviceMesh& mesh, double init) {
  models::MLPModule m(c10::Device(c10::kCPU));
  init_params(*m, init);
  parallelize_module(m, mesh, {{"net1", ColwiseParallel()}, {"net2", RowwiseParallel()}});
  return m;
}

void expect_same_params(torch::nn::Module& a, torch::nn::Module& b) {
  auto pa = nn::named_parameters(a), pb = nn::named_parameters(b);
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_TRUE(at::equal(gathered(pa[i].second), gathered(pb[i].second))) << pa[i].first;
  }
}

DTENSOR_TEST_BOTH(StateDictGloo, StateDictThreads, ModelStateDictOptions) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_AT_LEAST(2);  // the last rank's unknown key
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  auto src = tp_mlp(mesh, 0.5);
  // Sharded: the parameters themselves.
  StateDict sharded = dcp::get_model_state_dict(*src);
  EXPECT_EQ(sharded.size(), 4u);
  EXPECT_TRUE(is_dtensor(tensor_at(sharded, "net1.weight")));
  EXPECT_TRUE(tensor_at(sharded, "net1.weight").is_same(src->net1->weight));
  // Full: plain tensors on every rank.
  StateDictOptions full;
  full.full_state_dict = true;
  StateDict f = dcp::get_model_state_dict(*src, full);
  EXPECT_FALSE(is_dtensor(tensor_at(f, "net1.weight")));
  EXPECT_TRUE(at::equal(tensor_at(f, "net1.weight"), full_tensor(src->net1->weight)));
  // Full and offloaded: rank 0 only.
  StateDictOptions offload = full;
  offload.cpu_offload = true;
  StateDict r0 = dcp::get_model_state_dict(*src, offload);
  EXPECT_EQ(r0.size(), t.rank() == 0 ? 4u : 0u);

  // set from a full state dict (sliced on each rank), from rank 0 only (broadcast), and from
  // another layout's DTensors.
  auto dst = tp_mlp(mesh, 2.0);
  dcp::set_model_state_dict(*dst, f);
  expect_same_params(*src, *dst);
  auto dst2 = tp_mlp(mesh, 3.0);
  StateDictOptions bcast;
  bcast.broadcast_from_rank0 = true;
  dcp::set_model_state_dict(*dst2, r0, bcast);
  expect_same_params(*src, *dst2);
  auto rows = tp_mlp(mesh, 4.0);
  StateDict other{{"net1.weight", redistribute(src->net1->weight.detach(), mesh, {Shard{1}})},
                  {"net1.bias", src->net1->bias},
                  {"net2.weight", redistribute(src->net2->weight.detach(), mesh, {Replicate{}})},
                  {"net2.bias", src->net2->bias}};
  dcp::set_model_state_dict(*rows, other);
  expect_same_params(*src, *rows);
  // A plain model from a TP state dict.
  models::MLPModule plain(c10::Device(c10::kCPU));
  dcp::set_model_state_dict(*plain, sharded);
  expect_same_params(*src, *plain);

  // strict: an unknown key on the last rank fails every rank; not strict, it is reported.
  const int last = t.ranks() - 1;
  StateDict extra = f;
  if (t.rank() == last) extra["net3.weight"] = at::zeros({1});
  std::string err = testing::error_of([&] { dcp::set_model_state_dict(*dst, extra); });
  EXPECT_PRED2(contains, err, "(RANK " + std::to_string(last) +
                                  ") c10::Error: set_model_state_dict (strict): missing keys [], unexpected keys "
                                  "['net3.weight']");
  StateDict partial = f;
  partial.erase("net2.bias");
  StateDictOptions lax;
  lax.strict = false;
  auto res = dcp::set_model_state_dict(*dst, partial, lax);
  EXPECT_EQ(res.missing_keys, std::vector<std::string>{"net2.bias"});
}

DTENSOR_TEST_BOTH(StateDictGloo, StateDictThreads, OptimizerStateDictsKeyedByParameterName) {
  SharedDir dir(t.group());
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  const at::Tensor x = testing::values({4, 10}, 1.0);
  auto train = [&](models::MLPModule& m, torch::optim::Optimizer& opt) {
    opt.zero_grad();
    gathered(nn::call(m, x)).pow(2).mean().backward();
    opt.step();
  };
  for (const std::string which : {"sgd", "adam", "adamw"}) {
    SCOPED_TRACE(which);
    auto make_opt = [&](models::MLPModule& m, double lr) -> std::unique_ptr<torch::optim::Optimizer> {
      if (which == "sgd") {
        return std::make_unique<torch::optim::SGD>(nn::parameters(*m), torch::optim::SGDOptions(lr).momentum(0.9));
      }
      if (which == "adam") {
        return std::make_unique<torch::optim::Adam>(nn::parameters(*m), torch::optim::AdamOptions(lr).amsgrad(true));
      }
      return std::make_unique<torch::optim::AdamW>(nn::parameters(*m), torch::optim::AdamWOptions(lr));
    };
    auto a = tp_mlp(mesh, 0.5);
    auto opt_a = make_opt(a, 0.01);
    train(a, *opt_a);
    StateDict osd = dcp::get_optimizer_state_dict(*a, *opt_a);
    if (which == "sgd") {
      EXPECT_TRUE(is_dtensor(tensor_at(osd, "state.net1.weight.momentum_buffer")));
      EXPECT_EQ(std::get<c10::IValue>(osd.at("param_groups.net1.weight.momentum")).toDouble(), 0.9);
    } else {
      EXPECT_EQ(std::get<c10::IValue>(osd.at("state.net2.bias.step")).toInt(), 1);
      EXPECT_EQ(osd.count("state.net1.weight.max_exp_avg_sq"), which == "adam" ? 1u : 0u);
    }
    StateDict all = dcp::with_prefix(dcp::get_model_state_dict(*a), "model.");
    all.merge(dcp::with_prefix(osd, "optim."));
    dcp::save(all, dir.sub(which));
    // Loaded into a fresh pair whose optimizer lists the parameters in another order: the
    // next step matches the original's.
    auto b = tp_mlp(mesh, 5.0);
    auto params = nn::parameters(*b);
    std::reverse(params.begin(), params.end());
    std::unique_ptr<torch::optim::Optimizer> opt_b;
    if (which == "sgd") opt_b = std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(1.0).momentum(0.5));
    if (which == "adam") opt_b = std::make_unique<torch::optim::Adam>(params, torch::optim::AdamOptions(1.0).amsgrad(true));
    if (which == "adamw") opt_b = std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(1.0));
    StateDict dest = dcp::with_prefix(dcp::get_model_state_dict(*b), "model.");
    dest.merge(dcp::with_prefix(dcp::get_optimizer_state_dict(*b, *opt_b), "optim."));
    dcp::load(dest, dir.sub(which));
    dcp::set_model_state_dict(*b, dcp::strip_prefix(dest, "model."));
    dcp::set_optimizer_state_dict(*b, *opt_b, dcp::strip_prefix(dest, "optim."));
    train(a, *opt_a);
    train(b, *opt_b);
    expect_same_params(*a, *b);
    // Full state dicts of the optimizer on rank 0, broadcast into a third pair.
    StateDictOptions offload;
    offload.full_state_dict = true;
    offload.cpu_offload = true;
    StateDict full = dcp::get_optimizer_state_dict(*a, *opt_a, offload);
    StateDict full_model = dcp::get_model_state_dict(*a, offload);
    EXPECT_EQ(full.empty(), t.rank() != 0);
    auto c = tp_mlp(mesh, 6.0);
    auto opt_c = make_opt(c, 1.0);
    StateDictOptions bcast;
    bcast.broadcast_from_rank0 = true;
    dcp::set_model_state_dict(*c, full_model, bcast);
    dcp::set_optimizer_state_dict(*c, *opt_c, full, bcast);
    train(a, *opt_a);
    train(c, *opt_c);
    expect_same_params(*a, *c);
  }
}


// ---- TP <-> FSDP <-> FSDP x TP <-> plain ---------------------------------------------------------

// A Transformer's training state moved through every layout: TP (n) -> FSDP (n) -> FSDP x TP
// ((n / 2)x2, _StridedShard parameters) -> a plain model on every rank -> TP again, 2 Adam steps
// in each; the losses continue as in the uninterrupted TP run, up to rounding.
DTENSOR_TEST_BOTH(StateDictGloo, StateDictThreads, TrainingMovesThroughTpFsdpFsdpTpAndPlain) {
  DTENSOR_BOTH_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // mesh_shape_2d()
  SharedDir dir(t.group());
  Trainer tr;
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  auto mesh2 = init_device_mesh(t.device_type(), t.mesh_shape_2d(), {"dp", "tp"});
  auto fsdp_on = [](models::Transformer& m, const DeviceMesh& dp) {
    fsdp::FullyShardOptions opts;
    opts.mesh = dp;
    for (auto& block : *m->layers) fsdp::fully_shard(*block, opts);
    fsdp::fully_shard(m, opts);
  };
  using Make = std::function<models::Transformer(double)>;
  const std::vector<std::pair<std::string, Make>> layouts = {
      {"TP", [&](double init) {
         models::Transformer m(tr.args);
         init_params(*m, init);
         return models::Transformer::parallelize(m, mesh, /*use_seq_parallel=*/false);
       }},
      {"FSDP", [&](double init) {
         models::Transformer m(tr.args);
         init_params(*m, init);
         fsdp_on(m, mesh);
         return m;
       }},
      {"FSDPxTP", [&](double init) {
         models::Transformer m(tr.args);
         init_params(*m, init);
         models::Transformer::parallelize(m, mesh2["tp"], /*use_seq_parallel=*/false);
         fsdp_on(m, mesh2["dp"]);
         return m;
       }},
      {"plain", [&](double init) {
         models::Transformer m(tr.args);
         init_params(*m, init);
         return m;
       }},
      {"TP again", [&](double init) {
         models::Transformer m(tr.args);
         init_params(*m, init);
         return models::Transformer::parallelize(m, mesh, /*use_seq_parallel=*/false);
       }}};
  const int steps = 2;
  std::vector<float> ref;
  {
    auto model = layouts[0].second(0.5);
    torch::optim::Adam opt(nn::parameters(*model), torch::optim::AdamOptions(0.01));
    for (size_t i = 0; i < steps * layouts.size(); ++i) ref.push_back(tr.step(model, opt));
  }
  std::string saved;
  for (size_t l = 0; l < layouts.size(); ++l) {
    const auto& [name, make] = layouts[l];
    // Other initial values and lr: everything comes from the checkpoint.
    auto model = make(l == 0 ? 0.5 : 2.0 + double(l));
    torch::optim::Adam opt(nn::parameters(*model), torch::optim::AdamOptions(l == 0 ? 0.01 : 0.5));
    if (l == 0) {
      EXPECT_TRUE(is_dtensor(model->output->weight));
    } else {
      load_train_state(model, opt, saved);
    }
    if (name == "FSDPxTP") {
      // The Colwise weights are (_StridedShard(0, 2), Shard(0)) on the 2-D mesh.
      int strided = 0;
      for (const auto& [fqn, p] : nn::named_parameters(*model)) {
        if (is_dtensor(p) && is_strided_shard(get_spec(p).placements.at(0))) ++strided;
      }
      EXPECT_GT(strided, 0);
    }
    for (int i = 0; i < steps; ++i) {
      const size_t k = l * steps + size_t(i);
      const float loss = tr.step(model, opt);
      if (l == 0) {
        EXPECT_EQ(loss, ref[k]);
      } else {
        EXPECT_NEAR(loss, ref[k], 1e-5 * std::abs(ref[k])) << name << " step " << k;
      }
    }
    saved = dir.sub("after_" + std::to_string(l));
    dcp::save(train_state(model, opt), saved);
  }
}

}  // namespace
}  // namespace dtensor
