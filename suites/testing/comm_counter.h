// suites/testing/comm_counter.h: CommCounter, a CommDebugMode (dtensor/debug/comm_mode.h) that
// is active for its lifetime and starts over on reset(), for tests and benchmarks that check
// how much a computation communicates between two points of a rank body:
//
//   testing::CommCounter comm;            // in a rank body (each rank thread counts its own)
//   at::Tensor loss = ...;                // forward
//   EXPECT_EQ(comm.counts()[debug::c10d_functional::all_gather_into_tensor], 3);
//   comm.reset();
//   loss.backward();
//   EXPECT_EQ(comm.counts()[debug::c10d_functional::reduce_scatter_tensor], 3);
//
// What counts is CommDebugMode's: every collective this rank's thread issues, on any group,
// under PyTorch's keys; a barrier moves nothing and is not counted (PyTorch's CommDebugMode
// does not count one either). CallCounter counts the calls of every Group method, a barrier's
// too, for the tests that check barriers.
#pragma once

#include "dtensor/comm/group.h"
#include "dtensor/debug/comm_mode.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace dtensor {
namespace testing {

class CommCounter {
 public:
  CommCounter() { active_.emplace(mode_.enter()); }
  CommCounter(const CommCounter&) = delete;
  CommCounter& operator=(const CommCounter&) = delete;

  // Counts per key since construction or the last reset() (PyTorch's get_comm_counts()).
  debug::CommCounts counts() const { return mode_.get_comm_counts(); }
  // All of them (PyTorch's get_total_counts()).
  int64_t collectives() const { return mode_.get_total_counts(); }
  // Clears the counts and the records: CommDebugMode entered again.
  void reset() {
    active_.reset();
    active_.emplace(mode_.enter());
  }
  const debug::CommDebugMode& mode() const { return mode_; }

 private:
  debug::CommDebugMode mode_;
  std::optional<debug::CommDebugMode::Active> active_;
};

// The calls of each Group method ("barrier", "all_reduce", ...) this thread issues while it is
// alive (NOTE: [Collective observers] in dtensor/comm/group.h); it stands in for the thread's
// observer (a CommDebugMode entered meanwhile sees nothing) and puts the previous one back.
class CallCounter final : public comm::CollectiveObserver {
 public:
  CallCounter() : previous_(comm::set_collective_observer(this)) {}
  ~CallCounter() override { comm::set_collective_observer(previous_); }
  CallCounter(const CallCounter&) = delete;
  CallCounter& operator=(const CallCounter&) = delete;
  void on_collective(const comm::CollectiveCall& call) override { ++calls[call.op]; }

  std::map<std::string, int> calls;

 private:
  comm::CollectiveObserver* previous_;
};

}  // namespace testing
}  // namespace dtensor
