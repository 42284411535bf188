// ShardedTensor and module-sync figures, 4 ranks as gloo processes (the harness's
// worker pool), rank 0 reporting the median of kProcessIters timed iterations per repetition:
//  1. shard_tensor of a 64 MiB float tensor (ChunkShardingSpec on dim 0) versus the raw
//     scatter of the same bytes, and ShardedTensor::gather to rank 0 versus the raw gather and
//     all_gather of the same bytes. Every side allocates its outputs afresh each iteration, as
//     shard_tensor and gather do (fresh 64 MiB buffers cost page faults on this VM: both sides
//     pay them alike).
//  2. sync_module_states of a ~100 MB module (100 Linear(512, 512)) with bucketed broadcasts
//     (default 250 MiB buckets, and 25 MiB), versus one broadcast per tensor.
//
//   build/benchmarks/sharded_benchmark --benchmark_repetitions=5 --benchmark_report_aggregates_only
#include "benchmarks/process_bench.h"
#include "dtensor/comm/comm.h"
#include "dtensor/sharded/sharded.h"
#include "dtensor/utils/module_states.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>


namespace dtensor {
namespace {

constexpr int kWorld = 4;
constexpr int kProcessIters = 7;
constexpr int64_t kTensorBytes = int64_t{64} << 20;
constexpr int64_t kCols = 1024;
constexpr int64_t kRows = kTensorBytes / sizeof(float) / kCols;

enum Case {
  kShardTensor,
  kRawScatter,
  kShardedGather,
  kRawGather,
  kRawAllGather,
  kSyncBucketed,
  kSyncBucketed25MiB,
  kSyncPerTensor,
  kNumCases
};
const char* case_name(int c) {
  static const char* names[] = {"ShardTensor", "RawScatter",   "ShardedGather",     "RawGather",
                                "RawAllGather", "SyncBucketed", "SyncBucketed25MiB", "SyncPerTensor"};
  return names[c];
}

sharded::ChunkShardingSpec row_spec() {
  std::vector<sharded::RemoteDevice> placements;
  for (int r = 0; r < kWorld; ++r) placements.emplace_back("rank:" + std::to_string(r) + "/cpu");
  return sharded::ChunkShardingSpec(0, placements);
}

// ~100 MB of parameters in 200 tensors.
struct Stack : torch::nn::Module {
  torch::nn::ModuleList layers{nullptr};
  Stack() {
    layers = register_module("layers", torch::nn::ModuleList());
    for (int i = 0; i < 100; ++i) layers->push_back(torch::nn::Linear(512, 512));
  }
};

// One iteration of `c` on this rank.
class Runner {
 public:
  Runner(Case c, testing::MultiRankTest& t) : c_(c), g_(t.group()) {
    if (c_ <= kRawAllGather) full_ = at::full({kRows, kCols}, static_cast<float>(g_.rank()));
    if (c_ == kShardedGather) st_.emplace(sharded::shard_tensor(full_, row_spec()));
    if (c_ == kRawGather || c_ == kRawAllGather) local_ = full_.narrow(0, 0, kRows / kWorld).clone();
    if (c_ >= kSyncBucketed) {
      stack_ = std::make_shared<Stack>();
      for (const auto& p : stack_->parameters()) states_.push_back(p.detach());
    }
  }

  void run() {
    switch (c_) {
      case kShardTensor: benchmark::DoNotOptimize(sharded::shard_tensor(full_, row_spec()).local_tensor()); break;
      case kRawScatter: {
        std::vector<at::Tensor> pieces;
        if (g_.rank() == 0) pieces = full_.chunk(kWorld, 0);
        at::Tensor out = at::empty({kRows / kWorld, kCols});
        g_.scatter(out, pieces, 0);
        break;
      }
      case kShardedGather: benchmark::DoNotOptimize(st_->gather(0)); break;
      case kRawGather: {
        std::vector<at::Tensor> outs;
        g_.gather(local_, outs, 0);
        break;
      }
      case kRawAllGather: {
        at::Tensor out = at::empty({kRows, kCols});
        g_.all_gather_into(out, local_);
        break;
      }
      case kSyncBucketed: utils::sync_module_states(*stack_, g_); break;
      case kSyncBucketed25MiB: {
        utils::SyncModuleStatesOptions o;
        o.broadcast_bucket_size = int64_t{25} << 20;
        utils::sync_module_states(*stack_, g_, o);
        break;
      }
      case kSyncPerTensor:
        for (at::Tensor& s : states_) g_.broadcast(s, 0);
        break;
      case kNumCases: break;
    }
  }

 private:
  Case c_;
  comm::Group& g_;
  at::Tensor full_, local_;
  std::optional<sharded::ShardedTensor> st_;
  std::shared_ptr<Stack> stack_;
  std::vector<at::Tensor> states_;
};

class ShardedBench : public testing::MultiProcessTest {};
void process_body(testing::MultiRankTest& t, Case c) {
  Runner runner(c, t);
  bench::report_median_ms(t, kProcessIters, [&] { runner.run(); });
}
#define BENCH_BODY(c) \
  DTENSOR_TEST_F(ShardedBench, c) { process_body(*this, c); }
BENCH_BODY(kShardTensor)
BENCH_BODY(kRawScatter)
BENCH_BODY(kShardedGather)
BENCH_BODY(kRawGather)
BENCH_BODY(kRawAllGather)
BENCH_BODY(kSyncBucketed)
BENCH_BODY(kSyncBucketed25MiB)
BENCH_BODY(kSyncPerTensor)

void BM_Processes(benchmark::State& state) {
  const int c = static_cast<int>(state.range(0));
  bench::run_in_worker_pool(state, kWorld, std::string("ShardedBench.k") + case_name(c));
  state.SetLabel(case_name(c));
}
BENCHMARK(BM_Processes)->DenseRange(0, kNumCases - 1)->ArgName("case")->Unit(benchmark::kMillisecond)
    ->UseManualTime()->Iterations(1);

}  // namespace
}  // namespace dtensor

int main(int argc, char** argv) { return dtensor::bench::main(argc, argv); }
