// harness/internal/watchdog.cpp
//
// NOTE: [A peer lost without a word]
// A rank whose process dies closes its sockets: its peers' Gloo pairs fail at once. A rank whose
// host is cut off (a link down, a host frozen or SIGSTOPped) closes nothing: its peers' pairs
// wait for data that never comes, until the test's timeout or the group's. So while a body
// runs, each rank's watchdog reads its peers' heartbeats every kPeerCheck and, when one has
// not moved for kDeadAfter, aborts its own collectives naming that rank (stderr says so at
// once); the results then mark it gone without waiting again. On the far side of the cut, the
// lost rank's own watchdog sees the store stop answering and that rank reports alone, as when
// rank 0 dies. A store request (add, check, get) has no timeout of its own: in libtorch 1.13
// only a wait sets the socket's receive timeout (connect_watchdog_store arms it with one), and
// since 2.x a wait polls and leaves the socket without one, so a request to a store cut off
// blocks until TCP gives up, many minutes later. So a second thread, the monitor, watches the
// watchdog's requests: one unanswered for kStoreLostAfter marks the store lost and aborts this
// rank's collectives; the watchdog's thread, still blocked, is left behind at exit.
#include "harness/internal/watchdog.h"

#include "dtensor/comm/abort.h"
#include "harness/internal/external_store.h"
#include "harness/internal/rank_run.h"
#include "harness/internal/timing.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <sstream>

namespace dtensor {
namespace testing {
namespace internal {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

void Watchdog::start(int rank, int world_size) {
  rank_ = rank;
  n_ = world_size;
  beat_.assign(n_, -1);
  beat_at_.assign(n_, Clock::now());
  lost_.assign(n_, false);
  thread_ = std::thread([this] { loop(); });
  monitor_ = std::thread([this] { monitor(); });
}

void Watchdog::stop() {
  bool lost;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    lost = !store_lost_.empty();
  }
  cv_.notify_all();
  if (monitor_.joinable()) monitor_.join();
  if (!thread_.joinable()) return;
  if (lost) thread_.detach();  // may be blocked in a request to the lost store for good
  else thread_.join();
}

void Watchdog::begin(int test, const std::string& test_id, Clock::time_point deadline, milliseconds timeout) {
  std::lock_guard<std::mutex> lk(mu_);
  test_ = test;
  test_id_ = test_id;
  deadline_ = deadline;
  timeout_ = timeout;
  in_body_ = true;
  timed_out_ = false;
}

// The body returned; true when it was still running at the deadline.
bool Watchdog::end() {
  std::unique_lock<std::mutex> lk(mu_);
  // A rank declared stuck has posted its result already and is leaving (loop()).
  cv_.wait(lk, [&] { return !stuck_; });
  in_body_ = false;
  test_ = -1;
  return timed_out_;
}

std::string Watchdog::store_lost() {
  std::lock_guard<std::mutex> lk(mu_);
  return store_lost_;
}

// The peers found gone while a body ran (NOTE: [A peer lost without a word]).
std::vector<bool> Watchdog::lost() {
  std::lock_guard<std::mutex> lk(mu_);
  return lost_;
}

// The peers' heartbeats as last read during test `test`, and when each last moved; false
// when none was read during that test.
bool Watchdog::peer_beats(int test, std::vector<int64_t>* beat, std::vector<Clock::time_point>* at) {
  std::lock_guard<std::mutex> lk(mu_);
  if (baseline_test_ != test) return false;
  *beat = beat_;
  *at = beat_at_;
  return true;
}

void Watchdog::loop() {
  c10::intrusive_ptr<c10d::Store> store = store_;
  auto last_beat = Clock::now() - kHeartbeat;
  auto last_peer_check = Clock::now();
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, kExternalPoll);
    if (stop_) break;
    if (!store_lost_.empty()) continue;
    const int test = test_;
    const auto deadline = deadline_;
    const bool in_body = in_body_;
    asking_since_ = Clock::now();  // the monitor watches the requests below
    lk.unlock();
    try {
      const auto now = Clock::now();
      if (now - last_beat >= kHeartbeat) {
        store->add(kExternalPrefix + "hb/" + std::to_string(rank_), 1);
        last_beat = now;
      }
      if (test >= 0) {
        const std::string pre = kExternalPrefix + "t" + std::to_string(test) + "/";
        if (!comm::waits_aborted() && store->check({pre + "why"})) {
          const std::string why = bytes_str(store->get(pre + "why"));
          std::lock_guard<std::mutex> g(mu_);
          if (test_ == test) comm::abort_waits(why);  // not once the next test began
        }
        if (in_body && now - last_peer_check >= kPeerCheck) {
          last_peer_check = now;
          check_peers(*store, test, now);
        }
        if (in_body && now > deadline) on_deadline(*store, test, pre, now > deadline + kStuckGrace);
      }
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> g(mu_);
      if (store_lost_.empty()) lose_store(short_text(err_text(e)));
    }
    lk.lock();
    asking_since_.reset();
  }
}

// NOTE: [A peer lost without a word]: a watchdog request unanswered for kStoreLostAfter.
void Watchdog::monitor() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    cv_.wait_for(lk, kExternalPoll);
    if (stop_ || !store_lost_.empty() || !asking_since_) continue;
    if (Clock::now() - *asking_since_ > kStoreLostAfter)
      lose_store("no answer for " + std::to_string(kStoreLostAfter.count() / 1000) + " s");
  }
}

// mu_ held.
void Watchdog::lose_store(const std::string& why) {
  store_lost_ = why;
  comm::abort_waits("rank 0 is gone (the connection to the job's store, which it hosts, failed: " + why + ")");
}

// NOTE: [A peer lost without a word]. Runs on the watchdog thread, mu_ not held.
void Watchdog::check_peers(c10d::Store& store, int test, Clock::time_point now) {
  std::vector<int64_t> read(n_, -1);
  for (int r = 0; r < n_; ++r)
    if (r != rank_ && !lost_[r]) read[r] = store.add(kExternalPrefix + "hb/" + std::to_string(r), 0);
  std::vector<int> newly;
  {
    // beat_ and beat_at_ are written by this thread only, under mu_ for peer_beats().
    std::lock_guard<std::mutex> g(mu_);
    if (test != baseline_test_) {  // a fresh baseline for every test
      baseline_test_ = test;
      std::fill(beat_.begin(), beat_.end(), -1);
      std::fill(beat_at_.begin(), beat_at_.end(), now);
    }
    for (int r = 0; r < n_; ++r) {
      if (r == rank_ || lost_[r]) continue;
      if (read[r] != beat_[r]) {
        beat_[r] = read[r];
        beat_at_[r] = now;
      } else if (now - beat_at_[r] > kDeadAfter) {
        newly.push_back(r);
      }
    }
  }
  if (newly.empty()) return;
  std::ostringstream why;
  why << (newly.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < newly.size(); ++i) why << (i ? "," : "") << newly[i];
  why << (newly.size() == 1 ? " is" : " are") << " gone: no heartbeat for " << kDeadAfter.count() / 1000
      << " s (crashed, killed, or cut off from the job's store)";
  std::lock_guard<std::mutex> g(mu_);
  if (test_ != test || !in_body_) return;
  for (int r : newly) lost_[r] = true;
  std::cerr << "[dtensor] rank " << rank_ << ": " << why.str() << "; ending this rank's collectives" << std::endl;
  if (!comm::waits_aborted()) comm::abort_waits(why.str());
}

void Watchdog::on_deadline(c10d::Store& store, int test, const std::string& pre, bool stuck) {
  std::string test_id;
  milliseconds timeout;
  {
    std::lock_guard<std::mutex> g(mu_);
    if (test_ != test || !in_body_) return;
    timed_out_ = true;
    test_id = test_id_;
    timeout = timeout_;
    std::ostringstream secs;
    secs << timeout.count() / 1000.0;
    comm::abort_waits(test_id + " timed out after " + secs.str() + " s");
  }
  if (!stuck) return;
  // Still in the body kStuckGrace after its collectives were aborted: blocked elsewhere.
  {
    std::lock_guard<std::mutex> g(mu_);
    stuck_ = true;
  }
  ::kill(::getpid(), SIGUSR1);  // the test thread prints its stack (install_rank_signals)
  RankResult r;
  r.rank = rank_;
  r.parts.push_back({RankPart::Kind::kException, "", -1,
                     "still running the test body " + std::to_string(kStuckGrace.count() / 1000) +
                         " s after the timeout, outside any collective (its stack is on this "
                         "rank's stderr); this rank leaves the job"});
  nlohmann::json j = {{"result", r}, {"timed_out", true}, {"stuck", true}};
  try {
    store.set(pre + "result/" + std::to_string(rank_), str_bytes(j.dump()));
    const auto until = Clock::now() + kReportWait;
    while (Clock::now() < until && !store.check({pre + "reported"}))
      std::this_thread::sleep_for(kExternalPoll);  // waiting for the reporter (rank 0 hosts the store)
  } catch (const std::exception&) {
    // the store is gone: nothing left to wait for
  }
  std::cerr << "[dtensor] rank " << rank_ << ": stuck in " << test_id << " after its timeout; leaving the job"
            << std::endl;
  ::_exit(1);
}

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
