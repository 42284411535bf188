// Tensor-parallel figures (issue: tensor parallel and the reference models):
//  1. one training step (forward, cross-entropy loss, backward, SGD step) of the Transformer on
//     one rank versus tensor-parallel on 4 ranks, with and without sequence parallelism (`sp`
//     0: none, 1: sequence parallel, 2: sequence parallel with async_tp, the sequence
//     collectives fused with the matmuls: NOTE: [Pipelined collective matmul]), ranks as threads
//     (ThreadGroup) and as processes (Gloo, the harness's worker pool);
//  2. per rank: parameter bytes and the peak of allocated CPU memory during a step (a tracking
//     allocator attributes every allocation to the rank that made it), TP versus the full model;
//  3. collectives per step, counted (CommDebugMode) and derived from PyTorch's plan
//     (NOTE: [Collectives of the Transformer plan] in suites/testing/tp_collectives.h; not for
//     async_tp, whose fused layers issue one broadcast or gather per rank's block instead).
//  4. loss parallel (NOTE: [Loss parallel]): cross-entropy and its backward on logits sharded on
//     the class dim (vocabulary 32k, 256 rows, 4 thread ranks), inside loss_parallel() versus
//     through the sharding rules (which gather the logits): time and each rank's peak bytes.
//  5. context parallel (NOTE: [Ring attention]): causal attention forward + backward on a
//     sequence of 4096 sharded over 4 thread ranks (head-tail layout; batch 1, 4 heads of 32),
//     ring attention versus all-gathering K and V (and reduce-scattering their gradients) and
//     running libtorch's attention with the causal mask of the tokens' global positions: time,
//     each rank's peak bytes and the collectives;
//  6. the 3-D layout of torchtitan on 8 thread ranks: the wide Transformer's training step (the
//     single-rank step's batch, 8 x 64 tokens) with FSDP over the flattened (dp, cp) dims,
//     tensor parallel on tp and context parallel on cp, a 2x2x2 (dp, cp, tp) mesh; compare
//     with BM_StepSingleRank/wide:1.
// `wide` 0 is the default ModelArgs; 1 a wider model (dim 256, 8 heads, vocab 1024, seq 64)
// where the sharded layers dominate. dropout_p is 0 (dropout on sharded activations is the
// random-ops issue's).
//
//   build/benchmarks/tp_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include "benchmarks/process_bench.h"
#include "dtensor/comm/comm.h"
#include "dtensor/compat.h"
#include "dtensor/experimental/experimental.h"
#include "dtensor/fsdp/fully_shard.h"
#include "dtensor/nn/nn.h"
#include "dtensor/parallel/parallel.h"
#include "dtensor/tensor/dtensor.h"
#include "models/models.h"
#include "suites/testing/comm_counter.h"
#include "suites/testing/tp_collectives.h"
#include "dtensor/debug/tracking_allocator_internal.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/functional/loss.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <functional>
#include <mutex>

namespace dtensor {
namespace {

constexpr int kWorld = 4;
constexpr int64_t kBatch = 8;

using debug::detail::TrackingAllocator;  // NOTE: [Per-rank memory accounting]

// ---- one rank's training step -------------------------------------------------------------------

models::ModelArgs bench_args(bool wide) {
  models::ModelArgs a;
  a.dropout_p = 0.0;
  if (wide) {
    a.dim = 256;
    a.n_heads = 8;
    a.vocab_size = 1024;
    a.max_seq_len = 64;
  }
  return a;
}

int64_t local_bytes(const at::Tensor& t) {
  const at::Tensor& l = is_dtensor(t) ? local_tensor(t) : t;
  return l.numel() * static_cast<int64_t>(l.element_size());
}

// A model (parallelized on `mesh` when given), its SGD optimizer and a batch.
struct Trainer {
  // sp: 0 tensor parallel, 1 sequence parallel, 2 sequence parallel with async_tp.
  Trainer(bool wide, const std::optional<DeviceMesh>& mesh, int sp) : args(bench_args(wide)) {
    model = models::Transformer(args);
    if (mesh) models::Transformer::parallelize(model, *mesh, sp != 0, false, sp == 2);
    opt = std::make_unique<torch::optim::SGD>(nn::parameters(*model), torch::optim::SGDOptions(0.01).momentum(0.9));
    const int64_t seq = args.max_seq_len;
    tokens = (at::arange(kBatch * seq, at::kLong) * 7 + 1).remainder(args.vocab_size).view({kBatch, seq});
    targets = tokens.roll(1, 1).flatten();
  }
  void step() {
    opt->zero_grad();
    at::Tensor logits = nn::call(model, tokens);
    torch::nn::functional::cross_entropy(logits.view({-1, args.vocab_size}), targets).backward();
    opt->step();
  }
  int64_t parameter_bytes() const {
    int64_t n = 0;
    for (const auto& p : nn::parameters(*model)) n += local_bytes(p);
    return n;
  }

  models::ModelArgs args;
  models::Transformer model{nullptr};
  std::unique_ptr<torch::optim::SGD> opt;
  at::Tensor tokens, targets;
};

// Peak bytes of `slot` during one step (after a warm-up step created the optimizer state).
int64_t step_peak(Trainer& t, int slot) {
  auto& mem = TrackingAllocator::install();
  t.step();
  mem.reset_peak(slot);
  t.step();
  return mem.peak(slot);
}

void BM_StepSingleRank(benchmark::State& state) {
  TrackingAllocator::install();
  Trainer t(state.range(0) != 0, std::nullopt, 0);
  state.counters["param_bytes"] = static_cast<double>(t.parameter_bytes());
  state.counters["peak_bytes"] = static_cast<double>(step_peak(t, 0));
  for (auto _ : state) t.step();
}

// ---- ranks as threads --------------------------------------------------------------------------

// Ranks as threads (bench::RankThreads): each builds its Trainer once and measures collectives
// and memory before the timed loop.
struct ThreadFigures {
  std::mutex mu;
  int64_t collectives = 0, param_bytes = 0, peak_bytes = 0;
};

void BM_StepThreads(benchmark::State& state) {
  const int sp = static_cast<int>(state.range(0));
  const bool wide = state.range(1) != 0;
  TrackingAllocator::install();
  auto world = comm::ThreadWorld::create(kWorld);
  ThreadFigures fig;
  bench::RankThreads ranks(kWorld, [&](int r) -> bench::RankThreads::Step {
    TrackingAllocator::set_slot(r + 1);
    auto t = std::make_shared<Trainer>(
        wide, init_device_mesh("cpu", {kWorld}, {}, std::make_shared<comm::ThreadGroup>(world, r)), sp);
    t->step();  // warm-up: optimizer state, propagation cache
    int64_t collectives = 0;
    {
      testing::CommCounter counting;  // one step's
      t->step();
      collectives = counting.collectives();
    }
    const int64_t peak = step_peak(*t, r + 1);
    std::lock_guard<std::mutex> lk(fig.mu);
    if (r == 0) {
      fig.collectives = collectives;
      fig.param_bytes = t->parameter_bytes();
    }
    fig.peak_bytes = std::max(fig.peak_bytes, peak);
    return [t] { t->step(); };
  });
  if (!ranks.error().empty()) {
    state.SkipWithError(ranks.error().c_str());
    return;
  }
  state.counters["collectives"] = static_cast<double>(fig.collectives);
  if (sp != 2)
    state.counters["collectives_plan"] =
        static_cast<double>(testing::transformer_plan_collectives(bench_args(wide).n_layers, sp != 0).total());
  state.counters["param_bytes"] = static_cast<double>(fig.param_bytes);
  state.counters["peak_bytes"] = static_cast<double>(fig.peak_bytes);
  for (auto _ : state) ranks.step();
}

// ---- ranks as processes ------------------------------------------------------------------------

constexpr int kProcessIters = 9;
class TpBenchProcess : public testing::MultiProcessTest {};

// Rank 0 reports the median step time (steps between barriers), its collectives per step, and
// its parameter and peak bytes.
void process_body(testing::MultiRankTest& t, int sp, bool wide) {
  TrackingAllocator::install();
  Trainer trainer(wide, init_device_mesh("cpu", {t.group().size()}, {}, t.group_ptr()), sp);
  trainer.step();
  int64_t collectives = 0;
  {
    testing::CommCounter counting;  // one step's, not the timed ones'
    trainer.step();
    collectives = counting.collectives();
  }
  const int64_t peak = step_peak(trainer, 0);
  std::vector<std::pair<std::string, double>> counters{
      {"collectives", static_cast<double>(collectives)},
      {"param_bytes", static_cast<double>(trainer.parameter_bytes())},
      {"peak_bytes", static_cast<double>(peak)}};
  if (sp != 2)
    counters.emplace_back("collectives_plan", static_cast<double>(testing::transformer_plan_collectives(
                                                  bench_args(wide).n_layers, sp != 0).total()));
  bench::report_median_ms(t, kProcessIters, [&] { trainer.step(); }, counters);
}
DTENSOR_TEST_F(TpBenchProcess, Step_sp0_wide0) { process_body(*this, 0, false); }
DTENSOR_TEST_F(TpBenchProcess, Step_sp1_wide0) { process_body(*this, 1, false); }
DTENSOR_TEST_F(TpBenchProcess, Step_sp2_wide0) { process_body(*this, 2, false); }
DTENSOR_TEST_F(TpBenchProcess, Step_sp0_wide1) { process_body(*this, 0, true); }
DTENSOR_TEST_F(TpBenchProcess, Step_sp1_wide1) { process_body(*this, 1, true); }
DTENSOR_TEST_F(TpBenchProcess, Step_sp2_wide1) { process_body(*this, 2, true); }

void BM_StepProcesses(benchmark::State& state) {
  const int64_t sp = state.range(0), wide = state.range(1);
  bench::run_in_worker_pool(state, kWorld,
                            "TpBenchProcess.Step_sp" + std::to_string(sp) + "_wide" + std::to_string(wide));
}

void tp_args(benchmark::internal::Benchmark* b) {
  for (int wide : {0, 1})
    for (int sp : {0, 1, 2}) b->Args({sp, wide});
  b->ArgNames({"sp", "wide"})->Unit(benchmark::kMillisecond);
}
// ---- loss parallel ---------------------------------------------------------------------------

constexpr int64_t kLossRows = 256, kVocab = 32000;

// One rank's cross-entropy step on its Shard(1) piece of the logits.
struct LossStep {
  LossStep(const DeviceMesh& mesh, bool parallel) : parallel(parallel) {
    const int64_t cols = kVocab / mesh.size();
    const int64_t r = mesh.get_local_rank();
    at::Tensor local = (at::arange(kLossRows * cols, at::kFloat).view({kLossRows, cols}) * 0.37 + r).sin();
    logits = from_local(local, mesh, {Shard{1}}).detach().requires_grad_(true);
    target = (at::arange(kLossRows, at::kLong) * 7919).remainder(kVocab);
    target_dt = distribute_tensor(target, mesh, {Replicate{}});
  }
  void step() {
    logits.mutable_grad() = at::Tensor();
    if (parallel) {
      auto guard = loss_parallel();
      torch::nn::functional::cross_entropy(logits, target).backward();
    } else {
      torch::nn::functional::cross_entropy(logits, target_dt).backward();
    }
  }
  bool parallel;
  at::Tensor logits, target, target_dt;
};

// Runs one rank's step (made by `make` on a 1-D mesh of kWorld thread ranks): a warm-up step,
// then one step measured (rank 0's collectives; the largest per-rank peak above what the rank
// held before), then the timed loop. A rank that fails skips the benchmark with its error.
template <class Step>
void run_thread_steps(benchmark::State& state, const std::function<std::shared_ptr<Step>(const DeviceMesh&)>& make) {
  TrackingAllocator::install();
  auto world = comm::ThreadWorld::create(kWorld);
  ThreadFigures fig;
  bench::RankThreads ranks(kWorld, [&](int r) -> bench::RankThreads::Step {
    TrackingAllocator::set_slot(r + 1);
    std::shared_ptr<Step> t =
        make(init_device_mesh("cpu", {kWorld}, {}, std::make_shared<comm::ThreadGroup>(world, r)));
    t->step();  // warm-up: the propagation cache
    testing::CommCounter counting;  // the measured step's (the setup returns before the timed ones)
    auto& mem = TrackingAllocator::install();
    mem.reset_peak(r + 1);
    const int64_t before = mem.current(r + 1);
    t->step();
    const int64_t peak = mem.peak(r + 1) - before;
    std::lock_guard<std::mutex> lk(fig.mu);
    if (r == 0) fig.collectives = counting.collectives();
    fig.peak_bytes = std::max(fig.peak_bytes, peak);
    return [t] { t->step(); };
  });
  if (!ranks.error().empty()) {
    state.SkipWithError(ranks.error().c_str());
    return;
  }
  state.counters["collectives"] = static_cast<double>(fig.collectives);
  state.counters["step_peak_bytes"] = static_cast<double>(fig.peak_bytes);
  for (auto _ : state) ranks.step();
}

// mode 0: loss_parallel(); 1: the sharding rules (the logits gathered).
void BM_LossParallelThreads(benchmark::State& state) {
  const bool parallel = state.range(0) == 0;
  state.counters["logits_bytes"] = static_cast<double>(kLossRows * kVocab * 4);
  run_thread_steps<LossStep>(state, [parallel](const DeviceMesh& mesh) { return std::make_shared<LossStep>(mesh, parallel); });
}

// ---- context parallel ------------------------------------------------------------------------

constexpr int64_t kCpSeq = 4096, kCpHeads = 4, kCpHeadDim = 32;

// One rank's causal attention step on its head-tail part of the sequence.
struct RingStep {
  RingStep(const DeviceMesh& mesh, bool ring) : mesh(mesh), ring(ring) {
    const int64_t r = mesh.get_local_rank(), local = kCpSeq / mesh.size();
    auto make = [&](double salt) {
      return (at::arange(kCpHeads * local * kCpHeadDim, at::kFloat).view({1, kCpHeads, local, kCpHeadDim}) * 0.37 +
              salt + r)
          .sin()
          .requires_grad_(true);
    };
    q = make(0.1), k = make(1.3), v = make(2.7);
    dout = make(4.2).detach();
    const experimental::HeadTailLoadBalancer lb(kCpSeq, mesh.size());
    // The gathered keys are in rank order: key j is token generate_indices()[j].
    mask = lb.positions(r).unsqueeze(1) >= lb.generate_indices().unsqueeze(0);
  }
  void step() {
    for (auto* t : {&q, &k, &v}) t->mutable_grad() = at::Tensor();
    at::Tensor out;
    if (ring) {
      experimental::RingAttentionOptions o;
      o.is_causal = true;
      out = experimental::ring_attention(q, k, v, mesh.get_group(), o);
    } else {
      // All-gather K and V along the sequence; their gradients come back reduce-scattered.
      auto gather = [&](const at::Tensor& t) {
        return to_local(redistribute(from_local(t, mesh, {Shard{2}}), mesh, {Replicate{}}),
                        std::vector<Placement>{Partial{}});
      };
      out = compat::scaled_dot_product_attention(q, gather(k), gather(v), mask, 0.0, false);
    }
    out.backward(dout);
  }
  DeviceMesh mesh;
  bool ring;
  at::Tensor q, k, v, dout, mask;
};

// mode 0: ring attention; 1: K and V all-gathered.
void BM_RingAttentionThreads(benchmark::State& state) {
  const bool ring = state.range(0) == 0;
  run_thread_steps<RingStep>(state, [ring](const DeviceMesh& mesh) { return std::make_shared<RingStep>(mesh, ring); });
}

// ---- FSDP x TP x CP ------------------------------------------------------------------------------

// One rank's share of the wide Transformer's step on a (dp, cp, tp) mesh: rows of its dp rank,
// tokens of its cp rank (inside context_parallel), heads of its tp rank, FSDP over (dp, cp).
struct ThreeDTrainer {
  explicit ThreeDTrainer(const DeviceMesh& mesh) : args(bench_args(true)), mesh(mesh) {
    model = models::Transformer(args);
    models::Transformer::parallelize(model, mesh["tp"], models::Transformer::ParallelOptions{});
    fsdp::FullyShardOptions fo;
    fo.mesh = mesh[{"dp", "cp"}]._flatten("dp_cp");
    for (size_t i = 0; i < model->layers->size(); ++i) fsdp::fully_shard(*model->layers->ptr(i), fo);
    fsdp::fully_shard(model, fo);
    opt = std::make_unique<torch::optim::SGD>(nn::parameters(*model), torch::optim::SGDOptions(0.01).momentum(0.9));
    const int64_t seq = args.max_seq_len, rows = kBatch / mesh.size(0), d = mesh.get_local_rank("dp");
    const at::Tensor all = (at::arange(kBatch * seq, at::kLong) * 7 + 1).remainder(args.vocab_size).view({kBatch, seq});
    tokens = all.narrow(0, d * rows, rows).clone();
    targets = tokens.roll(1, 1);
  }
  void step() {
    opt->zero_grad();
    at::Tensor t = tokens.clone(), y = targets.clone(), pos = at::arange(args.max_seq_len, at::kLong);
    {
      auto cp = experimental::context_parallel(mesh["cp"], {t, y, pos}, {1, 1, 0});
      at::Tensor logits = nn::call(model, t, pos);
      torch::nn::functional::cross_entropy(logits.reshape({-1, args.vocab_size}), y.flatten()).backward();
    }
    opt->step();
  }

  models::ModelArgs args;
  DeviceMesh mesh;
  models::Transformer model{nullptr};
  std::unique_ptr<torch::optim::SGD> opt;
  at::Tensor tokens, targets;
};

void BM_FsdpTpCpStepThreads(benchmark::State& state) {
  constexpr int kRanks = 8;
  TrackingAllocator::install();
  auto world = comm::ThreadWorld::create(kRanks);
  ThreadFigures fig;
  bench::RankThreads ranks(kRanks, [&](int r) -> bench::RankThreads::Step {
    TrackingAllocator::set_slot(r + 1);
    auto t = std::make_shared<ThreeDTrainer>(
        init_device_mesh("cpu", {2, 2, 2}, {"dp", "cp", "tp"}, std::make_shared<comm::ThreadGroup>(world, r)));
    t->step();  // warm-up: the optimizer state, the propagation cache
    testing::CommCounter counting;  // the measured step's (the setup returns before the timed ones)
    auto& mem = TrackingAllocator::install();
    mem.reset_peak(r + 1);
    t->step();
    std::lock_guard<std::mutex> lk(fig.mu);
    if (r == 0) fig.collectives = counting.collectives();
    fig.peak_bytes = std::max(fig.peak_bytes, mem.peak(r + 1));
    int64_t bytes = 0;
    for (const auto& p : nn::parameters(*t->model)) bytes += local_bytes(p);
    fig.param_bytes = std::max(fig.param_bytes, bytes);
    return [t] { t->step(); };
  });
  if (!ranks.error().empty()) {
    state.SkipWithError(ranks.error().c_str());
    return;
  }
  state.counters["collectives"] = static_cast<double>(fig.collectives);
  state.counters["param_bytes"] = static_cast<double>(fig.param_bytes);
  state.counters["peak_bytes"] = static_cast<double>(fig.peak_bytes);
  for (auto _ : state) ranks.step();
}

BENCHMARK(BM_LossParallelThreads)->ArgName("gather")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(BM_RingAttentionThreads)->ArgName("gather")->Arg(0)->Arg(1)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(BM_FsdpTpCpStepThreads)->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(BM_StepSingleRank)->ArgName("wide")->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->MinTime(0.5);
BENCHMARK(BM_StepThreads)->Apply(tp_args)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_StepProcesses)->Apply(tp_args)->UseManualTime()->Iterations(1);

}  // namespace
}  // namespace dtensor

int main(int argc, char** argv) { return dtensor::bench::main(argc, argv); }
