// harness/internal/rank_run.h: what one rank did in one test, how a rank runs a body, and how
// the orchestrator turns all ranks' outcomes into one gtest result.
#pragma once

#include "dtensor/comm/group.h"
#include "harness/multi_rank_test.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace dtensor {
namespace testing {
namespace internal {

struct RankPart {
  // What the part is; between processes, the strings "failure", "fatal", "skip", "exception".
  enum class Kind {
    kFailure,    // a non-fatal failure (EXPECT_*, ADD_FAILURE)
    kFatal,      // a fatal failure (ASSERT_*, FAIL): the body stopped
    kSkip,       // GTEST_SKIP: the body stopped
    kException,  // an uncaught exception, or an error the harness reports for the rank
  };
  Kind kind = Kind::kFailure;
  std::string file;
  int line = -1;
  std::string message;
  bool collective_error = false;  // an uncaught comm::CollectiveError (maybe caused by a peer)
};

struct RankResult {
  int rank = -1;
  std::vector<RankPart> parts;
  double duration_ms = 0;
  bool failed() const;
  bool fatal() const;    // the rank stopped early: ASSERT, exception or skip
  bool skipped() const;  // a skip and no failure
  // Failed only through CollectiveErrors (the symptom of another rank failing).
  bool only_collective_errors() const;
};
void to_json(nlohmann::json& j, const RankPart& p);
void from_json(const nlohmann::json& j, RankPart& p);
void to_json(nlohmann::json& j, const RankResult& r);
void from_json(const nlohmann::json& j, RankResult& r);

// How a rank ended, as the orchestrator saw it.
struct RankOutcome {
  int rank = -1;
  std::optional<RankResult> result;
  enum class End { kFinished, kExited, kSignaled, kKilledAfterPeer, kTimedOut } end = End::kFinished;
  int exit_code = 0;
  int signal = 0;
  // The rank was through its body (and TearDownRank): at a timeout, it waited for the others.
  bool body_done = false;
  std::string output;  // captured stdout+stderr (processes only)
};

// Where a rank's assertion failures, skips and exceptions are collected, by rank.
class RankSink {
 public:
  void add(int rank, RankPart part);
  std::vector<RankPart> take(int rank);

 private:
  std::mutex mu_;
  std::vector<std::pair<int, RankPart>> parts_;
};

// While alive, captures every gtest assertion of every thread into `sink`, tagged with the
// rank of the thread that made it (see set_current_rank).
class RankCapture : public ::testing::ScopedFakeTestPartResultReporter {
 public:
  explicit RankCapture(std::shared_ptr<RankSink> sink);
  void ReportTestPartResult(const ::testing::TestPartResult& result) override;

 private:
  ::testing::TestPartResultArray unused_;
  std::shared_ptr<RankSink> sink_;
};
void set_current_rank(int rank);  // thread-local
int current_rank();

// Sizes ATen's intra-op thread pool for a rank that shares this host's cores with
// `ranks_on_this_host - 1` others (NOTE: [Intra-op threads of a rank]). Call it on the
// rank's own thread: OpenMP keeps the count per thread. Does nothing when OMP_NUM_THREADS is set.
void set_rank_intra_op_threads(int ranks_on_this_host);

// Runs the registered body `test_id` as `rank` of `group` with (with_comms semantics) a barrier
// after a body that ran to completion (unless `barrier_after` is false: a pool worker runs it
// only when the orchestrator asks, NOTE: [Closing barrier on demand] in launcher.cpp).
// Never throws; everything lands in the result.
RankResult run_rank_body(const std::string& test_id, int rank, const comm::GroupPtr& group,
                         RankSink& sink, bool barrier_after = true);
// Whether a rank with this result takes part in the closing barrier (its body ran to the end:
// no ASSERT, skip or exception), and the barrier itself (its failure is added to `res`).
bool needs_closing_barrier(const RankResult& res, const comm::GroupPtr& group);
void run_closing_barrier(const std::string& test_id, const comm::GroupPtr& group, RankSink& sink,
                         RankResult& res);

// Called (on the rank's thread) when its body and TearDownRank are over, before the closing
// barrier: tells the orchestrator that this rank now only waits for the others. Thread-local.
void set_body_done_hook(std::function<void()> hook);

// Orchestrator: adds the gtest failures/skip for the outcomes of one test.
void report_outcomes(const std::string& test_id, const std::vector<RankOutcome>& outcomes,
                     std::chrono::milliseconds timeout, const std::string& stacks);

bool registered(const std::string& test_id);
std::string signal_name(int sig);
std::string env_or(const char* name, const std::string& fallback);

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
