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

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

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

// A whole gtest program of N tests, as ctest or a user runs it: this binary re-executed as a
// gtest program (DTENSOR_BENCH_AS_GTEST=1) running OverheadProcess.AllReduceBody N times
// (--gtest_repeat, fresh ranks per test in fork mode, the same ranks in pool mode), timed from
// exec to exit. Reported: the program's wall time, and per_test_ms = (T(N) - T(1)) / (N - 1),
// which leaves out what a program pays once (loading libtorch, the fork server, the pool).
double run_program_ms(const std::string& mode, int tests) {
  char exe[4096];
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (len <= 0) return -1;
  exe[len] = 0;
  const std::string cmd = "DTENSOR_BENCH_AS_GTEST=1 DTENSOR_LAUNCH_MODE=" + mode + " '" + exe +
                          "' --gtest_filter=OverheadProcess.AllReduceBody --gtest_repeat=" +
                          std::to_string(tests) + " >/dev/null 2>&1";
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = std::system(cmd.c_str());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return rc == 0 ? ms : -1;
}

void BM_Program(benchmark::State& state) {
  const int tests = static_cast<int>(state.range(0));
  const std::string mode = state.range(1) == 0 ? "fork" : "pool";
  double per_test = 0, total = 0;
  int iters = 0;
  for (auto _ : state) {
    const double one = run_program_ms(mode, 1);
    const double all = run_program_ms(mode, tests);
    if (one < 0 || all < 0) {
      state.SkipWithError("the program failed");
      return;
    }
    state.SetIterationTime(all / 1000.0);
    per_test += (all - one) / (tests - 1);
    total += all;
    ++iters;
  }
  state.counters["per_test_ms"] = per_test / iters;
  state.counters["program_ms"] = total / iters;
  state.SetLabel(std::to_string(tests) + " tests of 4 ranks, " + mode + " mode");
}

BENCHMARK(BM_ForkServer)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_Spawn)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime()->Iterations(3);
BENCHMARK(BM_WorkerPool)->Arg(2)->Arg(4)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_AllReduceCallCheck)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(2.0);
BENCHMARK(BM_Threads)->Arg(2)->Arg(4)->Unit(benchmark::kMicrosecond)->UseRealTime()->MinTime(1.0);
BENCHMARK(BM_Program)->Args({21, 0})->Args({21, 1})->Unit(benchmark::kMillisecond)->UseManualTime()->Iterations(3);

}  // namespace
}  // namespace dtensor

int main(int argc, char** argv) {
  if (std::getenv("DTENSOR_BENCH_AS_GTEST")) {  // BM_Program's child: a plain gtest program
    return dtensor::testing::main_with_harness(argc, argv, [](int& ac, char** av) {
      ::testing::InitGoogleTest(&ac, av);
      return RUN_ALL_TESTS();
    });
  }
  return dtensor::bench::main(argc, argv);
}
