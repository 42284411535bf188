// FSDP figures: tp_benchmark's wider Transformer (dim 256, 8 heads, vocab 1024,
// seq 64, 2 layers, dropout 0), one training step (forward, cross-entropy, backward, Adam
// step) with a global batch of 8 sequences:
//   mode 0: one rank, the whole batch;
//   mode 1: fully_shard on 4 ranks (blocks, then the root), 2 sequences per rank;
//   mode 2: the model replicated on 4 ranks with one flat all-reduce of the gradients after
//           backward (DDP-like), 2 sequences per rank;
//   mode 3: 2-D FSDP x TP on a 2x2 (dp, tp) mesh: Transformer::parallelize (no sequence
//           parallelism) on mesh["tp"], then fully_shard (blocks, root) on mesh["dp"]; 4
//           sequences per dp rank;
//   mode 4: tensor parallel only, 4-way (Transformer::parallelize on the 4 ranks), the whole
//           batch on every rank;
//   mode 5: mode 1 without any prefetch: every module's backward prefetch list is itself, which
//           turns off the default backward prefetch (a module is unsharded when its list is
//           issued, so that prefetch does nothing), and no forward prefetch: each all-gather is
//           issued and awaited in its module's own pre-hook;
//   mode 6: mode 1 with explicit prefetch of the next module (NOTE: [FSDP communication
//           overlap]): the root and block i prefetch block 0 / i+1 in forward, block i+1
//           prefetches block i in backward (the root keeps the default: the last block);
//   (mode 1 itself has the default: backward prefetch of the previous module in forward order,
//   none in forward, as PyTorch's FSDP2.)
// ranks as threads (ThreadGroup) and as Gloo processes (the harness's worker pool). Counters:
// state_bytes (this rank's parameters + gradients + Adam state), state_ratio (state_bytes over
// the unsharded model's), peak_bytes (peak of allocated CPU memory during a step, threads only:
// NOTE: [Per-rank memory accounting]), peak_bound (the backward bound of PyTorch's FSDP2 memory
// test, test/distributed/_composable/fsdp/test_fully_shard_memory.py, reshard_after_forward:
// sharded states + 3 x the largest unsharded block (the prefetched block's all-gather, the
// block's unsharded gradients, its reduce-scatter input) + the root's unsharded (non-block)
// parameters + activations; the sharded states include Adam's, since the step is measured
// after a warm-up step, and the activations are measured as the peak of a plain model's step
// on 2 sequences above its states), collectives per step.
//
//   build/benchmarks/fsdp_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include "benchmarks/process_bench.h"
#include "dtensor/comm/comm.h"
#include "dtensor/fsdp/fsdp.h"
#include "dtensor/nn/nn.h"
#include "dtensor/parallel/parallel.h"
#include "dtensor/tensor/dtensor.h"
#include "models/models.h"
#include "suites/testing/comm_counter.h"
#include "dtensor/debug/tracking_allocator_internal.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <chrono>
#include <mutex>

namespace dtensor {
namespace {

constexpr int kWorld = 4;
constexpr int64_t kGlobalBatch = 8;
using debug::detail::TrackingAllocator;

enum Mode { kOneRank = 0, kFsdp = 1, kDdp = 2, kFsdpTp = 3, kTp = 4, kFsdpNoPrefetch = 5, kFsdpPrefetch = 6 };

bool is_fsdp(Mode mode) { return mode == kFsdp || mode == kFsdpNoPrefetch || mode == kFsdpPrefetch; }

// Modes 5 and 6 (after fully_shard on the blocks and the root).
void set_prefetch(Mode mode, models::Transformer& model) {
  std::vector<fsdp::FSDPModule> blocks;
  for (size_t i = 0; i < model->layers->size(); ++i) blocks.push_back(*fsdp::get_fsdp_module(*model->layers[i]));
  fsdp::FSDPModule root = *fsdp::get_fsdp_module(*model);
  if (mode == kFsdpNoPrefetch) {
    for (auto& b : blocks) b.set_modules_to_backward_prefetch({b});
    root.set_modules_to_backward_prefetch({root});
  } else if (mode == kFsdpPrefetch) {
    root.set_modules_to_forward_prefetch({blocks.front()});
    for (size_t i = 0; i + 1 < blocks.size(); ++i) {
      blocks[i].set_modules_to_forward_prefetch({blocks[i + 1]});
      blocks[i + 1].set_modules_to_backward_prefetch({blocks[i]});
    }
  }
}

// Sequences per rank on 4 ranks, and which block of the global batch rank r takes.
int64_t batch_of(Mode mode) { return mode == kFsdpTp ? kGlobalBatch / 2 : mode == kTp ? kGlobalBatch : kGlobalBatch / kWorld; }
int64_t block_of(Mode mode, int rank) { return mode == kFsdpTp ? rank / 2 : mode == kTp ? 0 : rank; }

models::ModelArgs bench_args() {
  models::ModelArgs a;
  a.dropout_p = 0.0;
  a.dim = 256;
  a.n_heads = 8;
  a.vocab_size = 1024;
  a.max_seq_len = 64;
  return a;
}

int64_t local_bytes(const at::Tensor& t) {
  if (!t.defined()) return 0;
  const at::Tensor& l = is_dtensor(t) ? local_tensor(t) : t;
  return l.numel() * static_cast<int64_t>(l.element_size());
}

struct Trainer {
  Trainer(Mode mode, int64_t batch, int rank, comm::GroupPtr group, int64_t block = -1)
      : args(bench_args()), mode(mode), group(group) {
    model = models::Transformer(args);
    if (block < 0) block = rank;
    if (mode == kFsdpTp) {
      // parallelize broadcasts the parameters from each tp group's first rank.
      auto mesh = init_device_mesh("cpu", {2, group->size() / 2}, {"dp", "tp"}, group);
      models::Transformer::parallelize(model, mesh["tp"], false);
      fsdp::FullyShardOptions opts;
      opts.mesh = mesh["dp"];
      for (size_t i = 0; i < model->layers->size(); ++i) fsdp::fully_shard(*model->layers->ptr(i), opts);
      fsdp::fully_shard(model, opts);
    } else if (mode == kTp) {
      models::Transformer::parallelize(model, init_device_mesh("cpu", {group->size()}, {}, group), false);
    } else if (is_fsdp(mode)) {
      fsdp::FullyShardOptions opts;
      opts.mesh = init_device_mesh("cpu", {group->size()}, {}, group);
      for (size_t i = 0; i < model->layers->size(); ++i) {
        int64_t bytes = 0;
        for (const auto& p : model->layers[i]->parameters()) bytes += local_bytes(p);
        largest_block_bytes = std::max(largest_block_bytes, bytes);
        fsdp::fully_shard(*model->layers->ptr(i), opts);
      }
      for (const auto& p : nn::parameters(*model)) root_bytes += is_dtensor(p) ? 0 : local_bytes(p);
      fsdp::fully_shard(model, opts);
      set_prefetch(mode, model);
    }
    opt = std::make_unique<torch::optim::Adam>(nn::parameters(*model), torch::optim::AdamOptions(1e-3));
    const int64_t seq = args.max_seq_len;
    at::Tensor all = (at::arange(kGlobalBatch * seq, at::kLong) * 7 + 1).remainder(args.vocab_size).view({kGlobalBatch, seq});
    tokens = all.narrow(0, block * batch, batch);
    targets = tokens.roll(1, 1).flatten();
  }
  void step() {
    opt->zero_grad();
    at::Tensor logits = nn::call(model, tokens);
    torch::nn::functional::cross_entropy(logits.view({-1, args.vocab_size}), targets).backward();
    if (mode == kDdp) all_reduce_grads();
    opt->step();
  }
  // One flat all-reduce of every gradient, averaged.
  void all_reduce_grads() {
    std::vector<at::Tensor> grads;
    for (const auto& p : nn::parameters(*model)) grads.push_back(p.grad().flatten());
    at::Tensor flat = at::cat(grads);
    group->all_reduce(flat, comm::ReduceOp::SUM);
    flat.div_(group->size());
    int64_t off = 0;
    for (const auto& p : nn::parameters(*model)) {
      at::Tensor g = p.mutable_grad();
      g.copy_(flat.narrow(0, off, g.numel()).view_as(g));
      off += g.numel();
    }
  }
  // Parameters + gradients + Adam state of this rank.
  int64_t state_bytes() const {
    int64_t n = 0;
    for (const auto& p : opt->param_groups()[0].params()) n += local_bytes(p) + local_bytes(p.grad());
    for (const auto& kv : opt->state()) {
      const auto& s = static_cast<const torch::optim::AdamParamState&>(*kv.second);
      n += local_bytes(s.exp_avg()) + local_bytes(s.exp_avg_sq());
    }
    return n;
  }

  models::ModelArgs args;
  Mode mode;
  comm::GroupPtr group;
  models::Transformer model{nullptr};
  std::unique_ptr<torch::optim::Adam> opt;
  at::Tensor tokens, targets;
  // Unsharded bytes of the largest block and of the root's own (non-block) parameters.
  int64_t largest_block_bytes = 0, root_bytes = 0;
};

// Peak bytes of `slot` during one step, and the bytes allocated before it.
template <class T>
std::pair<int64_t, int64_t> step_peak(T& t, int slot) {
  auto& mem = TrackingAllocator::install();
  const int64_t before = mem.current(slot);
  mem.reset_peak(slot);
  t.step();
  return {mem.peak(slot), before};
}

// The unsharded model's states and a plain step's activation bytes on `batch` sequences
// (measured once, on the calling thread's slot 0).
struct Reference {
  int64_t state_bytes = 0, activation_bytes = 0;
};
const Reference& reference() {
  static const Reference r = [] {
    TrackingAllocator::install();
    Trainer t(kOneRank, kGlobalBatch / kWorld, 0, nullptr);
    t.step();
    auto [peak, before] = step_peak(t, 0);
    Reference out;
    out.state_bytes = t.state_bytes();
    out.activation_bytes = peak - before;
    return out;
  }();
  return r;
}

void BM_StepOneRank(benchmark::State& state) {
  TrackingAllocator::install();
  Trainer t(kOneRank, kGlobalBatch, 0, nullptr);
  t.step();
  state.counters["state_bytes"] = static_cast<double>(t.state_bytes());
  state.counters["peak_bytes"] = static_cast<double>(step_peak(t, 0).first);
  for (auto _ : state) t.step();
}

struct Figures {
  std::mutex mu;
  int64_t collectives = 0, state_bytes = 0, peak_bytes = 0, largest_block_bytes = 0, root_bytes = 0;
};

void BM_StepThreads(benchmark::State& state) {
  const Mode mode = static_cast<Mode>(state.range(0));
  const Reference& ref = reference();
  auto world = comm::ThreadWorld::create(kWorld);
  Figures fig;
  bench::RankThreads ranks(kWorld, [&](int r) -> bench::RankThreads::Step {
    TrackingAllocator::set_slot(r + 1);
    auto t = std::make_shared<Trainer>(mode, batch_of(mode), r, std::make_shared<comm::ThreadGroup>(world, r),
                                       block_of(mode, r));
    t->step();  // warm-up: Adam state
    testing::CommCounter counting;  // the measured step's (the setup returns before the timed ones)
    const int64_t peak = step_peak(*t, r + 1).first;
    std::lock_guard<std::mutex> lk(fig.mu);
    if (r == 0) {
      fig.collectives = counting.collectives();
      fig.state_bytes = t->state_bytes();
      fig.largest_block_bytes = t->largest_block_bytes;
      fig.root_bytes = t->root_bytes;
    }
    fig.peak_bytes = std::max(fig.peak_bytes, peak);
    return [t] { t->step(); };
  });
  if (!ranks.error().empty()) {
    state.SkipWithError(ranks.error().c_str());
    return;
  }
  state.counters["collectives"] = static_cast<double>(fig.collectives);
  state.counters["state_bytes"] = static_cast<double>(fig.state_bytes);
  state.counters["state_ratio"] = static_cast<double>(fig.state_bytes) / static_cast<double>(ref.state_bytes);
  state.counters["peak_bytes"] = static_cast<double>(fig.peak_bytes);
  if (is_fsdp(mode)) {
    state.counters["peak_bound"] = static_cast<double>(fig.state_bytes + 3 * fig.largest_block_bytes +
                                                       fig.root_bytes + ref.activation_bytes);
  }
  for (auto _ : state) ranks.step();
}

// ---- large thread worlds ---------------------------------------------------------------------
// The suites' small Transformer (ModelArgs' defaults, dropout 0) fully sharded (blocks, then the
// root) over `ranks` thread ranks in this process, one sequence per rank (the global batch grows
// with the world), Adam: the time of one step of the whole world. Counters: s_per_rank (seconds: the
// step over the ranks: what one more rank costs on this machine, whose cores the threads
// share), setup_ms (the world, every rank's model and fully_shard, the warm-up step), peak_bytes
// (the largest rank's peak of allocated memory during a step: NOTE: [Per-rank memory
// accounting]).
void BM_StepThreadWorld(benchmark::State& state) {
  const int world_size = static_cast<int>(state.range(0));
  TrackingAllocator::install();
  models::ModelArgs args;
  args.dropout_p = 0.0;
  struct SmallTrainer {
    SmallTrainer(const models::ModelArgs& args, const DeviceMesh& mesh) : args(args) {
      model = models::Transformer(args);
      fsdp::FullyShardOptions opts;
      opts.mesh = mesh;
      for (size_t i = 0; i < model->layers->size(); ++i) fsdp::fully_shard(*model->layers->ptr(i), opts);
      fsdp::fully_shard(model, opts);
      opt = std::make_unique<torch::optim::Adam>(nn::parameters(*model), torch::optim::AdamOptions(1e-3));
      const int64_t r = mesh.get_local_rank();
      tokens = (at::arange(args.max_seq_len, at::kLong) * 7 + r + 1).remainder(args.vocab_size).view({1, -1});
      targets = tokens.roll(1, 1).flatten();
    }
    void step() {
      opt->zero_grad();
      at::Tensor logits = nn::call(model, tokens);
      torch::nn::functional::cross_entropy(logits.view({-1, args.vocab_size}), targets).backward();
      opt->step();
    }
    models::ModelArgs args;
    models::Transformer model{nullptr};
    std::unique_ptr<torch::optim::Adam> opt;
    at::Tensor tokens, targets;
  };
  const auto start = std::chrono::steady_clock::now();
  auto world = comm::ThreadWorld::create(world_size);
  std::mutex mu;
  int64_t peak_bytes = 0;
  bench::RankThreads ranks(world_size, [&](int r) -> bench::RankThreads::Step {
    TrackingAllocator::set_slot(r + 1);
    auto mesh = init_device_mesh("cpu", {world_size}, {}, std::make_shared<comm::ThreadGroup>(world, r));
    auto t = std::make_shared<SmallTrainer>(args, mesh);
    t->step();  // warm-up: Adam's state, the propagation cache
    const int64_t peak = step_peak(*t, r + 1).first;
    std::lock_guard<std::mutex> lk(mu);
    peak_bytes = std::max(peak_bytes, peak);
    return [t] { t->step(); };
  });
  const double setup_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!ranks.error().empty()) {
    state.SkipWithError(ranks.error().c_str());
    return;
  }
  for (auto _ : state) ranks.step();
  state.counters["setup_ms"] = setup_ms;
  state.counters["peak_bytes"] = static_cast<double>(peak_bytes);
  // Seconds per step and rank (printed with an SI prefix: 250u is 250 microseconds).
  state.counters["s_per_rank"] = benchmark::Counter(world_size, benchmark::Counter::kIsIterationInvariantRate |
                                                                    benchmark::Counter::kInvert);
}

constexpr int kProcessIters = 9;
class FsdpBenchProcess : public testing::MultiProcessTest {};

void process_body(testing::MultiRankTest& t, Mode mode) {
  Trainer trainer(mode, batch_of(mode), t.rank(), t.group_ptr(), block_of(mode, t.rank()));
  trainer.step();
  int64_t collectives = 0;
  {
    testing::CommCounter counting;  // one step's, not the timed ones'
    trainer.step();
    collectives = counting.collectives();
  }
  bench::report_median_ms(t, kProcessIters, [&] { trainer.step(); },
                          {{"collectives", static_cast<double>(collectives)},
                           {"state_bytes", static_cast<double>(trainer.state_bytes())}});
}
DTENSOR_TEST_F(FsdpBenchProcess, Step_mode1) { process_body(*this, kFsdp); }
DTENSOR_TEST_F(FsdpBenchProcess, Step_mode2) { process_body(*this, kDdp); }
DTENSOR_TEST_F(FsdpBenchProcess, Step_mode3) { process_body(*this, kFsdpTp); }
DTENSOR_TEST_F(FsdpBenchProcess, Step_mode4) { process_body(*this, kTp); }
DTENSOR_TEST_F(FsdpBenchProcess, Step_mode5) { process_body(*this, kFsdpNoPrefetch); }
DTENSOR_TEST_F(FsdpBenchProcess, Step_mode6) { process_body(*this, kFsdpPrefetch); }

void BM_StepProcesses(benchmark::State& state) {
  bench::run_in_worker_pool(state, kWorld, "FsdpBenchProcess.Step_mode" + std::to_string(state.range(0)));
}

BENCHMARK(BM_StepOneRank)->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(BM_StepThreads)->ArgName("mode")->Arg(kFsdp)->Arg(kDdp)->Arg(kFsdpTp)->Arg(kTp)->Arg(kFsdpNoPrefetch)->Arg(kFsdpPrefetch)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_StepThreadWorld)->ArgName("ranks")->RangeMultiplier(4)->Range(4, 1024)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_StepProcesses)->ArgName("mode")->Arg(kFsdp)->Arg(kDdp)->Arg(kFsdpTp)->Arg(kTp)->Arg(kFsdpNoPrefetch)->Arg(kFsdpPrefetch)->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(1);

}  // namespace
}  // namespace dtensor

int main(int argc, char** argv) { return dtensor::bench::main(argc, argv); }
