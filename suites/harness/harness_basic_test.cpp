// The harness as a user uses it: fixtures, settings, launch modes, subtests.
#include "dtensor/comm/comm.h"
#include "dtensor/comm/device.h"
#include "harness/harness.h"
#include "suites/testing/child_process.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <sched.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <mutex>
#include <numeric>
#include <set>
#include <string>
#include <vector>

namespace dtensor {
namespace {

using testing::SubtestParams;

// The default fixture: 4 ranks on a CPU machine (DTENSOR_WORLD_SIZE changes the count and
// DTENSOR_BACKEND the backend; the bodies hold at any of them). A body expects the group the
// fixture asked for: run by an external launcher with another count, it fails
// (HarnessReports.ExternalLauncherRunsInLockstepAndOnlyRankZeroPrints relies on that).
class FourRanks : public testing::MultiProcessTest {};

DTENSOR_TEST_F(FourRanks, EveryRankRunsTheBodyWithItsGroup) {
  const int n = effective_world_size();
  ASSERT_GE(rank(), 0);
  ASSERT_LT(rank(), n);
  EXPECT_EQ(group().size(), n);
  EXPECT_EQ(ranks(), n);
  EXPECT_EQ(group().rank(), rank());
  // gloo on a CPU machine (the default backend), or what DTENSOR_BACKEND names.
  EXPECT_EQ(group().backend(), effective_backend());
  if (std::getenv("DTENSOR_BACKEND") == nullptr && testing::gpu_count() == 0) EXPECT_EQ(group().backend(), "gloo");
  EXPECT_EQ(comm::default_group().get(), &group());
  EXPECT_EQ(device_type(), testing::device_type_for_backend(effective_backend()));
  // Every rank is its own process.
  auto pids = comm::all_gather_object(group(), static_cast<int64_t>(::getpid()));
  std::set<int64_t> distinct(pids.begin(), pids.end());
  EXPECT_EQ(distinct.size(), static_cast<size_t>(n));
}

class TwoRanks : public testing::MultiProcessTest {
 public:
  int world_size() const override { return 2; }
};

DTENSOR_TEST_F(TwoRanks, WorldSizeOverride) {
  // The variable wins over the fixture by design (so CI can change every suite at once): this
  // checks the fixture's own count, so it needs that count.
  DTENSOR_REQUIRE_WORLD_SIZE(2);
  EXPECT_EQ(group().size(), 2);
  at::Tensor x = at::ones({1});
  group().all_reduce(x);
  EXPECT_EQ(x.item<float>(), 2);
}

// The same body under each process launch mode.
template <testing::LaunchMode M>
class Launched : public testing::MultiProcessTest {
 public:
  testing::LaunchMode launch_mode() const override { return M; }
};
using SpawnRanks = Launched<testing::LaunchMode::kSpawn>;
using PoolRanks = Launched<testing::LaunchMode::kWorkerPool>;

void check_collective_and_isolation(testing::MultiRankTest& t) {
  const int n = t.ranks();
  at::Tensor x = at::full({2}, t.rank());
  t.group().all_reduce(x);
  EXPECT_EQ(x[0].item<float>(), n * (n - 1) / 2);  // 0 + 1 + ... + (n - 1)
  auto pids = comm::all_gather_object(t.group(), static_cast<int64_t>(::getpid()));
  EXPECT_EQ(std::set<int64_t>(pids.begin(), pids.end()).size(), static_cast<size_t>(n));
}

DTENSOR_TEST_F(SpawnRanks, CollectiveWorks) { check_collective_and_isolation(*this); }
DTENSOR_TEST_F(PoolRanks, CollectiveWorks) { check_collective_and_isolation(*this); }

// Pool workers keep their process (and group) from test to test. A test run alone starts its
// own pool (ctest runs every test as its own program), so reuse shows only across tests of one
// program: these two are DISABLED_ and WorkerPool.RunsConsecutiveTestsInTheSameProcesses runs
// them in that order in a child program. The second fails unless each of its ranks is the
// process that ran the same rank of the first.
int g_pool_bodies = 0;                // bodies this worker process ran
std::vector<int64_t> g_pool_first_pids;  // every rank's pid, as the first test saw them
DTENSOR_TEST_F(PoolRanks, DISABLED_WorkersAreReused1) {
  ++g_pool_bodies;
  g_pool_first_pids = comm::all_gather_object(group(), static_cast<int64_t>(::getpid()));
}
DTENSOR_TEST_F(PoolRanks, DISABLED_WorkersAreReused2) {
  ++g_pool_bodies;
  EXPECT_EQ(g_pool_bodies, 2) << "rank " << rank() << " (pid " << ::getpid() << ") did not run the previous test";
  EXPECT_EQ(comm::all_gather_object(group(), static_cast<int64_t>(::getpid())), g_pool_first_pids)
      << "the ranks are not the processes of the previous test";
}

TEST(WorkerPool, RunsConsecutiveTestsInTheSameProcesses) {
  // DTENSOR_LAUNCH_MODE would override the fixture's pool (a CI pass in fork mode).
  auto run = testing::run_self({"--gtest_filter=PoolRanks.DISABLED_WorkersAreReused1:PoolRanks.DISABLED_WorkersAreReused2",
                                "--gtest_also_run_disabled_tests"},
                               {{"DTENSOR_LAUNCH_MODE", "pool"}});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("[  PASSED  ] 2 tests"), std::string::npos) << run.output;
}

// Fork-server ranks are fresh processes in every test, also when the fork server hands out
// spare ranks forked ahead of time (NOTE: [Spare ranks] in launcher.cpp; from a program's
// second test on): no body ran in them before. HarnessReports.ForkServerRanksAreFreshInEveryTest
// runs these four in one program; with DTENSOR_TEST_PID_DIR set, each rank leaves a file named
// after its pid there.
int g_fresh_bodies = 0;  // per rank process
class FreshRanks : public testing::MultiProcessTest {};
void check_fresh_process(testing::MultiProcessTest& t) {
  if (t.effective_launch_mode() == testing::LaunchMode::kWorkerPool)
    GTEST_SKIP() << "DTENSOR_LAUNCH_MODE=pool: pool workers run test after test by design";
  ++g_fresh_bodies;
  EXPECT_EQ(g_fresh_bodies, 1) << "rank " << t.rank() << " (pid " << ::getpid() << ") ran a test body before";
  at::Tensor x = at::ones({1});
  t.group().all_reduce(x);
  EXPECT_EQ(x.item<float>(), t.group().size());
  if (const char* dir = std::getenv("DTENSOR_TEST_PID_DIR"))
    std::ofstream(std::string(dir) + "/" + std::to_string(::getpid())) << t.rank() << "\n";
}
DTENSOR_TEST_F(FreshRanks, Body1) { check_fresh_process(*this); }
DTENSOR_TEST_F(FreshRanks, Body2) { check_fresh_process(*this); }
DTENSOR_TEST_F(FreshRanks, Body3) { check_fresh_process(*this); }
DTENSOR_TEST_F(FreshRanks, Body4) { check_fresh_process(*this); }

class ThreadRanks : public testing::MultiThreadedTest {};

DTENSOR_TEST_F(ThreadRanks, EveryThreadHasItsRankAndGroup) {
  EXPECT_EQ(group().backend(), "threads");
  EXPECT_EQ(comm::default_group().get(), &group());
  auto pids = comm::all_gather_object(group(), static_cast<int64_t>(::getpid()));
  EXPECT_EQ(std::set<int64_t>(pids.begin(), pids.end()).size(), 1u);
  std::vector<int> expected(static_cast<size_t>(ranks()));
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(comm::all_gather_object(group(), rank()), expected);
}

// Each rank's intra-op pool holds its share of the cores the ranks run on (torchrun's
// habit), or OMP_NUM_THREADS's count when that is set; measured on an intra-op parallel op,
// not only read back from at::get_num_threads().
void check_intra_op_share(const testing::MultiRankTest& t, int ranks) {
  int expected = 0;
  if (const char* omp = std::getenv("OMP_NUM_THREADS")) {
    expected = std::atoi(omp);
  } else {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    ASSERT_EQ(::sched_getaffinity(0, sizeof(cpus), &cpus), 0);
    expected = std::max(1, CPU_COUNT(&cpus) / ranks);
  }
  EXPECT_EQ(at::get_num_threads(), expected) << "rank " << t.rank() << " of " << ranks;
  // The threads a parallel loop really uses on this rank.
  std::mutex mu;
  std::set<int> used;
  at::parallel_for(0, 1 << 16, 1, [&](int64_t, int64_t) {
    std::lock_guard<std::mutex> lk(mu);
    used.insert(at::get_thread_num());
  });
  EXPECT_LE(static_cast<int>(used.size()), expected) << "rank " << t.rank();
}

// Fixtures of their own: HarnessReports.ShardingSplitsTestsNotRanks counts FourRanks' tests.
class IntraOpPool : public testing::MultiProcessTest {};
class IntraOpPoolThreads : public testing::MultiThreadedTest {};
DTENSOR_TEST_F(IntraOpPool, EachRankHasItsShareOfTheCores) { check_intra_op_share(*this, ranks()); }
DTENSOR_TEST_F(IntraOpPoolThreads, EachRankHasItsShareOfTheCores) { check_intra_op_share(*this, ranks()); }

DTENSOR_TEST_F(FourRanks, RunSubtestsCoversTheProduct) {
  std::vector<std::string> seen;
  int n = testing::run_subtests({{"dtype", {"float", "double"}}, {"dim", {0, 1, 2}}, {"flag", {true}}},
                                [&](const SubtestParams& p) {
                                  seen.push_back(p.to_string());
                                  // Collectives inside subtests share the test's group (of
                                  // the count the fixture asked for).
                                  at::Tensor x = at::ones({1});
                                  group().all_reduce(x);
                                  EXPECT_EQ(x.item<float>(), effective_world_size());
                                  EXPECT_TRUE(p.get<bool>("flag"));
                                });
  EXPECT_EQ(n, 6);
  ASSERT_EQ(seen.size(), 6u);
  EXPECT_EQ(seen.front(), "dtype=float, dim=0, flag=true");
  EXPECT_EQ(seen.back(), "dtype=double, dim=2, flag=true");
}

TEST(RunSubtests, EmptyValueListIsAnError) {
  try {
    testing::run_subtests({{"dim", {}}}, [](const SubtestParams&) {});
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'dim' has no values"), std::string::npos);
  }
}

TEST(RunSubtests, UnknownParameterNamesTheKnownOnes) {
  testing::SubtestParams p;
  p.add("dtype", "float");
  try {
    p.get<int64_t>("dim");
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no parameter 'dim'; it has: dtype"), std::string::npos);
  }
}

TEST(LaunchMode, ParsesNamesAndRejectsOthers) {
  EXPECT_EQ(testing::launch_mode_from_string("pool"), testing::LaunchMode::kWorkerPool);
  EXPECT_EQ(testing::to_string(testing::LaunchMode::kSpawn), "spawn");
  try {
    testing::launch_mode_from_string("forks");
    ADD_FAILURE() << "no error";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected fork, spawn or pool"), std::string::npos);
  }
}

class NcclRanks : public testing::MultiProcessTest {
 public:
  std::string backend() const override { return "nccl"; }
};
DTENSOR_TEST_F(NcclRanks, AllReduceOnGpus) {
  DTENSOR_SKIP_IF_LT_X_GPU(world_size());
  if (group().backend() != "nccl") GTEST_SKIP() << "DTENSOR_BACKEND overrides the fixture's nccl with " << group().backend();
  // Every rank made its own GPU current before the group was created (NOTE: [Rank devices]).
  const at::Device dev = comm::rank_device("cuda");
  EXPECT_EQ(dev.index(), rank() % testing::gpu_count());
  EXPECT_EQ(device_type(), "cuda");
  at::Tensor x = at::ones({4}, at::TensorOptions().device(dev));
  group().all_reduce(x);
  EXPECT_EQ(x.sum().item<float>(), 4 * group().size());
}

// A body that every rank skips at once (as when DTENSOR_BACKEND=gloo overrides a GPU
// fixture): no rank may leave while a peer is still creating the group (DESIGN.md D12), so
// the result is a skip every time, never "connection closed by peer" in a slower rank.
class SkipAtOnce : public testing::MultiProcessTest {};
DTENSOR_TEST_F(SkipAtOnce, DISABLED_EveryRank) { GTEST_SKIP() << "skipped at once"; }

TEST(HarnessSkips, EveryRankSkippingAtOnceIsASkip) {
  constexpr int kRepeats = 8;
  auto run = testing::run_self({"--gtest_filter=SkipAtOnce.DISABLED_EveryRank", "--gtest_also_run_disabled_tests",
                                "--gtest_repeat=" + std::to_string(kRepeats)});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  int skips = 0;
  for (size_t at = run.output.find("[  SKIPPED ] SkipAtOnce.DISABLED_EveryRank ("); at != std::string::npos;
       at = run.output.find("[  SKIPPED ] SkipAtOnce.DISABLED_EveryRank (", at + 1))
    ++skips;
  EXPECT_EQ(skips, kRepeats) << run.output;
}

// The GPU defaults (PyTorch's common_dtensor.py), as plain functions of the GPU count.
TEST(GpuDefaults, WorldSizeIsPyTorchsNumDevices) {
  EXPECT_EQ(testing::default_world_size(0), 4);
  EXPECT_EQ(testing::default_world_size(1), 4);  // one GPU: ranks run on the CPU
  EXPECT_EQ(testing::default_world_size(2), 2);
  EXPECT_EQ(testing::default_world_size(3), 3);
  EXPECT_EQ(testing::default_world_size(8), 4);
  // On this machine: what a MultiProcessTest fixture without an override uses.
  EXPECT_EQ(testing::default_world_size(testing::gpu_count()),
            testing::gpu_count() > 1 ? std::min(testing::gpu_count(), 4) : 4);
}

TEST(GpuDefaults, NcclOnlyWithAGpuPerRank) {
  EXPECT_EQ(testing::default_backend(0, 4, true), "gloo");
  EXPECT_EQ(testing::default_backend(2, 4, true), "gloo");
  EXPECT_EQ(testing::default_backend(4, 4, true), "nccl");
  EXPECT_EQ(testing::default_backend(8, 4, false), "gloo");  // a CPU-only build
  EXPECT_EQ(testing::device_type_for_backend("nccl"), "cuda");
  EXPECT_EQ(testing::device_type_for_backend("cpu:gloo,cuda:nccl"), "cuda");
  EXPECT_EQ(testing::device_type_for_backend("gloo"), "cpu");
  EXPECT_EQ(testing::device_type_for_backend("mpi"), "cpu");
  // One GPU: every rank on it, Gloo moving host copies (README, "Nightly GPU runs").
  EXPECT_EQ(testing::device_type_for_backend("cpu:gloo,cuda:gloo"), "cuda");
  EXPECT_EQ(testing::gpu_skip_reason("cpu:gloo,cuda:gloo", 4, 1, 0), "");
  EXPECT_EQ(testing::gpu_skip_reason("cpu:gloo,cuda:gloo", 4, 0, 0),
            "backend cpu:gloo,cuda:gloo moves CUDA tensors: it needs a CUDA device, this machine has none");
}

TEST(GpuDefaults, ForcedNcclWithTooFewGpusSkipsWithTheReason) {
  EXPECT_EQ(testing::gpu_skip_reason("nccl", 4, 2, 0),
            "backend nccl runs one rank per GPU: 4 ranks need 4 CUDA devices, this machine has 2 "
            "(set DTENSOR_WORLD_SIZE=2, or DTENSOR_BACKEND=gloo)");
  EXPECT_EQ(testing::gpu_skip_reason("cpu:gloo,cuda:nccl", 4, 0, 0),
            "backend cpu:gloo,cuda:nccl runs one rank per GPU: 4 ranks need 4 CUDA devices, this "
            "machine has 0");
  EXPECT_EQ(testing::gpu_skip_reason("nccl", 4, 4, 0), "");
  EXPECT_EQ(testing::gpu_skip_reason("gloo", 4, 0, 0), "");
  EXPECT_EQ(testing::gpu_skip_reason("gloo", 4, 1, 2), "Need at least 2 CUDA devices, found 1");
}

// A fixture forcing nccl on this machine is skipped (never failed, never hung) with the reason:
// no NCCL in a CPU build, too few GPUs otherwise.
class NcclTooManyRanks : public testing::MultiProcessTest {
 public:
  std::string backend() const override { return "nccl"; }
  int world_size() const override { return testing::gpu_count() + 1; }
};
DTENSOR_TEST_F(NcclTooManyRanks, IsSkipped) {
  if (group().backend() != "nccl") GTEST_SKIP() << "DTENSOR_BACKEND overrides the fixture's nccl";
  ADD_FAILURE() << "ran with more nccl ranks than GPUs";
}

}  // namespace
}  // namespace dtensor
