// A user's test program built with line tables (-O2 -g, as CMAKE_BUILD_TYPE=RelWithDebInfo
// builds it; no precompiled header, no ENABLE_EXPORTS): its crash and timeout reports must be
// filed at the line of the user's frame and name the user's functions with file:line
// (NOTE: [Symbolised user frames]). HarnessReports.*LineTables* run it as a child program and
// find the expected lines by the LINE: markers below.
#include "harness/harness.h"

#include <ATen/ATen.h>

#include <csignal>
#include <iostream>
#include <future>

namespace {

class LineFaults : public dtensor::testing::MultiProcessTest {
 public:
  std::chrono::milliseconds timeout() const override { return std::chrono::seconds(3); }
};

// (noipa: see wait_forever.)
[[gnu::noipa]] void crash_in_rank(int rank, int bad) {
  if (rank == bad) std::raise(SIGSEGV);  // LINE:raise
  std::cout << "rank " << rank << " goes on" << std::endl;  // (raise is no tail call)
}

// std::future's wait is inlined here: the stuck frame is this function's line, not libstdc++'s.
// (noipa: not inlined, and no clone under another name, as a constant argument could make.)
[[gnu::noipa]] void wait_forever() {
  std::promise<void>().get_future().wait();  // LINE:wait
}

DTENSOR_TEST_F(LineFaults, DISABLED_CrashInRank1) {
  crash_in_rank(rank(), 1);  // LINE:call
  at::Tensor x = at::ones({1});
  group().all_reduce(x);
}

DTENSOR_TEST_F(LineFaults, DISABLED_HangInRank2) {
  if (rank() == 2) wait_forever();
}

}  // namespace
