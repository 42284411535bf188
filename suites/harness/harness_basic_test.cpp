// The harness as a user uses it: fixtures, settings, launch modes, subtests.
#include "dtensor/comm/comm.h"
#include "harness/harness.h"

#include <ATen/ATen.h>

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

namespace dtensor {
namespace {

using testing::SubtestParams;

class FourRanks : public testing::MultiProcessTest {};

DTENSOR_TEST_F(FourRanks, EveryRankRunsTheBodyWithItsGroup) {
  EXPECT_EQ(world_size(), 4);
  ASSERT_GE(rank(), 0);
  ASSERT_LT(rank(), 4);
  EXPECT_EQ(group().size(), 4);
  EXPECT_EQ(group().rank(), rank());
  EXPECT_EQ(group().backend(), "gloo");
  EXPECT_EQ(comm::default_group().get(), &group());
  EXPECT_EQ(device_type(), "cpu");
  // Every rank is its own process.
  auto pids = comm::all_gather_object(group(), static_cast<int64_t>(::getpid()));
  std::set<int64_t> distinct(pids.begin(), pids.end());
  EXPECT_EQ(distinct.size(), 4u);
}

class TwoRanks : public testing::MultiProcessTest {
 public:
  int world_size() const override { return 2; }
};

DTENSOR_TEST_F(TwoRanks, WorldSizeOverride) {
  // The variable wins over the fixture by design (so CI can change every suite at once).
  const char* env = std::getenv("DTENSOR_WORLD_SIZE");
  if (env && *env && std::string(env) != "2")
    GTEST_SKIP() << "DTENSOR_WORLD_SIZE=" << env << " overrides the fixture's world_size() of 2";
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
  at::Tensor x = at::full({2}, t.rank());
  t.group().all_reduce(x);
  EXPECT_EQ(x[0].item<float>(), 6);
  auto pids = comm::all_gather_object(t.group(), static_cast<int64_t>(::getpid()));
  EXPECT_EQ(std::set<int64_t>(pids.begin(), pids.end()).size(), 4u);
}

DTENSOR_TEST_F(SpawnRanks, CollectiveWorks) { check_collective_and_isolation(*this); }
DTENSOR_TEST_F(PoolRanks, CollectiveWorks) { check_collective_and_isolation(*this); }

// Pool workers keep their process (and group) from test to test.
int64_t g_pool_tests_seen = 0;  // per worker process
DTENSOR_TEST_F(PoolRanks, WorkersAreReused1) { ++g_pool_tests_seen; }
DTENSOR_TEST_F(PoolRanks, WorkersAreReused2) {
  ++g_pool_tests_seen;
  // Run alone (ctest runs one test per program) a worker has seen 1 test; in a full run, 2+.
  EXPECT_GE(g_pool_tests_seen, 1);
  auto seen = comm::all_gather_object(group(), g_pool_tests_seen);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()).size(), 1u) << "workers disagree";
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
  auto ranks = comm::all_gather_object(group(), rank());
  EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2, 3}));
}

DTENSOR_TEST_F(FourRanks, RunSubtestsCoversTheProduct) {
  std::vector<std::string> seen;
  int n = testing::run_subtests({{"dtype", {"float", "double"}}, {"dim", {0, 1, 2}}, {"flag", {true}}},
                                [&](const SubtestParams& p) {
                                  seen.push_back(p.to_string());
                                  // Collectives inside subtests share the test's group.
                                  at::Tensor x = at::ones({1});
                                  group().all_reduce(x);
                                  EXPECT_EQ(x.item<float>(), 4);
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
  at::Tensor x = at::ones({4}, at::TensorOptions().device(at::kCUDA, rank()));
  group().all_reduce(x);
  EXPECT_EQ(x.sum().item<float>(), 16);
}

}  // namespace
}  // namespace dtensor
