// harness/multi_rank_test.h
//
// GoogleTest fixtures that run one test body as N ranks (DESIGN.md D3), the C++ counterpart
// of PyTorch's MultiProcessTestCase / MultiThreadedTestCase.
//
//   class AllReduceTest : public dtensor::testing::MultiProcessTest {};   // 4 ranks, gloo
//
//   DTENSOR_TEST_F(AllReduceTest, SumsRanks) {          // the body runs in every rank
//     at::Tensor t = at::full({2}, rank());
//     group().all_reduce(t);
//     EXPECT_EQ(t[0].item<int64_t>(), ranks() * (ranks() - 1) / 2);
//   }
//
// The gtest process itself only orchestrates: it starts the ranks, waits for them, and turns
// their results into ONE gtest result: every failure is reported at its file:line prefixed
// "[rank r]"; a crash names the rank and the signal; a hang is killed at timeout() with the
// list of unfinished ranks and their stacks; a GTEST_SKIP() in any rank skips the test with
// its reason; when one rank fails the others are torn down at once. Each rank's output is
// captured and shown prefixed "[rank r]" when the test fails (or always, with
// DTENSOR_SHOW_RANK_OUTPUT=1).
//
// Link the test program with dtensor::harness_main (it provides main(), which starts the
// fork server before any thread exists), or call dtensor::testing::main from your own main.
//
// Settings: override the virtual functions in the fixture, or set the environment variable
// (the variable wins, so a CI job can change every suite at once):
//   world_size()   DTENSOR_WORLD_SIZE    default 4 (processes: the GPU count, at most 4, on
//                                        a machine with more than one GPU; default_world_size)
//   timeout()      DTENSOR_TEST_TIMEOUT  seconds, default 300 (PyTorch's TIMEOUT)
//   backend()      DTENSOR_BACKEND       gloo | nccl | mpi | cpu:gloo,cuda:nccl
//   launch_mode()  DTENSOR_LAUNCH_MODE   fork (default) | spawn | pool
//   (a pass)       DTENSOR_RANK_KIND     all (default) | threads | processes: run only the
//                                        tests of that rank kind, the others skip (CI's passes
//                                        at world sizes 2 and 8 run the thread suites)
//
// GPUs (NOTE: [Rank devices] in dtensor/comm/device.h): with a backend for CUDA tensors (nccl,
// or cpu:gloo,cuda:gloo), every rank makes its own CUDA device current (rank modulo the GPU
// count) before the group is created; a test whose nccl backend needs more GPUs than the
// machine has (or a cuda backend on a machine without one) is skipped with the reason
// (gpu_skip_reason). One GPU runs the multi-rank suites on "cuda" meshes with
// DTENSOR_BACKEND=cpu:gloo,cuda:gloo: every rank on that GPU, Gloo moving host copies.
#pragma once

#include "dtensor/comm/group.h"

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace dtensor {
namespace testing {

constexpr int kDefaultWorldSize = 4;
constexpr std::chrono::milliseconds kDefaultTestTimeout = std::chrono::seconds(300);

enum class LaunchMode {
  kForkServer,  // ranks forked from a zygote started at program start (default)
  kSpawn,       // ranks are fresh executions of this program (most isolated, ~0.8 s each)
  kWorkerPool,  // ranks started once, reused test after test with one process group
};
std::string to_string(LaunchMode m);

// Empty when `backend` (a DTENSOR_BACKEND value) names only known backends (gloo, nccl, mpi,
// or device:backend pairs); otherwise the error, naming the valid ones (NOTE: [Misspelled
// backends fail] in multi_rank_test.cpp).
std::string backend_name_error(const std::string& backend);
LaunchMode launch_mode_from_string(const std::string& s);

// Common base of MultiProcessTest and MultiThreadedTest. Not used directly.
class MultiRankTest : public ::testing::Test {
 public:
  // Number of ranks. Env DTENSOR_WORLD_SIZE overrides.
  virtual int world_size() const { return kDefaultWorldSize; }
  // Whole-test timeout, body and process-group setup included. Env DTENSOR_TEST_TIMEOUT
  // (seconds) overrides.
  virtual std::chrono::milliseconds timeout() const { return kDefaultTestTimeout; }

  // The device the test's meshes and tensors live on: "cpu" for thread ranks; for process
  // ranks the backend's device (MultiProcessTest::device_type). Build meshes on this, never
  // on a literal "cpu" (PyTorch: self.device_type).
  virtual std::string device_type() const { return "cpu"; }

  // Inside the body: this rank, and the group of all ranks (also the default group).
  int rank() const { return rank_; }
  // Inside the body: the number of ranks this test runs with (DTENSOR_WORLD_SIZE applied),
  // i.e. group().size() (PyTorch: self.world_size). Build meshes from it, never from a literal.
  int ranks() const;
  // Inside the body: a 2-D mesh shape over all ranks, {ranks() / 2, 2} ({1, 2} with 2 ranks).
  // Skip first with DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(2) where an odd count is possible.
  std::vector<int64_t> mesh_shape_2d() const;
  comm::Group& group() const;
  const comm::GroupPtr& group_ptr() const { return group_; }

  // Run in every rank around the body, after the group exists (user hooks).
  virtual void SetUpRank() {}
  virtual void TearDownRank() {}

  // Generated by DTENSOR_TEST_F; the body of the test.
  virtual void RankBody();

  // Resolved settings (environment applied).
  int effective_world_size() const;
  std::chrono::milliseconds effective_timeout() const;

  // Internal: the harness sets these in each rank.
  void internal_set_rank(int rank, comm::GroupPtr group) {
    rank_ = rank;
    group_ = std::move(group);
  }

 protected:
  virtual void RunRanks(const std::string& test_id) = 0;

 private:
  int rank_ = -1;
  comm::GroupPtr group_;
};

// Ranks as processes over a c10d backend (gloo by default). See the file comment.
class MultiProcessTest : public MultiRankTest {
 public:
  // default_world_size(gpu_count()): 4 on CPU machines.
  int world_size() const override;
  // Default: default_backend(gpu_count(), world size): "nccl" with a GPU per rank, else
  // "gloo". Env DTENSOR_BACKEND overrides.
  virtual std::string backend() const;
  virtual LaunchMode launch_mode() const { return LaunchMode::kForkServer; }
  // Skip (with the reason) unless the machine has this many CUDA devices.
  virtual int required_gpus() const { return 0; }

  // device_type_for_backend(effective_backend()): "cuda" when the backend is meant for CUDA
  // tensors (nccl, or a cuda:gloo entry), else "cpu". DTensorTestBase builds its meshes on it.
  std::string device_type() const override;
  std::string effective_backend() const;
  LaunchMode effective_launch_mode() const;

  void RunRanks(const std::string& test_id) override;
};

// Ranks as threads of the test process over an in-memory ThreadGroup. Much faster; a crash
// takes the whole program down (no isolation), and output is not separated by rank.
class MultiThreadedTest : public MultiRankTest {
 public:
  void RunRanks(const std::string& test_id) override;
};

// Number of CUDA devices (0 with a CPU-only libtorch).
int gpu_count();

// PyTorch's NUM_DEVICES (common_dtensor.py): with more than one GPU, the GPU count capped at
// kDefaultWorldSize; otherwise kDefaultWorldSize.
int default_world_size(int gpu_count);
// "nccl" when this build has NCCL and the machine a GPU for each of `world_size` ranks,
// else "gloo".
std::string default_backend(int gpu_count, int world_size, bool nccl_built);
// "cuda" when `backend` is meant for CUDA tensors ("nccl", "cpu:gloo,cuda:nccl", and
// "cpu:gloo,cuda:gloo": every rank on GPU rank % gpu_count(), Gloo moving host copies), else "cpu".
std::string device_type_for_backend(const std::string& backend);
// Why a test of `world_size` ranks over `backend` cannot run on a machine with `gpu_count`
// GPUs (nccl needs one per rank, a cuda:gloo entry one in all; the fixture may require
// more), or "" when it can.
std::string gpu_skip_reason(const std::string& backend, int world_size, int gpu_count,
                            int required_gpus);

// Why a test that needs `relation` ("exactly", "at least", "a multiple of") `n` ranks cannot
// run with `world_size` ranks, or "" when it can. The DTENSOR_REQUIRE_WORLD_SIZE* macros.
std::string world_size_skip_reason(int world_size, int n, const std::string& relation);

namespace internal {
using RankTestFactory = std::function<std::unique_ptr<MultiRankTest>()>;
struct RankTestRegistrar {
  RankTestRegistrar(const char* test_id, RankTestFactory factory, const char* file, int line);
};
}  // namespace internal

}  // namespace testing
}  // namespace dtensor

// Skips the test (in every rank) unless there are at least n CUDA devices.
#define DTENSOR_SKIP_IF_LT_X_GPU(n)                                                     \
  if (::dtensor::testing::gpu_count() < (n))                                           \
  GTEST_SKIP() << "Need at least " << (n) << " CUDA devices, found "                   \
               << ::dtensor::testing::gpu_count()

// World-size requirements of a test body (NOTE: [Tests at any world size]): at the top of a
// DTENSOR_TEST_F body, skip the test in every rank with the reason unless the world has the
// ranks the test needs. A test whose meshes or expected values need a particular count says
// so here; every other test builds its meshes from ranks() / mesh_shape_2d() and runs at any
// DTENSOR_WORLD_SIZE.
#define DTENSOR_REQUIRE_WORLD_SIZE(n) DTENSOR_REQUIRE_RANKS_(this->ranks(), (n), "exactly")
#define DTENSOR_REQUIRE_WORLD_SIZE_AT_LEAST(n) DTENSOR_REQUIRE_RANKS_(this->ranks(), (n), "at least")
#define DTENSOR_REQUIRE_WORLD_SIZE_DIVISIBLE_BY(n) DTENSOR_REQUIRE_RANKS_(this->ranks(), (n), "a multiple of")
// The macros above, given the rank count (for bodies whose fixture is not `this`, such as
// DTENSOR_TEST_BOTH's in suites/testing/rank_modes.h).
#define DTENSOR_REQUIRE_RANKS_(ranks, n, relation)                                                \
  if (const std::string dtensor_ws_why_ = ::dtensor::testing::world_size_skip_reason((ranks), (n), relation); \
      !dtensor_ws_why_.empty())                                                                   \
  GTEST_SKIP() << dtensor_ws_why_

#define DTENSOR_RANK_CLASS_(fixture, name) fixture##_##name##_DTensorRank

// Defines a test whose body runs in every rank. Use like TEST_F.
#define DTENSOR_TEST_F(fixture, name)                                                    \
  class DTENSOR_RANK_CLASS_(fixture, name) : public fixture {                            \
   public:                                                                               \
    void RankBody() override;                                                            \
                                                                                         \
   private:                                                                              \
    void TestBody() override {}                                                          \
  };                                                                                     \
  static ::dtensor::testing::internal::RankTestRegistrar fixture##_##name##_dtensor_reg( \
      #fixture "." #name,                                                                \
      []() -> std::unique_ptr<::dtensor::testing::MultiRankTest> {                       \
        return std::make_unique<DTENSOR_RANK_CLASS_(fixture, name)>();                   \
      },                                                                                 \
      __FILE__, __LINE__);                                                               \
  TEST_F(fixture, name) { this->RunRanks(#fixture "." #name); }                          \
  void DTENSOR_RANK_CLASS_(fixture, name)::RankBody()
