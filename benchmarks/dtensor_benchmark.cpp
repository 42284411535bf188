// DTensor core figures (issue: DTensor core):
//  1. fallback dispatch overhead per op with a cached strategy, versus the same op on the
//     local tensor (BM_DispatchAdd/BM_LocalAdd, BM_DispatchMm/BM_LocalMm);
//  2. redistribute versus the raw collective on the same bytes (Shard->Replicate is an
//     all_gather, Partial->Replicate an all_reduce), 1 MiB and 64 MiB, world size 4, with
//     ranks as threads (ThreadGroup) and as processes (Gloo, forked by the harness).
//
//   build/benchmarks/dtensor_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only
//
// On a GPU machine (ci/nightly-gpu): DTENSOR_BENCH_DEVICE=cuda puts the dispatch cases'
// tensors and mesh on the GPU; DTENSOR_BACKEND (nccl, or cpu:gloo,cuda:gloo on one GPU) and
// DTENSOR_WORLD_SIZE choose the process cases' backend and ranks, whose meshes are then on
// "cuda". Thread ranks stay on the CPU (ThreadGroup moves host memory).
#include "benchmarks/process_bench.h"
#include "dtensor/comm/comm.h"
#include "dtensor/tensor/dtensor.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <string>


namespace dtensor {
namespace {

int world_from_env() {
  const char* v = std::getenv("DTENSOR_WORLD_SIZE");
  return v && *v ? std::max(1, std::atoi(v)) : 4;
}
const int kWorld = world_from_env();
const std::string kDispatchDevice = [] {
  const char* v = std::getenv("DTENSOR_BENCH_DEVICE");
  return std::string(v && *v ? v : "cpu");
}();

at::Tensor ones16() { return at::ones({16, 16}, at::TensorOptions().device(kDispatchDevice)); }

// ---- 1. dispatch overhead -------------------------------------------------------------------
// A 4-rank mesh built by 4 threads; rank 0's mesh is kept for single-thread op loops (the ops
// measured need no communication, so the other ranks have nothing to do).
DeviceMesh rank0_mesh() {
  static std::optional<DeviceMesh> mesh;
  if (!mesh) {
    auto world = comm::ThreadWorld::create(kWorld);
    std::vector<std::thread> ts;
    std::mutex mu;
    for (int r = 0; r < kWorld; ++r)
      ts.emplace_back([&, r] {
        auto g = std::make_shared<comm::ThreadGroup>(world, r);
        auto m = init_device_mesh(kDispatchDevice, {kWorld}, {}, g);
        std::lock_guard<std::mutex> lk(mu);
        if (r == 0) mesh = m;
      });
    for (auto& t : ts) t.join();
  }
  return *mesh;
}

void BM_DispatchAdd(benchmark::State& state) {
  auto mesh = rank0_mesh();
  at::Tensor a = from_local(ones16(), mesh, {Shard{0}});
  at::Tensor b = from_local(ones16(), mesh, {Shard{0}});
  for (auto _ : state) benchmark::DoNotOptimize(at::add(a, b));
}
void BM_LocalAdd(benchmark::State& state) {
  at::Tensor a = ones16(), b = ones16();
  for (auto _ : state) benchmark::DoNotOptimize(at::add(a, b));
}
void BM_DispatchMm(benchmark::State& state) {
  auto mesh = rank0_mesh();
  at::Tensor a = from_local(ones16(), mesh, {Shard{0}});
  at::Tensor b = from_local(ones16(), mesh, {Replicate{}});
  for (auto _ : state) benchmark::DoNotOptimize(at::mm(a, b));
}
void BM_LocalMm(benchmark::State& state) {
  at::Tensor a = ones16(), b = ones16();
  for (auto _ : state) benchmark::DoNotOptimize(at::mm(a, b));
}
void BM_DispatchDetach(benchmark::State& state) {
  auto mesh = rank0_mesh();
  at::Tensor a = from_local(ones16(), mesh, {Shard{0}});
  for (auto _ : state) benchmark::DoNotOptimize(a.detach());
}
BENCHMARK(BM_DispatchAdd);
BENCHMARK(BM_LocalAdd);
BENCHMARK(BM_DispatchMm);
BENCHMARK(BM_LocalMm);
BENCHMARK(BM_DispatchDetach);

// ---- 2. redistribute versus the raw collective ---------------------------------------------------
// One iteration of case `c` on this rank. Shapes: the global tensor has `bytes` bytes of float.
enum Case { kRawAllGather, kShardToReplicate, kRawAllReduce, kPartialToReplicate };

struct Inputs {
  at::Tensor shard, partial_local;
  at::Tensor dshard, dpartial;
};

Inputs make_inputs(const DeviceMesh& mesh, int64_t bytes) {
  const int64_t rows = bytes / sizeof(float) / 256;
  Inputs in;
  const auto on_mesh = at::TensorOptions().device(mesh.device_type());
  in.shard = at::ones({rows / mesh.size(), 256}, on_mesh);
  in.partial_local = at::ones({rows, 256}, on_mesh);
  in.dshard = from_local(in.shard, mesh, {Shard{0}});
  in.dpartial = from_local(in.partial_local, mesh, {Partial{}});
  return in;
}

void run_case(Case c, comm::Group& g, const Inputs& in) {
  switch (c) {
    case kRawAllGather: {
      at::Tensor out = at::empty({in.shard.size(0) * g.size(), 256}, in.shard.options());
      g.all_gather_into(out, in.shard);
      break;
    }
    case kShardToReplicate: benchmark::DoNotOptimize(redistribute(in.dshard, {Replicate{}})); break;
    case kRawAllReduce: {
      at::Tensor t = in.partial_local.clone();
      g.all_reduce(t);
      break;
    }
    case kPartialToReplicate: benchmark::DoNotOptimize(redistribute(in.dpartial, {Replicate{}})); break;
  }
}

// Ranks as threads: 4 persistent workers; each iteration runs the case once on all of them.
void BM_Threads(benchmark::State& state) {
  const auto c = static_cast<Case>(state.range(0));
  const int64_t bytes = state.range(1);
  auto world = comm::ThreadWorld::create(kWorld);
  bench::RankThreads ranks(kWorld, [&](int r) -> bench::RankThreads::Step {
    auto g = std::make_shared<comm::ThreadGroup>(world, r);
    auto in = std::make_shared<Inputs>(make_inputs(init_device_mesh("cpu", {kWorld}, {}, g), bytes));
    return [c, g, in] { run_case(c, *g, *in); };
  });
  ranks.step();  // warm-up (first-use allocations, propagation cache)
  for (auto _ : state) ranks.step();
  state.SetBytesProcessed(state.iterations() * state.range(1));
}

// Ranks as processes: the harness's worker pool runs one registered body per case; rank 0
// prints the median of its per-iteration times, read back from its captured output.
constexpr int kProcessIters = 7;
class BenchProcess : public testing::MultiProcessTest {};
void process_body(testing::MultiRankTest& t, Case c, int64_t bytes) {
  auto mesh = init_device_mesh(t.device_type(), {t.ranks()});
  Inputs in = make_inputs(mesh, bytes);
  bench::report_median_ms(t, kProcessIters, [&] { run_case(c, t.group(), in); });
}
#define BENCH_BODY(c, mib) \
  DTENSOR_TEST_F(BenchProcess, c##_##mib) { process_body(*this, c, int64_t{mib} << 20); }
BENCH_BODY(kRawAllGather, 1)
BENCH_BODY(kShardToReplicate, 1)
BENCH_BODY(kRawAllReduce, 1)
BENCH_BODY(kPartialToReplicate, 1)
BENCH_BODY(kRawAllGather, 64)
BENCH_BODY(kShardToReplicate, 64)
BENCH_BODY(kRawAllReduce, 64)
BENCH_BODY(kPartialToReplicate, 64)

const char* case_name(int c) {
  static const char* names[] = {"kRawAllGather", "kShardToReplicate", "kRawAllReduce", "kPartialToReplicate"};
  return names[c];
}

void BM_Processes(benchmark::State& state) {
  const std::string id = std::string("BenchProcess.") + case_name(static_cast<int>(state.range(0))) + "_" +
                         std::to_string(state.range(1) >> 20);
  bench::run_in_worker_pool(state, kWorld, id);
  state.SetBytesProcessed(state.iterations() * state.range(1));
}

void args(benchmark::internal::Benchmark* b) {
  for (int64_t bytes : {int64_t{1} << 20, int64_t{64} << 20})
    for (int c = 0; c < 4; ++c) b->Args({c, bytes});
  b->ArgNames({"case", "bytes"})->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_Threads)->Apply(args)->UseRealTime()->MinTime(0.5);
BENCHMARK(BM_Processes)->Apply(args)->UseManualTime()->Iterations(1);

}  // namespace
}  // namespace dtensor

int main(int argc, char** argv) { return dtensor::bench::main(argc, argv); }
