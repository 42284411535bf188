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
//
// Bodies with ranks as threads use RankThreads: persistent threads, one step per iteration.
#pragma once

#include "harness/internal/launcher.h"
#include "harness/main.h"
#include "harness/multi_rank_test.h"

#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

namespace dtensor {
namespace bench {

constexpr std::chrono::milliseconds kProcessBenchTimeout{300000};

// Bytes this machine has sent over its loopback interface (every rank process of a Gloo world
// on one host talks through it), or -1 where the kernel does not say.
inline double loopback_tx_bytes() {
  std::FILE* f = std::fopen("/sys/class/net/lo/statistics/tx_bytes", "r");
  if (!f) return -1;
  double v = -1;
  if (std::fscanf(f, "%lf", &v) != 1) v = -1;
  std::fclose(f);
  return v;
}

// Collective (in a rank body): `step` once to warm up, then `iters` times between barriers;
// rank 0 prints "BENCH_MS <median milliseconds>", then "BENCH_COUNTER <name> <value>" for each
// of `counters` (figures the body measured, reported as benchmark counters). For ranks that are
// processes, also the counter lo_bytes_per_rank_step: the loopback interface's bytes sent during
// the timed steps over (steps x ranks): what each rank sends per step, with TCP/IP headers, the
// barriers around each step and anything else on the machine using loopback (run it quiet).
inline void report_median_ms(testing::MultiRankTest& t, int iters, const std::function<void()>& step,
                             const std::vector<std::pair<std::string, double>>& counters = {}) {
  step();
  std::vector<double> ms;
  t.group().barrier();
  const double lo_before = loopback_tx_bytes();
  for (int i = 0; i < iters; ++i) {
    t.group().barrier();
    const auto t0 = std::chrono::steady_clock::now();
    step();
    t.group().barrier();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  const double lo_after = loopback_tx_bytes();
  std::sort(ms.begin(), ms.end());
  if (t.rank() == 0) {
    std::printf("BENCH_MS %.4f\n", ms[ms.size() / 2]);
    for (const auto& [name, value] : counters) std::printf("BENCH_COUNTER %s %.17g\n", name.c_str(), value);
    if (t.group().backend() != "threads" && lo_before >= 0 && lo_after >= lo_before)
      std::printf("BENCH_COUNTER lo_bytes_per_rank_step %.17g\n", (lo_after - lo_before) / (iters * t.ranks()));
  }
  std::fflush(stdout);
}

// Runs harness test `test_id` (a body calling report_median_ms) on the worker pool for each
// benchmark iteration and records rank 0's median as the iteration time (UseManualTime) and
// its counters as the benchmark's.
// The backend is DTENSOR_BACKEND's (default gloo): the nightly GPU run sets nccl, or
// cpu:gloo,cuda:gloo on one GPU, and the bodies build their meshes on t.device_type().
inline void run_in_worker_pool(benchmark::State& state, int world_size, const std::string& test_id) {
  const char* env_backend = std::getenv("DTENSOR_BACKEND");
  const std::string backend = env_backend && *env_backend ? env_backend : "gloo";
  for (auto _ : state) {
    std::string stacks;
    auto outs = testing::internal::worker_pool(world_size, backend, kProcessBenchTimeout)
                    .run(test_id, kProcessBenchTimeout, &stacks);
    std::smatch m;
    if (!outs[0].result || outs[0].result->failed() ||
        !std::regex_search(outs[0].output, m, std::regex("BENCH_MS ([0-9.]+)"))) {
      state.SkipWithError(("rank 0 failed: " + outs[0].output).c_str());
      break;
    }
    state.SetIterationTime(std::stod(m[1]) / 1000.0);
    const std::regex counter("BENCH_COUNTER (\\S+) (\\S+)");
    for (std::sregex_iterator it(outs[0].output.begin(), outs[0].output.end(), counter), end; it != end; ++it)
      state.counters[(*it)[1].str()] = std::stod((*it)[2].str());
  }
}

// `world` persistent rank threads. Each runs setup(rank) once (on its own thread; it builds the
// rank's group, mesh and inputs and returns the rank's step); the constructor returns when
// every rank is set up, and step() runs one step on every rank and waits for all of them. An
// exception in a rank's setup is kept in error() (the first one) and that rank's step is then
// empty: check error() before timing.
class RankThreads {
 public:
  using Step = std::function<void()>;
  RankThreads(int world, const std::function<Step(int rank)>& setup) : world_(world) {
    for (int r = 0; r < world; ++r) threads_.emplace_back([this, r, setup] { rank_main(r, setup); });
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return ready_ == world_; });
  }
  ~RankThreads() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  RankThreads(const RankThreads&) = delete;
  RankThreads& operator=(const RankThreads&) = delete;

  void step() {
    std::unique_lock<std::mutex> lk(mu_);
    done_ = 0;
    ++generation_;
    cv_.notify_all();
    cv_.wait(lk, [&] { return done_ == world_; });
  }
  const std::string& error() const { return error_; }

 private:
  void rank_main(int r, const std::function<Step(int)>& setup) {
    Step step;
    try {
      step = setup(r);
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lk(mu_);
      if (error_.empty()) error_ = "rank " + std::to_string(r) + ": " + e.what();
    }
    uint64_t seen = 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      ++ready_;
    }
    cv_.notify_all();
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(mu_);
        cv_.wait(lk, [&] { return generation_ != seen || stop_; });
        if (stop_) return;
        seen = generation_;
      }
      if (step) step();
      std::lock_guard<std::mutex> lk(mu_);
      if (++done_ == world_) cv_.notify_all();
    }
  }

  const int world_;
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t generation_ = 0;
  int ready_ = 0, done_ = 0;
  bool stop_ = false;
  std::string error_;
};

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
