// Per-test overhead of the harness (issue: foundation, figures): one test whose body is empty
// but for one all_reduce, run as N ranks under each launch mode; the harness's own closing
// barrier is included, as in a real test. Compare with PyTorch 1.13.1's MultiProcessTestCase,
// measured here at 4.26 s per test (world size 4) and 2.12 s (world size 2).
//
//   build/benchmarks/harness_overhead_benchmark --benchmark_repetitions=5
#include "dtensor/comm/c10d_guard.h"
#include "dtensor/comm/group.h"
#include "benchmarks/process_bench.h"

#include <ATen/ATen.h>
#include <benchmark/benchmark.h>

#include <cstdlib>

namespace dtensor {
namespace {

class OverheadProcess : public testing::MultiProcessTest {};
class OverheadThreads : public testing::MultiThreadedTest {};

void body(testing::MultiRankTest& t) {
  at::Tensor x = at::ones({4});
  t.group().all_reduce(x);
  if (x[0].item<float>() != static_cast<float>(t.group().size())) std::abort();
}
DTENSOR_TEST_F(OverheadProcess, AllReduceBody) { body(*this); }
DTENSOR_TEST_F(OverheadThreads, AllReduceBody) { body(*this); }

constexpr std::chrono::milliseconds kTimeout{60000};

void check(benchmark::State& state, const std::vector<testing::internal::RankOutcome>& outs) {
  for (auto& o : outs)
    if (!o.result || o.result->failed() || o.end != testing::internal::RankOutcome::End::kFinished) {
      state.SkipWithError(("rank " + std::to_string(o.rank) + " failed: " + o.output).c_str());
      return;
    }
}

void BM_ForkServer(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  for (auto _ : state) {
    testing::internal::RankSet ranks(testing::LaunchMode::kForkServer, n, "gloo", kTimeout,
                                     "OverheadProcess.AllReduceBody");
    std::string stacks;
    check(state, ranks.run("OverheadProcess.AllReduceBody", kTimeout, &stacks));
  }
}

void BM_Spawn(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  for (auto _ : state) {
    testing::internal::RankSet ranks(testing::LaunchMode::kSpawn, n, "gloo", kTimeout,
                                     "OverheadProcess.AllReduceBody");
    std::string stacks;
    check(state, ranks.run("OverheadProcess.AllReduceBody", kTimeout, &stacks));
  }
}

void BM_WorkerPool(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  // The pool starts once per program (excluded: warm it before timing).
  std::string stacks;
  testing::internal::worker_pool(n, "gloo", kTimeout).run("OverheadProcess.AllReduceBody", kTimeout, &stacks);
  for (auto _ : state) {
    check(state, testing::internal::worker_pool(n, "gloo", kTimeout)
                     .run("OverheadProcess.AllReduceBody", kTimeout, &stacks));
  }
  testing::internal::discard_worker_pool();
}

// The call check (NOTE: [Call check]): 100 all_reduces of 4 floats on 4 Gloo ranks, with the
// check on and off (the check's own small all_gather before each call), in a worker pool.
void many_all_reduces(testing::MultiRankTest& t, bool checked) {
  comm::set_check_collectives_default(checked);
  at::Tensor x = at::ones({4});
  for (int i = 0; i < 100; ++i) t.group().all_reduce(x);
}
DTENSOR_TEST_F(OverheadProcess, CheckedAllReduces) { many_all_reduces(*this, true); }
DTENSOR_TEST_F(OverheadProcess, UncheckedAllReduces) { many_all_reduces(*this, false); }

void BM_AllReduceCallCheck(benchmark::State& state) {
  const bool checked = state.range(0) != 0;
  const char* test = checked ? "OverheadProcess.CheckedAllReduces" : "OverheadProcess.UncheckedAllReduces";
  std::string stacks;
  testing::internal::worker_pool(4, "gloo", kTimeout).run(test, kTimeout, &stacks);
  for (auto _ : state) check(state, testing::internal::worker_pool(4, "gloo", kTimeout).run(test, kTimeout, &stacks));
  testing::internal::discard_worker_pool();
  state.SetLabel(checked ? "check on, 100 all_reduces" : "check off, 100 all_reduces");
}

class ThreadRunner : public OverheadThreads {
 public:
  void run() { RunRanks("OverheadThreads.AllReduceBody"); }
  void TestBody() override {}
  int world_size() const override { return n; }
  int n = 4;
};

void BM_Threads(benchmark::State& state) {
  ThreadRunner runner;
  runner.n = static_cast<int>(state.range(0));
  for (auto _ : state) runner.run();
}

BENCHMARK(BM_ForkServer)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_Spawn)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK(BM_WorkerPool)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_AllReduceCallCheck)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_Threads)->Arg(2)->Arg(4)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1.0);

}  // namespace
}  // namespace dtensor

int main(int argc, char** argv) { return dtensor::bench::main(argc, argv); }
