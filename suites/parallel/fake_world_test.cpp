// The fake world (NOTE: [Fake world] in dtensor/comm/fake_group.h) against real ranks: each rank
// thread runs a training step of the Transformer on its real world, then, alone, the same step
// as the same rank of a FakeGroup world of the same size; the collectives CommDebugMode records
// (kind, bytes sent and received, the group's ranks, forward or backward, module path, cause and
// placements) are the same, one for one, in the same order. Tensor parallel (with and without
// sequence parallelism), FSDP (blocks and root; Adam) and FSDP x TP on a (ranks / 2, 2) mesh.
// MemTracker's figures for the step are the real rank's too. Both hold for a fake world on the
// meta device as well (the model built in an nn::DeviceContext, a "meta" mesh: no data at all).
// Then the fake group itself: a mesh of 512 ranks, argument checks, the values it writes.
#include "dtensor/comm/fake_group.h"
#include "dtensor/debug/comm_mode.h"
#include "dtensor/debug/mem_tracker.h"
#include "dtensor/fsdp/fsdp.h"
#include "dtensor/nn/nn.h"
#include "dtensor/parallel/parallel.h"
#include "harness/harness.h"
#include "models/models.h"
#include "suites/testing/errors.h"
#include "suites/testing/training.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>

#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace dtensor {
namespace {

using debug::CollectiveRecord;
using debug::CommDebugMode;

class FakeWorldThreads : public testing::DTensorOpTestBase {};

// One record as a line: everything a rank would see of the collective.
std::string describe(const CollectiveRecord& c) {
  std::ostringstream os;
  os << (c.backward ? "backward " : "forward ") << c.op << " in=" << c.input_bytes << " out=" << c.output_bytes
     << " group=[";
  for (size_t i = 0; i < c.group_ranks.size(); ++i) os << (i ? "," : "") << c.group_ranks[i];
  os << "] module=";
  for (size_t i = 0; i < c.modules.size(); ++i) os << (i ? "/" : "") << c.modules[i];
  os << " cause=" << c.cause << "#" << c.input_index << " " << c.placements_before << "->" << c.placements_after;
  return os.str();
}

std::vector<std::string> describe_all(const CommDebugMode& mode) {
  std::vector<std::string> out;
  for (const auto& c : mode.get_collectives()) out.push_back(describe(c));
  return out;
}

models::ModelArgs small_args() {
  models::ModelArgs a;
  a.dropout_p = 0.0;
  a.n_heads = 8;  // tensor parallel over 2, 4 or 8 ranks
  return a;
}

// A model parallelized on a mesh of `device` ("cpu", or "meta" on a fake world) over `world`.
using Build = std::function<void(models::Transformer&, comm::GroupPtr world, const std::string& device)>;

// The Transformer, built on the meta device when `meta`, else on the CPU.
models::Transformer make_model(const models::ModelArgs& args, bool meta) {
  if (!meta) return models::Transformer(args);
  nn::DeviceContext on_meta(c10::kMeta);
  return models::Transformer(args);
}

// The tokens on the device of the world's model.
at::Tensor on(const at::Tensor& t, bool meta) { return meta ? t.to(c10::kMeta) : t; }

// The model trained for one step (forward, cross-entropy, backward, optimizer step) on this
// rank's batch; returns the collectives of the step.
std::vector<std::string> step_collectives(const Build& build, comm::GroupPtr world, bool adam, bool meta = false) {
  const models::ModelArgs args = small_args();
  models::Transformer model = make_model(args, meta);
  build(model, world, meta ? "meta" : "cpu");
  std::unique_ptr<torch::optim::Optimizer> opt;
  if (adam) opt = std::make_unique<torch::optim::Adam>(nn::parameters(*model), torch::optim::AdamOptions(1e-3));
  else opt = std::make_unique<torch::optim::SGD>(nn::parameters(*model), torch::optim::SGDOptions(0.01));
  const at::Tensor tokens = testing::tokens_for(args, 2, 8) + world->rank() % 2;
  const at::Tensor targets = on(tokens.roll(1, 1).flatten().remainder(args.vocab_size), meta);
  CommDebugMode mode;
  {
    auto active = mode.enter();
    opt->zero_grad();
    at::Tensor logits = nn::call(model, on(tokens.remainder(args.vocab_size), meta));
    torch::nn::functional::cross_entropy(logits.reshape({-1, args.vocab_size}), targets).backward();
    opt->step();
  }
  return describe_all(mode);
}

// The parallelizations, on a world of any kind: tensor parallel (with or without sequence
// parallelism) on a 1-D mesh, FSDP (blocks, then the root) on a 1-D mesh, and FSDP x TP on a
// (ranks / 2, 2) mesh.
void build_tp(models::Transformer& m, comm::GroupPtr world, const std::string& device, bool sequence_parallel) {
  models::Transformer::parallelize(m, init_device_mesh(device, {world->size()}, {}, world), sequence_parallel);
}
void fully_shard_blocks_and_root(models::Transformer& m, const DeviceMesh& mesh) {
  fsdp::FullyShardOptions opts;
  opts.mesh = mesh;
  for (size_t i = 0; i < m->layers->size(); ++i) fsdp::fully_shard(*m->layers->ptr(i), opts);
  fsdp::fully_shard(m, opts);
}
void build_fsdp(models::Transformer& m, comm::GroupPtr world, const std::string& device) {
  fully_shard_blocks_and_root(m, init_device_mesh(device, {world->size()}, {}, world));
}
void build_fsdp_tp(models::Transformer& m, comm::GroupPtr world, const std::string& device) {
  auto mesh = init_device_mesh(device, {world->size() / 2, 2}, {"dp", "tp"}, world);
  models::Transformer::parallelize(m, mesh["tp"], false);
  fully_shard_blocks_and_root(m, mesh["dp"]);
}

// This rank's step on the real world, then on a fake world of the same size, with real tensors
// and on the meta device: the same records.
void expect_fake_matches_real(testing::MultiRankTest& t, const Build& build, bool adam) {
  const std::vector<std::string> real = step_collectives(build, t.group_ptr(), adam);
  ASSERT_FALSE(real.empty());
  for (bool meta : {false, true}) {
    SCOPED_TRACE(meta ? "fake world on the meta device" : "fake world on the CPU");
    const std::vector<std::string> fake =
        step_collectives(build, std::make_shared<comm::FakeGroup>(t.rank(), t.ranks()), adam, meta);
    EXPECT_EQ(fake.size(), real.size());
    for (size_t i = 0; i < std::min(real.size(), fake.size()); ++i) EXPECT_EQ(fake[i], real[i]) << "collective " << i;
  }
}

DTENSOR_TEST_F(FakeWorldThreads, TensorParallelStepCommunicatesAsOnRealRanks) {
  for (bool sp : {false, true}) {
    SCOPED_TRACE(sp ? "sequence parallel" : "tensor parallel");
    expect_fake_matches_real(
        *this, [sp](models::Transformer& m, comm::GroupPtr world, const std::string& device) { build_tp(m, world, device, sp); },
        /*adam=*/false);
  }
}

DTENSOR_TEST_F(FakeWorldThreads, FullyShardedStepCommunicatesAsOnRealRanks) {
  expect_fake_matches_real(*this, build_fsdp, /*adam=*/true);
}

DTENSOR_TEST_F(FakeWorldThreads, FsdpTpStepCommunicatesAsOnRealRanks) {
  DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // a (ranks / 2, 2) mesh
  expect_fake_matches_real(*this, build_fsdp_tp, /*adam=*/true);
}

// Memory: MemTracker's figures for the same step (NOTE: [MemTracker] in
// dtensor/debug/mem_tracker.h), on the real world and on the fake one. The step after the
// first, as a training loop's steady state (Adam's state exists). Neither world's collective
// temporaries count (UntrackedScope): a rank allocates the same blocks in the same order on
// both. The bar for the peaks is an estimate's, 10% (measured: equal to the byte).
struct StepMemory {
  int64_t peak = 0;
  debug::MemoryByUse at_peak;
  debug::HeldMemory held;
  std::vector<debug::ModuleMemoryStats> modules;
  // The most one all-gather's and one reduce-scatter's inputs in backward weigh: what may be in
  // flight at once there (fully_shard prefetches one all-gather and keeps one reduce-scatter
  // pending). A real rank holds such an input until every peer has issued the collective, a
  // fake one frees it when it issues it: within backward a real rank's figures may exceed the
  // fake rank's by what is in flight, depending on how far its peers are.
  int64_t in_flight = 0;
};

StepMemory step_memory(const Build& build, comm::GroupPtr world, bool meta = false) {
  debug::MemTracker mem;
  const models::ModelArgs args = small_args();
  models::Transformer model = make_model(args, meta);
  build(model, world, meta ? "meta" : "cpu");
  torch::optim::Adam opt(nn::parameters(*model), torch::optim::AdamOptions(1e-3));
  const at::Tensor tokens = on(testing::tokens_for(args, 2, 8), meta);
  const at::Tensor targets = on(testing::tokens_for(args, 2, 8).roll(1, 1).flatten(), meta);
  auto step = [&] {
    at::Tensor logits = nn::call(model, tokens);
    torch::nn::functional::cross_entropy(logits.reshape({-1, args.vocab_size}), targets).backward();
    opt.step();
  };
  opt.zero_grad();
  step();
  mem.track_external(*model);
  mem.track_external(opt);
  opt.zero_grad();
  CommDebugMode comm_mode;
  {
    auto active = mem.enter();
    auto recording = comm_mode.enter();
    step();
  }
  int64_t all_gather = 0, reduce_scatter = 0;
  for (const auto& c : comm_mode.get_collectives()) {
    if (!c.backward) continue;
    if (c.op == debug::c10d_functional::all_gather_into_tensor) all_gather = std::max(all_gather, c.input_bytes);
    if (c.op == debug::c10d_functional::reduce_scatter_tensor) reduce_scatter = std::max(reduce_scatter, c.input_bytes);
  }
  return {mem.peak(), mem.peak_by_use(), mem.held(), mem.module_stats(), all_gather + reduce_scatter};
}

DTENSOR_TEST_F(FakeWorldThreads, StepMemoryMatchesRealRanks) {
  DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2);  // the FSDP x TP case's (ranks / 2, 2) mesh
  const std::vector<std::pair<std::string, Build>> cases = {
      {"FSDP", build_fsdp},
      {"TP", [](models::Transformer& m, comm::GroupPtr world, const std::string& device) { build_tp(m, world, device, false); }},
      {"FSDP x TP", build_fsdp_tp},
  };
  for (const auto& [name, build] : cases) {
    SCOPED_TRACE(name);
    const StepMemory real = step_memory(build, group_ptr());
    group().barrier();  // every rank's real step is over before any fake one starts
    ASSERT_GT(real.peak, 0);
    for (bool meta : {false, true}) {
      SCOPED_TRACE(meta ? "fake world on the meta device" : "fake world on the CPU");
      const StepMemory fake = step_memory(build, std::make_shared<comm::FakeGroup>(rank(), ranks()), meta);
      EXPECT_LE(std::abs(static_cast<double>(fake.peak - real.peak)), 0.1 * static_cast<double>(real.peak))
          << "the step's peak: real " << real.peak << " bytes, fake " << fake.peak;
      // The peak by use: each within a tenth of the peak; fully_shard's unsharded parameters are
      // there when it is applied.
      EXPECT_EQ(real.at_peak.total(), real.peak);
      EXPECT_EQ(fake.at_peak.total(), fake.peak);
      const std::vector<std::pair<const char*, int64_t debug::MemoryByUse::*>> uses = {
          {"activations", &debug::MemoryByUse::activations},
          {"backward", &debug::MemoryByUse::backward},
          {"unsharded parameters", &debug::MemoryByUse::unsharded_parameters},
          {"all-gather buffers", &debug::MemoryByUse::all_gather_buffers},
          {"reduce-scatter buffers", &debug::MemoryByUse::reduce_scatter_buffers},
          {"other", &debug::MemoryByUse::other}};
      for (const auto& [use, field] : uses)
        EXPECT_LE(std::abs(static_cast<double>(fake.at_peak.*field - real.at_peak.*field)),
                  0.1 * static_cast<double>(real.peak))
            << use << ": real " << real.at_peak.*field << ", fake " << fake.at_peak.*field;
      if (name != "TP") EXPECT_GT(real.at_peak.unsharded_parameters, 0);
      // What the model and Adam hold is the same tensors' sizes: exactly equal.
      EXPECT_GT(real.held.parameters, 0);
      EXPECT_GT(real.held.gradients, 0);
      EXPECT_EQ(real.held.optimizer_state, 2 * real.held.parameters) << "Adam: two moments per parameter";
      EXPECT_EQ(fake.held.parameters, real.held.parameters);
      EXPECT_EQ(fake.held.buffers, real.held.buffers);
      EXPECT_EQ(fake.held.gradients, real.held.gradients);
      EXPECT_EQ(fake.held.optimizer_state, real.held.optimizer_state);
      // Per module: the same modules in the same order, holding the same bytes when each forward
      // and each backward began and ended; the peaks during each within a tenth of the step's
      // peak.
      ASSERT_EQ(fake.modules.size(), real.modules.size());
      ASSERT_GT(real.modules.size(), 3u);
      for (size_t i = 0; i < real.modules.size(); ++i) {
        const auto &r = real.modules[i], &f = fake.modules[i];
        SCOPED_TRACE(r.fqn);
        EXPECT_EQ(f.fqn, r.fqn);
        EXPECT_EQ(f.calls, r.calls);
        EXPECT_EQ(f.pre_forward, r.pre_forward);
        EXPECT_EQ(f.post_forward, r.post_forward);
        EXPECT_LE(std::abs(static_cast<double>(f.peak_forward - r.peak_forward)), 0.1 * static_cast<double>(real.peak))
            << "real " << r.peak_forward << ", fake " << f.peak_forward << "; the step's peak " << real.peak;
        // Its backward: the bytes when it began and ended, equal but for what the real rank's
        // peers still hold in flight (StepMemory::in_flight; none in TP's step); its peak also
        // within a tenth of the step's peak (a CPU kernel's own scratch, which a meta kernel
        // does not allocate: 128 bytes in layer norm's backward here).
        EXPECT_EQ(f.backward, r.backward);
        const double in_flight = static_cast<double>(fake.in_flight);
        EXPECT_GE(r.pre_backward, f.pre_backward);
        EXPECT_LE(r.pre_backward, f.pre_backward + in_flight) << "with " << in_flight << " bytes in flight";
        EXPECT_GE(r.post_backward, f.post_backward);
        EXPECT_LE(r.post_backward, f.post_backward + in_flight) << "with " << in_flight << " bytes in flight";
        EXPECT_GE(r.peak_backward, f.peak_backward);
        EXPECT_LE(r.peak_backward, f.peak_backward + in_flight + 0.1 * static_cast<double>(real.peak))
            << "with " << in_flight << " bytes in flight; the step's peak " << real.peak;
      }
      EXPECT_EQ(fake.in_flight, real.in_flight);
      if (name == "TP") EXPECT_EQ(fake.in_flight, 0);
      EXPECT_TRUE(real.modules[0].backward) << "the root's backward, which ends with the backward";
      EXPECT_GT(real.modules[0].peak_backward, 0);
      RecordProperty(name + (meta ? "_fake_meta_peak_bytes" : "_fake_peak_bytes"), static_cast<int>(fake.peak));
    }
    RecordProperty(name + "_real_peak_bytes", static_cast<int>(real.peak));
  }
}

// ---- the group itself ------------------------------------------------------------------------

// A "meta" mesh: every tensor on it is a meta tensor (distribute_tensor's shards, factories,
// redistribute's results), the collectives are recorded with the bytes real ones would move,
// and MemTracker counts the meta tensors a step makes. Over a real group it is refused on every
// rank, before any collective.
TEST(FakeGroup, AMetaMeshKeepsEveryTensorOnTheMetaDevice) {
  auto world = std::make_shared<comm::FakeGroup>(300, 512);
  auto mesh = init_device_mesh("meta", {64, 8}, {"dp", "tp"}, world);
  EXPECT_EQ(mesh.device(), c10::Device(c10::kMeta));
  debug::MemTracker mem;
  at::Tensor x = distribute_tensor(at::empty({128, 16}, at::TensorOptions().device(c10::kMeta)), mesh, {Shard{0}, Shard{1}});
  EXPECT_TRUE(local_tensor(x).is_meta());
  EXPECT_EQ(local_tensor(x).sizes(), c10::IntArrayRef({2, 2}));
  at::Tensor ones = dtensor::ones({64, 8}, mesh, {Shard{0}, Replicate{}});
  EXPECT_TRUE(local_tensor(ones).is_meta());
  CommDebugMode mode;
  {
    auto comm_active = mode.enter();
    auto mem_active = mem.enter();
    at::Tensor r = redistribute(x, mesh, {Replicate{}, Replicate{}});
    EXPECT_TRUE(local_tensor(r).is_meta());
    EXPECT_EQ(local_tensor(r).sizes(), c10::IntArrayRef({128, 16}));
    EXPECT_EQ(mem.current(), 128 * 16 * 4) << "the replicated tensor, as a real rank would hold it";
  }
  ASSERT_EQ(mode.get_collectives().size(), 2u);
  EXPECT_EQ(mode.get_collectives().back().output_bytes, 128 * 16 * 4);
  EXPECT_GE(mem.peak(), 128 * 16 * 4);
}

DTENSOR_TEST_F(FakeWorldThreads, AMetaMeshNeedsAFakeWorld) {
  const std::string e = testing::error_of([&] { init_device_mesh("meta", {ranks()}, {}, group_ptr()); });
  EXPECT_TRUE(testing::contains(e, "a meta mesh's tensors have no data, so its world must be a comm::FakeGroup")) << e;
  // The world is still usable: nothing was issued.
  EXPECT_EQ(init_device_mesh("cpu", {ranks()}, {}, group_ptr()).size(), ranks());
}


// Rank 300 of 512 on a (64, 8) mesh: its sub-groups are its row and column, with their global
// ranks; a DTensor sharded over both dims has rank 300's piece; redistributing it records the
// all-gathers a real rank 300 would issue, with their bytes, and nothing is exchanged.
TEST(FakeGroup, AMeshOf512RanksInOneProcess) {
  auto world = std::make_shared<comm::FakeGroup>(300, 512);
  auto mesh = init_device_mesh("cpu", {64, 8}, {"dp", "tp"}, world);
  ASSERT_TRUE(mesh.get_coordinate().has_value());
  EXPECT_EQ(*mesh.get_coordinate(), (std::vector<int64_t>{37, 4}));
  EXPECT_EQ(mesh.get_group("tp")->global_ranks(), (std::vector<int>{296, 297, 298, 299, 300, 301, 302, 303}));
  EXPECT_EQ(mesh.get_group("dp")->global_ranks().at(1), 8 + 4);
  EXPECT_EQ(mesh.get_group("tp")->backend(), "fake");
  const at::Tensor global = at::arange(128 * 16, at::kFloat).reshape({128, 16});
  at::Tensor x = distribute_tensor(global, mesh, {Shard{0}, Shard{1}});
  EXPECT_TRUE(at::equal(local_tensor(x), global.narrow(0, 37 * 2, 2).narrow(1, 4 * 2, 2)));
  CommDebugMode mode;
  {
    auto active = mode.enter();
    at::Tensor r = redistribute(x, mesh, {Replicate{}, Replicate{}});
    EXPECT_EQ(local_tensor(r).sizes(), global.sizes());
  }
  const auto& c = mode.get_collectives();
  ASSERT_EQ(c.size(), 2u) << "one all-gather per mesh dim";
  int64_t in = 0, out = 0;
  for (const auto& r : c) {
    EXPECT_EQ(r.op, debug::c10d_functional::all_gather_into_tensor);
    in += r.input_bytes;
    out += r.output_bytes;
  }
  // [2, 2] -> [2, 16] over tp (8 ranks), then [2, 16] -> [128, 16] over dp (64 ranks), in
  // whichever order the planner takes; either way the received bytes end at the whole tensor.
  EXPECT_EQ(c.back().output_bytes, 128 * 16 * 4);
  EXPECT_GT(in, 0);
  EXPECT_GT(out, in);
}

TEST(FakeGroup, ChecksArgumentsAsARealGroup) {
  using testing::contains;
  using testing::error_of;
  EXPECT_PRED2(contains, error_of([] { comm::FakeGroup(4, 4); }), "FakeGroup: rank 4 is not in a world of 4");
  EXPECT_PRED2(contains, error_of([] { comm::FakeGroup(0, 0); }), "FakeGroup: world size 0 must be at least 1");
  comm::FakeGroup g(1, 4);
  at::Tensor wrong = at::zeros({7});
  EXPECT_PRED2(contains, error_of([&] { g.all_gather_into(wrong, at::ones({2})); }), "all_gather_into");
  at::Tensor t = at::ones({2});
  EXPECT_PRED2(contains, error_of([&] { g.broadcast(t, 4); }), "src");
  EXPECT_PRED2(contains, error_of([&] { g.send(t, 1); }), "a rank cannot send to itself");
  EXPECT_PRED2(contains, error_of([&] { (void)g.new_subgroup({0, 0}); }), "rank 0 is listed twice");
  at::Tensor ints = at::ones({2}, at::kLong);
  EXPECT_PRED2(contains, error_of([&] { g.all_reduce(ints, comm::ReduceOp::AVG); }), "AVG");
}

// The values of a world where every rank passed this rank's inputs; meta tensors untouched.
TEST(FakeGroup, WritesWhatIdenticalRanksWouldGive) {
  comm::FakeGroup g(2, 4);
  at::Tensor s = at::full({3}, 2.0);
  g.all_reduce(s);
  EXPECT_TRUE(at::equal(s, at::full({3}, 8.0)));
  at::Tensor m = at::full({3}, 2.0);
  g.all_reduce(m, comm::ReduceOp::MAX);
  EXPECT_TRUE(at::equal(m, at::full({3}, 2.0)));
  at::Tensor in = at::arange(6, at::kFloat).reshape({3, 2}), out = at::empty({12, 2});
  g.all_gather_into(out, in);
  EXPECT_TRUE(at::equal(out, in.repeat({4, 1})));
  at::Tensor rs = at::empty({2, 2});
  g.reduce_scatter_into(rs, at::arange(16, at::kFloat).reshape({8, 2}));
  EXPECT_TRUE(at::equal(rs, at::arange(8, 12, at::kFloat).reshape({2, 2}) * 4));
  at::Tensor got = at::ones({4});
  g.recv(got, 0);
  EXPECT_TRUE(at::equal(got, at::zeros({4})));
  auto sub = g.new_subgroup({3, 2});
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->rank(), 1);
  EXPECT_EQ(sub->global_ranks(), (std::vector<int>{3, 2}));
  EXPECT_EQ(g.new_subgroup({0, 1}), nullptr);
  const auto meta = at::TensorOptions().device(at::kMeta);
  at::Tensor big_out = at::empty({int64_t{1} << 40}, meta);
  g.all_gather_into(big_out, at::empty({int64_t{1} << 38}, meta));  // 4 TiB: nothing allocated
  EXPECT_TRUE(big_out.is_meta());
}

}  // namespace
}  // namespace dtensor
