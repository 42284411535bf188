// FSDP communication overlap (NOTE: [FSDP communication overlap] in dtensor/fsdp/fully_shard.h),
// ranks as Gloo processes and as threads, on a stack of four blocks with uneven shards:
//   - the FSDP trace shows each prefetched all-gather issued before the previous module's
//     compute ends (forward: explicit prefetch only; backward: explicit or PyTorch's default);
//   - prefetching changes no result: losses, gradients and parameters bit-identical to no
//     prefetch, and equal to one rank trained on the global batch (FSDP, reshard_after_forward=2,
//     HSDP), step after step;
//   - reshard_after_forward=false gathers each group once per step, prefetch or not;
//   - backward() returns with every reduce-scatter finished (at most one in flight before);
//   - prefetching stops at kMaxPrefetchedGroups groups ahead; reshard() waits for a prefetch in
//     flight;
//   - a backward prefetch list naming a module other than the next one still matches one rank;
//   - a backward that raises part-way leaves no gradient behind for the next step.
#include "dtensor/fsdp/fsdp.h"
#include "dtensor/nn/nn.h"
#include "harness/harness.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/rank_modes.h"
#include "suites/testing/training.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace dtensor {
namespace {

namespace funcol = debug::c10d_functional;  // PyTorch's alias of the functional collectives

using Kind = fsdp::FSDPTraceEvent::Kind;
using Trace = std::vector<fsdp::FSDPTraceEvent>;
using testing::Block;
using testing::BlockImpl;
using testing::init_deterministic;
using testing::mean_square;
using testing::values;

constexpr double kRtol = 1e-4;
constexpr double kAtol = 1e-5;
constexpr int kLayers = 4;
constexpr int kGroups = kLayers + 1;  // the blocks and the root (the head)
constexpr size_t kNone = static_cast<size_t>(-1);


// Blocks 7 -> 15 -> 17 -> 9 -> 5 (uneven, and at 8 ranks empty, shards) and a head 5 -> 7 that
// stays with the root.
class StackImpl : public torch::nn::Module {
 public:
  StackImpl() {
    layers = register_module("layers", torch::nn::ModuleList());
    const int64_t dims[] = {7, 15, 17, 9, 5};
    for (int i = 0; i < kLayers; ++i) layers->push_back(Block(dims[i], dims[i + 1]));
    head = register_module("head", torch::nn::Linear(5, 7));
  }
  at::Tensor forward(at::Tensor x) {
    for (size_t i = 0; i < layers->size(); ++i) {
      x = nn::call(layers->ptr<BlockImpl>(i), x);
      // Raises when the gradient reaches block 1's output: blocks 2, 3 and the head are done.
      if (i == 1 && fail_backward)
        x.register_hook([](const at::Tensor&) -> at::Tensor { TORCH_CHECK(false, "injected backward failure"); });
    }
    return nn::call(head, x);
  }
  torch::nn::ModuleList layers{nullptr};
  torch::nn::Linear head{nullptr};
  bool fail_backward = false;
};
TORCH_MODULE(Stack);

std::string layer(int i) { return "layers." + std::to_string(i); }

fsdp::FSDPModule layer_module(Stack& m, int i) { return *fsdp::get_fsdp_module(*m->layers[i]); }

// fully_shard on each block, then the root. With `prefetch`, PyTorch's recipe: block i prefetches
// block i+1 in forward, block i+1 prefetches block i in backward.
fsdp::FSDPModule shard(Stack& m, const fsdp::FullyShardOptions& opts, bool prefetch) {
  for (int i = 0; i < kLayers; ++i) fsdp::fully_shard(*m->layers->ptr(i), opts);
  fsdp::FSDPModule root = fsdp::fully_shard(m, opts);
  if (prefetch) {
    for (int i = 0; i + 1 < kLayers; ++i) {
      layer_module(m, i).set_modules_to_forward_prefetch({layer_module(m, i + 1)});
      layer_module(m, i + 1).set_modules_to_backward_prefetch({layer_module(m, i)});
    }
  }
  return root;
}

// The count of `op` (0 when absent).
int64_t count_of(const debug::CommCounts& counts, const std::string& op) {
  auto it = counts.find(op);
  return it == counts.end() ? 0 : it->second;
}

// Position of the first `kind` event of module `fqn` at or after `from`, or kNone.
size_t find(const Trace& trace, Kind kind, const std::string& fqn, size_t from = 0) {
  for (size_t i = from; i < trace.size(); ++i) {
    if (trace[i].kind == kind && trace[i].module_fqn == fqn) return i;
  }
  return kNone;
}

int64_t count(const Trace& trace, Kind kind) {
  int64_t n = 0;
  for (const auto& e : trace) n += e.kind == kind ? 1 : 0;
  return n;
}

// `issued` (an all-gather) happened before `end` (the end of a compute): earlier in the trace
// (which is in program order) and not later on the clock.
bool issued_before(const Trace& trace, size_t issued, size_t end) {
  return issued != kNone && end != kNone && issued < end && trace[issued].time <= trace[end].time;
}

// This rank's rows of a global batch.
at::Tensor my_rows(const at::Tensor& global, int64_t rank, int64_t world) {
  const int64_t per = global.size(0) / world;
  return global.narrow(0, rank * per, per);
}

// The mean of a scalar over the ranks (collective).
double mean_over_ranks(testing::MultiRankTest& t, const at::Tensor& scalar) {
  at::Tensor v = scalar.detach().clone().reshape({1});
  t.group().all_reduce(v, comm::ReduceOp::SUM);
  return v.item<double>() / t.group().size();
}

// PyTorch's check_sharded_parity: every sharded parameter (or gradient) of `sharded` equals
// distribute_tensor of `ref`'s on the same mesh and placements. Collective.
void expect_sharded_parity(torch::nn::Module& ref, torch::nn::Module& sharded, bool grads, const std::string& when) {
  auto r = nn::named_parameters(ref), s = nn::named_parameters(sharded);
  ASSERT_EQ(r.size(), s.size()) << when;
  for (size_t i = 0; i < r.size(); ++i) {
    SCOPED_TRACE(when + ": " + r[i].first + (grads ? " (gradient)" : ""));
    const at::Tensor& a = grads ? r[i].second.grad() : r[i].second;
    const at::Tensor& b = grads ? s[i].second.grad() : s[i].second;
    ASSERT_TRUE(a.defined() && b.defined() && is_dtensor(b));
    const DTensorSpec& spec = get_spec(s[i].second);
    at::Tensor expected = distribute_tensor(a.detach(), spec.mesh, spec.placements);
    EXPECT_TRUE(testing::tensors_close(local_tensor(expected), local_tensor(b), kRtol, kAtol));
  }
}

// Every local parameter (or gradient) of `a` equals `b`'s bit for bit.
void expect_bitwise_equal(torch::nn::Module& a, torch::nn::Module& b, bool grads, const std::string& when) {
  auto pa = nn::named_parameters(a), pb = nn::named_parameters(b);
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    const at::Tensor& x = grads ? pa[i].second.grad() : pa[i].second;
    const at::Tensor& y = grads ? pb[i].second.grad() : pb[i].second;
    ASSERT_TRUE(x.defined() && y.defined()) << when << ": " << pa[i].first;
    EXPECT_TRUE(local_tensor(x).equal(local_tensor(y))) << when << ": " << pa[i].first << (grads ? " (gradient)" : "");
  }
}

DTENSOR_RANK_FIXTURES(FsdpOverlapGloo, FsdpOverlapThreads);

// ---- (a) The trace shows the overlap ---------------------------------------------------------

// All-gathers of block i > 0 issued before block i-1's forward compute ended.
int forward_prefetched(const Trace& trace, size_t forward_end) {
  int early = 0;
  for (int i = 1; i < kLayers; ++i) {
    const size_t issued = find(trace, Kind::kAllGatherIssued, layer(i));
    EXPECT_LT(issued, forward_end) << layer(i) << " not gathered in forward";
    early += issued_before(trace, issued, find(trace, Kind::kForwardEnd, layer(i - 1))) ? 1 : 0;
  }
  return early;
}

// All-gathers of block i-1 issued (in backward) before block i's backward compute began, hence
// before it ended; the last block's, before the root's backward began.
int backward_prefetched(const Trace& trace, size_t forward_end) {
  int early = 0;
  for (int i = 1; i <= kLayers; ++i) {
    const std::string next = i == kLayers ? "" : layer(i);
    const size_t issued = find(trace, Kind::kAllGatherIssued, layer(i - 1), forward_end);
    EXPECT_NE(issued, kNone) << layer(i - 1) << " not gathered in backward";
    const size_t begin = find(trace, Kind::kBackwardBegin, next, forward_end);
    const size_t end = find(trace, Kind::kBackwardEnd, next, forward_end);
    early += issued_before(trace, issued, begin) && issued_before(trace, issued, end) ? 1 : 0;
  }
  return early;
}

// Every all-gather was awaited before its module computed; every reduce-scatter issued was
// finished, never more than one in flight.
void expect_collectives_complete(const Trace& trace, const std::string& when) {
  EXPECT_EQ(count(trace, Kind::kAllGatherIssued), count(trace, Kind::kAllGatherWaited)) << when;
  for (int i = 0; i < kLayers; ++i) {
    const size_t waited = find(trace, Kind::kAllGatherWaited, layer(i));
    EXPECT_TRUE(waited != kNone && waited < find(trace, Kind::kForwardBegin, layer(i))) << when << " " << layer(i);
  }
  int64_t in_flight = 0, most = 0;
  for (const auto& e : trace) {
    if (e.kind == Kind::kReduceScatterIssued) most = std::max(most, ++in_flight);
    if (e.kind == Kind::kReduceScatterFinished) --in_flight;
  }
  EXPECT_EQ(count(trace, Kind::kReduceScatterIssued), kGroups) << when;
  EXPECT_EQ(in_flight, 0) << when << ": reduce-scatters unfinished when backward() returned";
  EXPECT_EQ(most, 1) << when << ": reduce-scatters in flight at once";
}

DTENSOR_TEST_BOTH(FsdpOverlapGloo, FsdpOverlapThreads, TraceShowsAllGathersIssuedBeforeThePreviousComputeEnds) {
  const at::Tensor global = values({2 * t.ranks(), 7}, 0.3);
  for (bool prefetch : {false, true}) {
    SCOPED_TRACE(prefetch ? "explicit prefetch" : "default prefetch");
    Stack model;
    init_deterministic(*model);
    model->to(c10::Device(t.device_type()));
    fsdp::FullyShardOptions opts;
    opts.mesh = init_device_mesh(t.device_type(), {t.ranks()}, {}, t.group_ptr());
    fsdp::FSDPModule root = shard(model, opts, prefetch);
    torch::optim::SGD opt(nn::parameters(*model), torch::optim::SGDOptions(0.05));
    const at::Tensor input = my_rows(global, t.rank(), t.ranks()).to(c10::Device(t.device_type()));
    for (int step = 0; step < 3; ++step) {
      const std::string when = "step " + std::to_string(step);
      opt.zero_grad();
      root.set_trace(true);
      mean_square(nn::call(model, input)).backward();
      const Trace trace = root.trace();
      const size_t forward_end = find(trace, Kind::kForwardEnd, "");
      ASSERT_NE(forward_end, kNone) << when;
      const size_t first_begin = find(trace, Kind::kForwardBegin, layer(0));
      ASSERT_NE(first_begin, kNone) << when;
      EXPECT_EQ(trace[first_begin].index, 1) << "the blocks follow the root (0) in module order";
      // Forward: only an explicit prefetch issues a block's all-gather during the previous
      // block's compute. Backward: PyTorch's default prefetch does it as well.
      EXPECT_EQ(forward_prefetched(trace, forward_end), prefetch ? kLayers - 1 : 0) << when << " forward";
      EXPECT_EQ(backward_prefetched(trace, forward_end), kLayers) << when << " backward";
      expect_collectives_complete(trace, when);
      opt.step();
    }
    // Stopping keeps what was recorded and records nothing more.
    const size_t recorded = root.trace().size();
    root.set_trace(false);
    at::NoGradGuard no_grad;
    nn::call(model, input);
    EXPECT_EQ(root.trace().size(), recorded);
  }
}

// ---- (b) Prefetching changes no result ---------------------------------------------------------

struct ParityCase {
  std::string name;
  std::vector<int64_t> mesh_shape;  // 1-D: FSDP; 2-D: HSDP (replicate, shard)
  std::optional<fsdp::ReshardAfterForward> reshard_after_forward;
};

std::vector<ParityCase> parity_cases(int ranks) {
  std::vector<ParityCase> out{{"FSDP", {ranks}, std::nullopt}};
  if (ranks % 2 == 0) {
    out.push_back({"FSDP reshard_after_forward=2", {ranks}, fsdp::ReshardAfterForward(2)});
    out.push_back({"HSDP", {2, ranks / 2}, std::nullopt});
  }
  return out;
}

// Trains one rank on the global batch, and FSDP without and with prefetch on this rank's rows.
void check_prefetch_parity(testing::MultiRankTest& t, const ParityCase& c) {
  SCOPED_TRACE(c.name);
  const c10::Device device(t.device_type());
  Stack ref, off, on;
  for (Stack* m : {&ref, &off, &on}) {
    init_deterministic(**m);
    (*m)->to(device);
  }
  fsdp::FullyShardOptions opts;
  const std::vector<std::string> names =  // HSDP's 2-D mesh names its dims (fully_shard requires it)
      c.mesh_shape.size() == 2 ? std::vector<std::string>{"replicate", "shard"} : std::vector<std::string>{};
  opts.mesh = init_device_mesh(t.device_type(), c.mesh_shape, names, t.group_ptr());
  opts.reshard_after_forward = c.reshard_after_forward;
  shard(off, opts, /*prefetch=*/false);
  shard(on, opts, /*prefetch=*/true);
  auto make = [](Stack& m) { return torch::optim::SGD(nn::parameters(*m), torch::optim::SGDOptions(0.05).momentum(0.9)); };
  auto opt_ref = make(ref), opt_off = make(off), opt_on = make(on);
  const at::Tensor global = values({2 * t.ranks(), 7}, 0.3).to(device);
  const at::Tensor input = my_rows(global, t.rank(), t.ranks());
  for (int step = 0; step < 4; ++step) {
    const std::string when = "step " + std::to_string(step);
    for (auto* o : {&opt_ref, &opt_off, &opt_on}) o->zero_grad();
    at::Tensor loss_ref = mean_square(nn::call(ref, global));
    at::Tensor loss_off = mean_square(nn::call(off, input));
    at::Tensor loss_on = mean_square(nn::call(on, input));
    EXPECT_TRUE(loss_on.equal(loss_off)) << when << " loss";
    EXPECT_NEAR(loss_ref.item<double>(), mean_over_ranks(t, loss_on), 1e-5) << when << " loss";
    loss_ref.backward();
    loss_off.backward();
    loss_on.backward();
    expect_bitwise_equal(*on, *off, /*grads=*/true, when);
    expect_sharded_parity(*ref, *on, /*grads=*/true, when);
    for (auto* o : {&opt_ref, &opt_off, &opt_on}) o->step();
    expect_bitwise_equal(*on, *off, /*grads=*/false, when + " after the step");
    expect_sharded_parity(*ref, *on, /*grads=*/false, when + " after the step");
  }
}

DTENSOR_TEST_BOTH(FsdpOverlapGloo, FsdpOverlapThreads, PrefetchMatchesNoPrefetchAndOneRank) {
  for (const ParityCase& c : parity_cases(t.ranks())) check_prefetch_parity(t, c);
}

// ---- (c) reshard_after_forward=false gathers nothing twice -------------------------------------

DTENSOR_TEST_BOTH(FsdpOverlapGloo, FsdpOverlapThreads, NoReshardAfterForwardGathersEachGroupOncePerStep) {
  for (bool prefetch : {false, true}) {
    SCOPED_TRACE(prefetch ? "explicit prefetch" : "default prefetch");
    testing::CommCounter counting;
    Stack model;
    init_deterministic(*model);
    model->to(c10::Device(t.device_type()));
    fsdp::FullyShardOptions opts;
    opts.mesh = init_device_mesh(t.device_type(), {t.ranks()}, {}, t.group_ptr());
    opts.reshard_after_forward = false;
    fsdp::FSDPModule root = shard(model, opts, prefetch);
    const at::Tensor input = values({2, 7}, 0.1).to(c10::Device(t.device_type()));
    for (int step = 0; step < 3; ++step) {
      counting.reset();
      root.set_trace(true);
      mean_square(nn::call(model, input)).backward();
      const auto counts = counting.counts();
      EXPECT_EQ(count_of(counts, funcol::all_gather_into_tensor), kGroups) << "step " << step;
      EXPECT_EQ(count_of(counts, funcol::reduce_scatter_tensor), kGroups) << "step " << step;
      EXPECT_EQ(count(root.trace(), Kind::kAllGatherIssued), kGroups) << "step " << step;
    }
  }
}

// ---- (d) backward() returns with the gradients reduced -----------------------------------------

// Right after backward(), with nothing in between: every sharded gradient is there and right,
// whether the root's post-backward runs from its input's gradient (the input requires grad) or
// from the final callback (it does not).
DTENSOR_TEST_BOTH(FsdpOverlapGloo, FsdpOverlapThreads, BackwardReturnsWithEveryReduceScatterFinished) {
  const c10::Device device(t.device_type());
  const at::Tensor global = values({2 * t.ranks(), 7}, 0.2).to(device);
  for (bool input_requires_grad : {false, true}) {
    SCOPED_TRACE(input_requires_grad ? "input requires grad" : "input without grad");
    Stack ref, model;
    init_deterministic(*ref);
    init_deterministic(*model);
    ref->to(device);
    model->to(device);
    fsdp::FullyShardOptions opts;
    opts.mesh = init_device_mesh(t.device_type(), {t.ranks()}, {}, t.group_ptr());
    fsdp::FSDPModule root = shard(model, opts, /*prefetch=*/true);
    mean_square(nn::call(ref, global)).backward();
    at::Tensor input = my_rows(global, t.rank(), t.ranks()).clone().requires_grad_(input_requires_grad);
    root.set_trace(true);
    mean_square(nn::call(model, input)).backward();
    expect_sharded_parity(*ref, *model, /*grads=*/true, "after backward");
    const Trace trace = root.trace();
    EXPECT_EQ(count(trace, Kind::kReduceScatterFinished), kGroups);
    EXPECT_EQ(count(trace, Kind::kReduceScatterIssued), kGroups);
  }
}

// Two copies of Stack with the same parameters on the test's device, fully_shard-ed on the world
// without prefetch lists: `model` gets the prefetch under test, `plain` is the reference. Returns
// model's root.
fsdp::FSDPModule shard_pair(testing::MultiRankTest& t, Stack& plain, Stack& model) {
  const c10::Device device(t.device_type());
  init_deterministic(*plain);
  init_deterministic(*model);
  plain->to(device);
  model->to(device);
  fsdp::FullyShardOptions opts;
  opts.mesh = init_device_mesh(t.device_type(), {t.ranks()}, {}, t.group_ptr());
  shard(plain, opts, /*prefetch=*/false);
  return shard(model, opts, /*prefetch=*/false);
}

// A backward that raises part-way, after some groups reduce-scattered their gradients (one of
// them still in flight), leaves nothing behind: the next step's gradients and parameters are
// those of a model that never ran the failed step.
DTENSOR_TEST_BOTH(FsdpOverlapGloo, FsdpOverlapThreads, FailedBackwardLeavesNoGradientBehind) {
  Stack plain, model;
  shard_pair(t, plain, model);
  auto make = [](Stack& m) { return torch::optim::SGD(nn::parameters(*m), torch::optim::SGDOptions(0.05).momentum(0.9)); };
  auto opt_plain = make(plain), opt_model = make(model);
  const at::Tensor global = values({2 * t.ranks(), 7}, 0.4).to(c10::Device(t.device_type()));
  const at::Tensor input = my_rows(global, t.rank(), t.ranks());
  auto step = [&](Stack& m, torch::optim::SGD& opt) {
    opt.zero_grad();
    mean_square(nn::call(m, input)).backward();
  };
  step(plain, opt_plain);
  step(model, opt_model);
  opt_plain.step();
  opt_model.step();
  model->fail_backward = true;
  opt_model.zero_grad();
  at::Tensor loss = mean_square(nn::call(model, input));
  std::string error = "<no error>";
  try {
    loss.backward();
  } catch (const std::exception& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("injected backward failure"), std::string::npos) << error;
  model->fail_backward = false;
  for (int i = 0; i < 2; ++i) {
    const std::string when = "step " + std::to_string(i) + " after the failed backward";
    step(plain, opt_plain);
    step(model, opt_model);
    expect_bitwise_equal(*model, *plain, /*grads=*/true, when);
    opt_plain.step();
    opt_model.step();
    expect_bitwise_equal(*model, *plain, /*grads=*/false, when);
  }
}

// A backward prefetch list naming a module other than the next one to run: blocks 3 and 2 both
// prefetch block 0 (as FSDP2 allows), and block 0, the last to run backward, prefetches block 3,
// whose backward is over (PyTorch's test_backward_misprefetch: in_proj prefetches out_proj). The
// prefetch is only early work: block 1 gathers in its own pre-backward, block 0's all-gather is
// waited for once, block 3's is dropped at the end of backward (its parameters change in the
// step), and losses, gradients and parameters match one rank on the global batch step after
// step.
DTENSOR_TEST_BOTH(FsdpOverlapGloo, FsdpOverlapThreads, MistargetedBackwardPrefetchMatchesOneRank) {
  const c10::Device device(t.device_type());
  // Resharding after forward (the default) or not, with SGD's momentum or Adam's state.
  for (const bool reshard : {true, false}) {
    SCOPED_TRACE(reshard ? "reshard_after_forward default, SGD" : "reshard_after_forward=false, Adam");
    Stack ref, model;
    init_deterministic(*ref);
    init_deterministic(*model);
    ref->to(device);
    model->to(device);
    fsdp::FullyShardOptions opts;
    opts.mesh = init_device_mesh(t.device_type(), {t.ranks()}, {}, t.group_ptr());
    if (!reshard) opts.reshard_after_forward = false;
    shard(model, opts, /*prefetch=*/false);
    layer_module(model, 3).set_modules_to_backward_prefetch({layer_module(model, 0)});
    layer_module(model, 2).set_modules_to_backward_prefetch({layer_module(model, 0)});
    layer_module(model, 0).set_modules_to_backward_prefetch({layer_module(model, 3)});
    auto make = [reshard](Stack& m) -> std::unique_ptr<torch::optim::Optimizer> {
      if (reshard) {
        return std::make_unique<torch::optim::SGD>(nn::parameters(*m), torch::optim::SGDOptions(0.05).momentum(0.9));
      }
      return std::make_unique<torch::optim::Adam>(nn::parameters(*m), torch::optim::AdamOptions(1e-2));
    };
    auto opt_ref = make(ref), opt_model = make(model);
    const at::Tensor global = values({2 * t.ranks(), 7}, 0.3).to(device);
    const at::Tensor input = my_rows(global, t.rank(), t.ranks());
    for (int step = 0; step < 4; ++step) {
      const std::string when = "step " + std::to_string(step);
      opt_ref->zero_grad();
      opt_model->zero_grad();
      at::Tensor loss_ref = mean_square(nn::call(ref, global));
      at::Tensor loss = mean_square(nn::call(model, input));
      EXPECT_NEAR(loss_ref.item<double>(), mean_over_ranks(t, loss), 1e-5) << when << " loss";
      loss_ref.backward();
      loss.backward();
      expect_sharded_parity(*ref, *model, /*grads=*/true, when);
      opt_ref->step();
      opt_model->step();
      expect_sharded_parity(*ref, *model, /*grads=*/false, when + " after the step");
    }
  }
}

// ---- The prefetch bound, and resharding under a prefetch ----------------------------------------

// Block 0 asks to prefetch blocks 1, 2 and 3 in forward: kMaxPrefetchedGroups (2) are issued in
// its pre-forward, block 3 gathers in its own.
DTENSOR_TEST_BOTH(FsdpOverlapGloo, FsdpOverlapThreads, PrefetchStopsAtTwoGroupsAhead) {
  ASSERT_EQ(fsdp::kMaxPrefetchedGroups, 2);
  const c10::Device device(t.device_type());
  Stack plain, model;
  fsdp::FSDPModule root = shard_pair(t, plain, model);
  layer_module(model, 0).set_modules_to_forward_prefetch(
      {layer_module(model, 1), layer_module(model, 2), layer_module(model, 3)});
  const at::Tensor input = values({2, 7}, 0.4).to(device);
  for (int step = 0; step < 2; ++step) {
    root.set_trace(true);
    at::Tensor loss = mean_square(nn::call(model, input));
    const Trace trace = root.trace();
    const size_t begin0 = find(trace, Kind::kForwardBegin, layer(0));
    EXPECT_LT(find(trace, Kind::kAllGatherIssued, layer(1)), begin0);
    EXPECT_LT(find(trace, Kind::kAllGatherIssued, layer(2)), begin0);
    EXPECT_GT(find(trace, Kind::kAllGatherIssued, layer(3)), find(trace, Kind::kForwardEnd, layer(2)));
    at::Tensor loss_plain = mean_square(nn::call(plain, input));
    EXPECT_TRUE(loss.equal(loss_plain)) << "step " << step;
    loss.backward();
    loss_plain.backward();
    expect_bitwise_equal(*model, *plain, /*grads=*/true, "step " + std::to_string(step));
  }
}

// The last block prefetches the first, which this forward has already run: the all-gather is
// still in flight after forward. reshard() waits for it (never freeing a buffer it writes) and
// drops it: the module stays sharded. In the training steps that follow, the same prefetch is
// consumed by the first block's pre-backward, with the results of no prefetch.
DTENSOR_TEST_BOTH(FsdpOverlapGloo, FsdpOverlapThreads, ReshardWaitsForAPrefetchInFlight) {
  const c10::Device device(t.device_type());
  Stack plain, model;
  shard_pair(t, plain, model);
  fsdp::FSDPModule first = layer_module(model, 0);
  layer_module(model, kLayers - 1).set_modules_to_forward_prefetch({first});
  const at::Tensor input = values({2, 7}, 0.4).to(device);
  {
    at::NoGradGuard no_grad;
    EXPECT_TRUE(nn::call(model, input).equal(nn::call(plain, input)));
  }
  EXPECT_FALSE(first.is_unsharded());  // in flight, not yet waited for
  first.reshard();
  EXPECT_FALSE(first.is_unsharded());
  for (auto& p : nn::parameters(*model->layers[0])) EXPECT_TRUE(is_dtensor(p));
  for (int step = 0; step < 2; ++step) {
    at::Tensor loss = mean_square(nn::call(model, input)), loss_plain = mean_square(nn::call(plain, input));
    EXPECT_TRUE(loss.equal(loss_plain)) << "step " << step;
    loss.backward();
    loss_plain.backward();
    expect_bitwise_equal(*model, *plain, /*grads=*/true, "step " + std::to_string(step));
  }
  EXPECT_FALSE(first.is_unsharded());
}

TEST(FsdpTraceEvent, KindsHaveNames) {
  EXPECT_EQ(fsdp::to_string(Kind::kAllGatherIssued), "all_gather_issued");
  EXPECT_EQ(fsdp::to_string(Kind::kAllGatherWaited), "all_gather_waited");
  EXPECT_EQ(fsdp::to_string(Kind::kForwardBegin), "forward_begin");
  EXPECT_EQ(fsdp::to_string(Kind::kForwardEnd), "forward_end");
  EXPECT_EQ(fsdp::to_string(Kind::kBackwardBegin), "backward_begin");
  EXPECT_EQ(fsdp::to_string(Kind::kBackwardEnd), "backward_end");
  EXPECT_EQ(fsdp::to_string(Kind::kReduceScatterIssued), "reduce_scatter_issued");
  EXPECT_EQ(fsdp::to_string(Kind::kReduceScatterFinished), "reduce_scatter_finished");
}

}  // namespace
}  // namespace dtensor
