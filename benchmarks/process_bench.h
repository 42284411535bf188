// benchmarks/process_bench.h: the pieces every benchmark program here shares.
//
// Bodies that must run as gloo processes are registered as harness tests and run by the
// harness's worker pool; the body times itself and rank 0 prints the median, which the
// benchmark reads back from rank 0's captured output:
//
//   class MyBench : public dtensor::testing::MultiProcessTest {};
//   DTENSOR_TEST_F(MyBench, Case) {
//     dtensor::bench::report_median_ms(*this, 7, [&] { group().all_reduce(t); });
//   }
//   void BM_Case(benchmark::State& s) { dtensor::bench::run_in_worker_pool(s, 4, "MyBench.Case"); }
//   BENCHMARK(BM_Case)->UseManualTime()->Iterations(1);
//   int main(int argc, char** argv) { return dtensor::bench::main(argc, argv); }
#pragma once

#include "harness/internal/launcher.h"
#include "harness/main.h"
#include "harness/multi_rank_test.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <regex>
#include <string>
#include <vector>

namespace dtensor {
namespace bench {

constexpr std::chrono::milliseconds kProcessBenchTimeout{300000};

// Collective (in a rank body): `step` once to warm up, then `iters` times between barriers;
// rank 0 prints "BENCH_MS <median milliseconds>".
inline void report_median_ms(testing::MultiRankTest& t, int iters, const std::function<void()>& step) {
  step();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    t.group().barrier();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    t.group().barrier();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  if (t.rank() == 0) std::printf("BENCH_MS %.4f\n", ms[ms.size() / 2]);
  std::fflush(stdout);
}

// Runs harness test `test_id` (a body calling report_median_ms) on the worker pool for each
// benchmark iteration and records rank 0's median as the iteration time (UseManualTime).
inline void run_in_worker_pool(benchmark::State& state, int world_size, const std::string& test_id) {
  for (auto _ : state) {
    std::string stacks;
    auto outs = testing::internal::worker_pool(world_size, "gloo", kProcessBenchTimeout)
                    .run(test_id, kProcessBenchTimeout, &stacks);
    std::smatch m;
    if (!outs[0].result || outs[0].result->failed() ||
        !std::regex_search(outs[0].output, m, std::regex("BENCH_MS ([0-9.]+)"))) {
      state.SkipWithError(("rank 0 failed: " + outs[0].output).c_str());
      break;
    }
    state.SetIterationTime(std::stod(m[1]) / 1000.0);
  }
}

// Google Benchmark's main inside the harness (rank processes, fork server).
inline int main(int argc, char** argv) {
  return testing::main_with_harness(argc, argv, [](int& ac, char** av) {
    benchmark::Initialize(&ac, av);
    if (benchmark::ReportUnrecognizedArguments(ac, av)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
  });
}

}  // namespace bench
}  // namespace dtensor
