// CommDebugMode (dtensor/debug/comm_mode.h) against PyTorch's own numbers: the counts that
// test/distributed/tensor/debug/test_comm_mode.py and test_comm_mode_features.py,
// test_tp_examples.py and fsdp's test_fully_shard_comm.py assert for the same computations;
// the bytes of each collective against the sizes of the tensors it moves; the module tree,
// the table and the JSON dump; the strict mode. Ranks as threads (each enters its own mode),
// and the MLP case as Gloo processes too.
#include "dtensor/comm/c10d_guard.h"
#include "dtensor/debug/comm_mode.h"
#include "dtensor/fsdp/fsdp.h"
#include "dtensor/nn/nn.h"
#include "dtensor/parallel/parallel.h"
#include "harness/harness.h"
#include "models/models.h"
#include "suites/parallel/parallel_testing.h"
#include "suites/testing/errors.h"
#include "suites/testing/training.h"

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/functional/loss.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace dtensor {
namespace {

using debug::CommCounts;
using debug::CommDebugMode;
namespace funcol = debug::c10d_functional;
using testing::contains;
using testing::error_of;
using testing::values;

class CommModeThreads : public testing::DTensorOpTestBase {};
class CommModeGloo : public testing::DTensorTestBase {};

int64_t bytes_of(const at::Tensor& t) { return static_cast<int64_t>(t.numel() * t.element_size()); }

DeviceMesh mesh_of(testing::MultiRankTest& t) { return init_device_mesh(t.device_type(), {t.ranks()}, {}, t.group_ptr()); }

// test_comm_mode: collectives called directly, around a module that communicates nothing.
DTENSOR_TEST_F(CommModeThreads, CountsCollectivesCalledDirectly) {
  const int n = ranks();
  auto model = models::MLPModule(c10::Device(c10::kCPU));
  at::Tensor x = values({4, 10}, rank());
  at::Tensor gathered = at::empty({4 * n, 10});
  CommDebugMode comm_mode;
  {
    auto active = comm_mode.enter();
    group().all_gather_into(gathered, x);
    at::Tensor rs_in = values({4 * n, 10}, 1), rs_out = at::empty({4, 10});
    group().reduce_scatter_into(rs_out, rs_in);
    at::Tensor out = nn::call(model, rs_out);
    group().all_reduce(out);
    group().barrier();  // no data: not counted, as in PyTorch
  }
  group().all_reduce(x);  // after exit: not recorded
  EXPECT_EQ(comm_mode.get_total_counts(), 3);
  const CommCounts want = {{funcol::all_gather_into_tensor, 1}, {funcol::reduce_scatter_tensor, 1}, {funcol::all_reduce, 1}};
  EXPECT_EQ(comm_mode.get_comm_counts(), want);
  const auto& r = comm_mode.get_collectives();
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].input_bytes, bytes_of(x));
  EXPECT_EQ(r[0].output_bytes, bytes_of(gathered));
  EXPECT_EQ(r[1].input_bytes, 4 * n * 10 * 4);
  EXPECT_EQ(r[1].output_bytes, 4 * 10 * 4);
  EXPECT_EQ(r[2].input_bytes, 4 * 10 * 4);
  EXPECT_EQ(r[0].group_size, n);
  EXPECT_EQ(r[0].cause, "") << "called directly, not by a DTensor op";
  // Called outside any tracked module except the MLP, which communicates nothing.
  for (const auto& c : r) EXPECT_TRUE(c.modules.empty());
  EXPECT_EQ(comm_mode.get_total_bytes(), bytes_of(x) + 4 * n * 10 * 4 + 4 * 10 * 4);
}

// Making groups is not communication: on Gloo, with the harness's call check on (it all-gathers
// a description of every call, new_subgroup's too), a sub-group made inside the mode records
// nothing (before, the check's exchange counted as the user's all-gather); a collective on it
// records one.
DTENSOR_TEST_F(CommModeGloo, MakingASubgroupRecordsNothing) {
  DTENSOR_REQUIRE_WORLD_SIZE_AT_LEAST(2);
  ASSERT_TRUE(comm::check_collectives_enabled()) << "the harness turns the call check on";
  CommDebugMode comm_mode;
  auto active = comm_mode.enter();
  comm::GroupPtr pair = group().new_subgroup({0, 1});  // collective: every rank calls it
  EXPECT_EQ(comm_mode.get_total_counts(), 0);
  if (pair) {
    at::Tensor t = at::ones({3});
    pair->all_reduce(t);
    EXPECT_EQ(comm_mode.get_comm_counts(), (CommCounts{{funcol::all_reduce, 1}}));
    EXPECT_EQ(comm_mode.get_collectives().at(0).group_size, 2);
  }
}

// test_comm_mode_with_dtensor: mm of two row-sharded DTensors gathers the second, once, and
// the record says which op, which input, and the placements.
DTENSOR_TEST_F(CommModeThreads, DTensorMatmulGathersItsSecondInput) {
  auto mesh = mesh_of(*this);
  at::Tensor x = distribute_tensor(values({8, 8}, 1), mesh, {Shard{0}});
  at::Tensor y = distribute_tensor(values({8, 8}, 2), mesh, {Shard{0}});
  CommDebugMode comm_mode;
  at::Tensor z;
  {
    auto active = comm_mode.enter();
    z = at::mm(x, y);
  }
  EXPECT_TRUE(testing::tensors_close(full_tensor(z), at::mm(values({8, 8}, 1), values({8, 8}, 2)), 1e-5, 1e-6));
  EXPECT_EQ(comm_mode.get_total_counts(), 1);
  EXPECT_EQ(comm_mode.get_comm_counts()[funcol::all_gather_into_tensor], 1);
  EXPECT_EQ(comm_mode.get_comm_counts()[funcol::all_reduce], 0);
  ASSERT_EQ(comm_mode.get_collectives().size(), 1u);
  const auto& c = comm_mode.get_collectives()[0];
  EXPECT_EQ(c.cause, "aten::mm");
  EXPECT_EQ(c.input_index, 1);
  EXPECT_EQ(c.placements_before, "(Shard(dim=0),)");
  EXPECT_EQ(c.placements_after, "(Replicate(),)");
  EXPECT_EQ(c.input_bytes, bytes_of(local_tensor(y)));
  EXPECT_EQ(c.output_bytes, 8 * 8 * 4);
  EXPECT_EQ(c.mesh, mesh.to_string());
}

// test_comm_mode_features (MLP) and test_tp_examples: Colwise net1, Rowwise net2. Forward: one
// all_reduce (net2's Partial output), counted on Global, MLPModule and MLPModule.net2; the
// input needs no gradient, so backward communicates nothing: 1 in all.
void check_tp_mlp(testing::MultiRankTest& t) {
  auto mesh = mesh_of(t);
  auto model = models::MLPModule(c10::Device(c10::kCPU));
  parallelize_module(model, mesh, {{"net1", ColwiseParallel()}, {"net2", RowwiseParallel()}});
  const at::Tensor x = values({4, 10}, 3);
  CommDebugMode comm_mode;
  at::Tensor out;
  {
    auto active = comm_mode.enter();
    EXPECT_EQ(comm_mode.get_comm_module_counts().size(), 1u) << "only Global right after enter";
    out = nn::call(model, x);
    testing::mean_square(out).backward();
  }
  EXPECT_EQ(comm_mode.get_total_counts(), 1);
  const auto& per_module = comm_mode.get_comm_module_counts();
  std::vector<std::string> names;
  for (const auto& m : comm_mode.get_modules()) names.push_back(m.fqn);
  EXPECT_EQ(names, (std::vector<std::string>{"Global", "MLPModule", "MLPModule.net1", "MLPModule.relu",
                                             "MLPModule.net2"}));
  const debug::ModuleCommCounts one_forward{{{funcol::all_reduce, 1}}, {}};
  for (const char* fqn : {"Global", "MLPModule", "MLPModule.net2"}) {
    ASSERT_TRUE(per_module.count(fqn)) << fqn;
    EXPECT_TRUE(per_module.at(fqn) == one_forward) << fqn;
  }
  for (const char* fqn : {"MLPModule.net1", "MLPModule.relu"}) {
    ASSERT_TRUE(per_module.count(fqn)) << fqn;
    EXPECT_TRUE(per_module.at(fqn).forward.empty() && per_module.at(fqn).backward.empty()) << fqn;
  }
  const auto& c = comm_mode.get_collectives().at(0);
  EXPECT_EQ(c.cause, "redistribute") << "RowwiseParallel's output hook redistributes explicitly";
  EXPECT_EQ(c.placements_before, "(Partial(sum),)");
  EXPECT_EQ(c.placements_after, "(Replicate(),)");
  EXPECT_EQ(c.input_bytes, bytes_of(out)) << "the [4, 10] output, reduced whole";
  EXPECT_FALSE(c.backward);
}
DTENSOR_TEST_F(CommModeThreads, TensorParallelMLPPerModule) { check_tp_mlp(*this); }
DTENSOR_TEST_F(CommModeGloo, TensorParallelMLPPerModule) { check_tp_mlp(*this); }

// One training step of the Transformer (forward on a [2, 8] batch, cross-entropy backward),
// forward and backward each under its own mode.
void record_step(models::Transformer& model, const models::ModelArgs& args, CommDebugMode& forward_mode,
                 CommDebugMode& backward_mode) {
  const at::Tensor tokens = testing::tokens_for(args, 2, 8), targets = tokens.roll(1, 1).flatten();
  at::Tensor logits;
  {
    auto active = forward_mode.enter();
    logits = nn::call(model, tokens);
  }
  auto active = backward_mode.enter();
  torch::nn::functional::cross_entropy(logits.view({-1, args.vocab_size}), targets).backward();
}

// The Transformer under PyTorch's plan, one training step (test_comm_mode_features and the
// Transformer training test): forward {all_reduce: 6, all_gather: 1}, backward {all_reduce: 9};
// per module as PyTorch attributes them; the bytes from the activations' shapes.
DTENSOR_TEST_F(CommModeThreads, TransformerStepMatchesPyTorchsCounts) {
  models::ModelArgs args;
  args.dropout_p = 0.0;
  if (args.n_heads % ranks() != 0) args.n_heads = ranks();
  models::Transformer model(args);
  models::Transformer::parallelize(model, mesh_of(*this), /*use_seq_parallel=*/false);
  CommDebugMode forward_mode, backward_mode;
  record_step(model, args, forward_mode, backward_mode);
  EXPECT_EQ(forward_mode.get_comm_counts(), (CommCounts{{funcol::all_reduce, 6}, {funcol::all_gather_into_tensor, 1}}));
  EXPECT_EQ(backward_mode.get_comm_counts(), (CommCounts{{funcol::all_reduce, 9}}));

  const auto& fwd = forward_mode.get_comm_module_counts();
  EXPECT_EQ(fwd.at("Transformer").forward, forward_mode.get_comm_counts());
  EXPECT_EQ(fwd.at("Transformer.tok_embeddings").forward, (CommCounts{{funcol::all_reduce, 1}}));
  EXPECT_EQ(fwd.at("Transformer.pos_embeddings").forward, (CommCounts{{funcol::all_reduce, 1}}));
  for (const char* layer : {"Transformer.layers.0", "Transformer.layers.1"}) {
    EXPECT_EQ(fwd.at(layer).forward, (CommCounts{{funcol::all_reduce, 2}})) << layer;
    EXPECT_EQ(fwd.at(std::string(layer) + ".attention.wo").forward, (CommCounts{{funcol::all_reduce, 1}})) << layer;
    EXPECT_EQ(fwd.at(std::string(layer) + ".feed_forward.w2").forward, (CommCounts{{funcol::all_reduce, 1}})) << layer;
  }
  EXPECT_EQ(fwd.at("Transformer.output").forward, (CommCounts{{funcol::all_gather_into_tensor, 1}}));
  // Backward: the Partial gradient of each Colwise input (wq, wk, wv, w1 and output), reduced
  // in the module whose forward made it.
  const auto& bwd = backward_mode.get_comm_module_counts();
  for (const char* layer : {"Transformer.layers.0", "Transformer.layers.1"}) {
    EXPECT_EQ(bwd.at(layer).backward, (CommCounts{{funcol::all_reduce, 4}})) << layer;
    for (const char* m : {".attention.wq", ".attention.wk", ".attention.wv", ".feed_forward.w1"})
      EXPECT_EQ(bwd.at(std::string(layer) + m).backward, (CommCounts{{funcol::all_reduce, 1}})) << layer << m;
  }
  EXPECT_EQ(bwd.at("Transformer.output").backward, (CommCounts{{funcol::all_reduce, 1}}));
  EXPECT_EQ(bwd.at("Global").backward, (CommCounts{{funcol::all_reduce, 9}}));
  // A mode entered around backward only still lists the modules its collectives came from.
  EXPECT_TRUE(contains(backward_mode.generate_comm_debug_tracing_table(0),
                       "        Transformer.layers.1\n"
                       "          BACKWARD PASS\n"
                       "            *c10d_functional.all_reduce: 4\n"))
      << backward_mode.generate_comm_debug_tracing_table(0);

  // Bytes: embeddings [2, 8, dim] and [8, dim] reduced whole; the logits gathered from
  // [2, 8, vocab / ranks] to [2, 8, vocab].
  const int64_t f = 4;
  for (const auto& c : forward_mode.get_collectives()) {
    const std::string where = c.modules.empty() ? "" : c.modules.back();
    if (where == "Transformer.tok_embeddings") EXPECT_EQ(c.input_bytes, 2 * 8 * args.dim * f);
    if (where == "Transformer.pos_embeddings") EXPECT_EQ(c.input_bytes, 8 * args.dim * f);
    if (where == "Transformer.output") {
      EXPECT_EQ(c.input_bytes, 2 * 8 * (args.vocab_size / ranks()) * f);
      EXPECT_EQ(c.output_bytes, 2 * 8 * args.vocab_size * f);
    }
  }
  for (const auto& c : backward_mode.get_collectives()) {
    EXPECT_TRUE(c.backward);
    EXPECT_EQ(c.cause, "dtensor::FromLocalBackward");
    EXPECT_EQ(c.placements_before, "(Partial(sum),)");
  }
}

// test_fully_shard_comm: the Transformer with its blocks and root sharded. Forward all-gathers
// each group once (blocks + 1); backward reduce-scatters each (blocks + 1) and all-gathers the
// blocks again (resharded after forward; the root keeps its parameters). Per module, as
// PyTorch's CommDebugMode attributes FSDP's collectives when one mode records forward and
// backward (PyTorch 2.15, a root over two sharded blocks on a fake world): a group's
// collectives count on the module it shards and on the modules it was called from.
DTENSOR_TEST_F(CommModeThreads, FullyShardedTransformerMatchesPyTorchsCounts) {
  models::ModelArgs args;
  args.dropout_p = 0.0;
  models::Transformer model(args);
  const int64_t blocks = static_cast<int64_t>(model->layers->size());
  for (int64_t i = 0; i < blocks; ++i) fsdp::fully_shard(*model->layers->ptr(static_cast<size_t>(i)));
  fsdp::fully_shard(model);
  CommDebugMode forward_mode, backward_mode;
  record_step(model, args, forward_mode, backward_mode);
  EXPECT_EQ(forward_mode.get_comm_counts(), (CommCounts{{funcol::all_gather_into_tensor, blocks + 1}}));
  EXPECT_EQ(backward_mode.get_comm_counts(),
            (CommCounts{{funcol::all_gather_into_tensor, blocks}, {funcol::reduce_scatter_tensor, blocks + 1}}));
  // Forward: each group gathers in its own pre-forward hook. Backward: each block gathers the one
  // before it (the default prefetch, in its pre-backward hook), the root's hook the last block;
  // each group reduce-scatters in its post-backward (the root's in the callback that ends the
  // backward, since its input, the tokens, needs no gradient).
  const auto& fwd = forward_mode.get_comm_module_counts();
  const auto& bwd = backward_mode.get_comm_module_counts();
  auto backward_of = [&](const std::string& module) {  // none: a module that recorded nothing
    auto it = bwd.find(module);
    return it == bwd.end() ? CommCounts{} : it->second.backward;
  };
  EXPECT_EQ(fwd.at("Transformer").forward, (CommCounts{{funcol::all_gather_into_tensor, blocks + 1}}));
  EXPECT_EQ(backward_of("Transformer"), backward_mode.get_comm_counts());
  for (int64_t i = 0; i < blocks; ++i) {
    const std::string layer = "Transformer.layers." + std::to_string(i);
    EXPECT_EQ(fwd.at(layer).forward, (CommCounts{{funcol::all_gather_into_tensor, 1}})) << layer;
    CommCounts want_backward{{funcol::reduce_scatter_tensor, 1}};
    if (i > 0) want_backward[funcol::all_gather_into_tensor] = 1;
    EXPECT_EQ(backward_of(layer), want_backward) << layer;
  }
  // Each block's all-gather moves its parameters, each split on dim 0 into `ranks` equal
  // pieces (the last ones padded, as FSDP2 pads): ranks x sum of ceil(rows / ranks) x row
  // size, in four-byte floats; each rank puts in its 1/ranks of that.
  const int64_t w = ranks();
  int64_t per_rank = 0;
  for (const auto& p : models::TransformerBlock(args)->parameters())
    per_rank += (p.size(0) + w - 1) / w * (p.numel() / p.size(0));
  int64_t matching = 0;
  for (const auto& c : forward_mode.get_collectives())
    matching += c.input_bytes == per_rank * 4 && c.output_bytes == w * per_rank * 4 ? 1 : 0;
  EXPECT_EQ(matching, blocks) << "all-gathers of a block's " << per_rank << " elements per rank";
}

// The table (PyTorch's layout, without colours) and the JSON tree.
DTENSOR_TEST_F(CommModeThreads, TableAndJsonDump) {
  auto mesh = mesh_of(*this);
  auto model = models::MLPModule(c10::Device(c10::kCPU));
  parallelize_module(model, mesh, {{"net1", ColwiseParallel()}, {"net2", RowwiseParallel()}});
  CommDebugMode comm_mode;
  {
    auto active = comm_mode.enter();
    nn::call(model, values({4, 10}, 3));
  }
  EXPECT_EQ(comm_mode.generate_comm_debug_tracing_table(0),
            "Global\n"
            "  FORWARD PASS\n"
            "    *c10d_functional.all_reduce: 1\n"
            "    MLPModule\n"
            "      FORWARD PASS\n"
            "        *c10d_functional.all_reduce: 1\n"
            "        MLPModule.net1\n"
            "        MLPModule.relu\n"
            "        MLPModule.net2\n"
            "          FORWARD PASS\n"
            "            *c10d_functional.all_reduce: 1\n");
  const std::string detailed = comm_mode.generate_comm_debug_tracing_table(1);
  EXPECT_TRUE(contains(detailed, "        *module type: Linear\n")) << detailed;
  EXPECT_TRUE(contains(detailed, "            *c10d_functional.all_reduce: 1\n              160 B in, 160 B out, group of " +
                                     std::to_string(ranks()) + " (ranks "))
      << detailed;
  EXPECT_TRUE(contains(detailed, "redistribute (Partial(sum),) -> (Replicate(),) on DeviceMesh(")) << detailed;

  const std::string file = "comm_mode_" + std::to_string(rank()) + ".json";
  const std::string text = comm_mode.generate_json_dump(file, 1);
  std::ifstream in(file);
  const nlohmann::json j = nlohmann::json::parse(in);
  std::remove(file.c_str());
  EXPECT_EQ(j, nlohmann::json::parse(text));
  EXPECT_EQ(j["fqn"], "Global");
  ASSERT_EQ(j["children"].size(), 1u);
  const auto& mlp = j["children"][0];
  EXPECT_EQ(mlp["fqn"], "MLPModule");
  EXPECT_EQ(mlp["module_type"], "MLPModule");
  ASSERT_EQ(mlp["children"].size(), 3u);
  const auto& net2 = mlp["children"][2];
  EXPECT_EQ(net2["fqn"], "MLPModule.net2");
  EXPECT_EQ(net2["collectives_forward"], nlohmann::json::parse(R"([["c10d_functional.all_reduce", 1]])"));
  ASSERT_EQ(net2["collectives_detail"].size(), 1u);
  EXPECT_EQ(net2["collectives_detail"][0]["input_bytes"], 160);
  EXPECT_EQ(net2["collectives_detail"][0]["placements_before"], "(Partial(sum),)");
  EXPECT_EQ(mlp["children"][0]["collectives_detail"].size(), 0u);
}

// Strict: an op that would redistribute implicitly raises on every rank before anything moves,
// naming the op, the input and both placements; the same computation with the redistribution
// written out runs, and its collective is the explicit one.
DTENSOR_TEST_F(CommModeThreads, StrictRaisesOnImplicitRedistribution) {
  auto mesh = mesh_of(*this);
  at::Tensor x = distribute_tensor(values({8, 8}, 1), mesh, {Shard{0}});
  at::Tensor y = distribute_tensor(values({8, 8}, 2), mesh, {Shard{0}});
  debug::CommDebugModeOptions o;
  o.strict = true;
  CommDebugMode strict(o);
  {
    auto active = strict.enter();
    const std::string e = error_of([&] { at::mm(x, y); });
    EXPECT_TRUE(contains(e, "CommDebugMode(strict): aten::mm would redistribute its input 1 from (Shard(dim=0),) to "
                            "(Replicate(),) on DeviceMesh("))
        << e;
    EXPECT_EQ(strict.get_total_counts(), 0) << "nothing moved before the error";
    at::Tensor z = at::mm(x, redistribute(y, {Replicate{}}));
    EXPECT_EQ(get_spec(z).placements, std::vector<Placement>{Shard{0}});
  }
  EXPECT_EQ(strict.get_comm_counts(), (CommCounts{{funcol::all_gather_into_tensor, 1}}));
  EXPECT_EQ(strict.get_collectives().at(0).cause, "redistribute");
  // The tensor-parallel MLP writes all its redistributions (styles): strict lets it train.
  auto model = models::MLPModule(c10::Device(c10::kCPU));
  parallelize_module(model, mesh, {{"net1", ColwiseParallel()}, {"net2", RowwiseParallel()}});
  at::Tensor input = values({4, 10}, 3).requires_grad_(true);
  CommDebugMode strict_again(o);
  auto active = strict_again.enter();
  testing::mean_square(nn::call(model, input)).backward();
  EXPECT_EQ(strict_again.get_comm_counts(), (CommCounts{{funcol::all_reduce, 2}}))
      << "net2's output forward, net1's input gradient backward";
}

// Entering again clears; modes nest and both record; exiting stops recording.
DTENSOR_TEST_F(CommModeThreads, ReenteringClearsAndNestedModesBothRecord) {
  at::Tensor t = at::ones({3});
  CommDebugMode outer, inner;
  {
    auto a = outer.enter();
    group().all_reduce(t);
    {
      auto b = inner.enter();
      group().broadcast(t, 0);
      EXPECT_TRUE(contains(error_of([&] { inner.enter(); }), "entered while already active"));
    }
    group().all_reduce(t);
  }
  EXPECT_EQ(outer.get_comm_counts(), (CommCounts{{funcol::all_reduce, 2}, {funcol::broadcast, 1}}));
  EXPECT_EQ(inner.get_comm_counts(), (CommCounts{{funcol::broadcast, 1}}));
  {
    auto again = outer.enter();
    EXPECT_EQ(outer.get_total_counts(), 0);
    EXPECT_EQ(outer.get_comm_module_counts().size(), 1u);
  }
  group().all_reduce(t);
  EXPECT_EQ(outer.get_total_counts(), 0);
}

}  // namespace
}  // namespace dtensor
