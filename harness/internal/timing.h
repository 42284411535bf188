// harness/internal/timing.h: every time the harness waits, polls or gives up, in one place.
// Not installed.
#pragma once

#include <chrono>

namespace dtensor {
namespace testing {
namespace internal {

// ---- rank sets: process ranks and the worker pool (launcher.cpp, fork_server.cpp) -------------
// How long the other ranks may go on after one rank failed, crashed or skipped, before the
// harness kills them (they are usually blocked in a collective with the failed rank).
constexpr std::chrono::milliseconds kAbortGrace{1000};
// How long a rank may take to exit after it reported its result.
constexpr std::chrono::milliseconds kExitGrace{5000};
// How long ranks killed at a timeout get to print their stacks.
constexpr std::chrono::milliseconds kStackDumpWait{500};
// How long ranks sent SIGKILL get to be reaped before the rank set stops waiting for them.
constexpr std::chrono::milliseconds kKillWait{5000};
// Poll period of the orchestrator's wait loop.
constexpr std::chrono::milliseconds kRankSetPoll{5};
// How long after a pool rank finished its body the others may take to finish theirs before the
// closing barrier is run (NOTE: [Closing barrier on demand]).
constexpr std::chrono::milliseconds kCloseDelay{50};
// How long a rank set waits for the fork server to answer a launch.
constexpr std::chrono::milliseconds kSpawnReplyWait{10000};

// ---- every rank kind ---------------------------------------------------------------------------
// Extra time a rank's process group (and an external job's store) waits in a collective beyond
// the test's timeout, so that a hang is caught by the harness (which reports it with stacks),
// not by a collective deep in one rank.
constexpr std::chrono::milliseconds kGroupTimeoutMargin{30000};

// ---- thread ranks (multi_rank_test.cpp) --------------------------------------------------------
// After a timeout aborted the world's collectives, how long the rank threads get to finish.
constexpr std::chrono::milliseconds kThreadAbortWait{2000};

// ---- ranks of an external launcher (external.cpp) ----------------------------------------------
// Poll period of the watchdog and of the waits on the job's store.
constexpr std::chrono::milliseconds kExternalPoll{20};
// How often a rank beats its heartbeat (hb/<rank>) while a body runs.
constexpr std::chrono::milliseconds kHeartbeat{100};
// A peer whose heartbeat has not moved for this long is gone.
constexpr std::chrono::milliseconds kDeadAfter{3000};
// A rank still in its body this long after its collectives were aborted at the deadline is
// blocked elsewhere: it posts its result as stuck.
constexpr std::chrono::milliseconds kStuckGrace{2000};
// How long the reporting rank waits for its peers' results, and rank 0 for its peers to check
// out after a failed join.
constexpr std::chrono::milliseconds kReportWait{10000};
// How often the watchdog reads its peers' heartbeats while a body runs.
constexpr std::chrono::milliseconds kPeerCheck{250};
// The watchdog's store requests: one unanswered this long means the store's host (rank 0) is
// gone or unreachable (NOTE: [A peer lost without a word]).
constexpr std::chrono::milliseconds kStoreLostAfter{5000};
// A fresh connection to a store, to tell whether its host still answers.
constexpr std::chrono::milliseconds kStoreProbeTimeout{2000};
// The timeout of the backup store rank 1 hosts (NOTE in external.cpp).
constexpr std::chrono::milliseconds kBackupStoreTimeout{30000};

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
