// harness/internal/external.cpp
//
// NOTE: [External ranks learn of failures through the store]
// Under torchrun/mpirun/srun there is no orchestrator to kill a rank's peers, so each rank
// watches its peers itself, out of band, through the job's TCPStore (hosted by rank 0; keys
// under "dtensor_ext/"), never through the process group (which may be stuck mid-collective):
//  - A rank whose body ends early (ASSERT, exception, skip) posts why under "t<k>/why" before
//    anything else. Every rank's watchdog thread polls that key while its test runs and aborts
//    its own pending collectives (NOTE: [Aborting waits]): they end with a CollectiveError,
//    classed as caused by the first failure. So a peer blocked in all_reduce is freed at once.
//  - The test's timeout (DTENSOR_TEST_TIMEOUT or the fixture's) is enforced by the watchdog:
//    at the deadline it aborts the rank's collectives; a rank still in its body kStuckGrace
//    later (blocked outside any collective) prints its stack, posts a result saying so, waits
//    until the test was reported, and leaves the job (exit 1).
//  - Results are exchanged through the store (t<k>/result/<rank>), not by a collective. A
//    rank that neither reports nor beats its heartbeat (hb/<rank>, every kHeartbeat) for
//    kDeadAfter is gone (crashed or killed).
//  - The reporter is rank 0, or, when rank 0 is stuck or gone, the first surviving rank: when
//    the store (rank 0's) fails, rank 1 reports; a rank > 1 reports only when rank 1's backup
//    store (a TCPStore rank 1 hosts for this purpose) cannot be reached either.
//  - After a test in which a rank stopped early or was aborted, every rank replaces the
//    process group (the old one may hold a pending collective; it is leaked, never destroyed).
//    After a rank is stuck or gone the job cannot go on: the remaining tests are skipped,
//    naming why, and the program fails.
#include "harness/internal/external.h"

#include "dtensor/comm/abort.h"
#include "dtensor/comm/c10d_group.h"
#include "dtensor/comm/rendezvous.h"
#include "dtensor/compat.h"
#include "harness/internal/launcher.h"
#include "harness/internal/rank_run.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <condition_variable>
#include <iostream>
#include <mutex>
#include <sstream>
#include <thread>

namespace dtensor {
namespace testing {
namespace internal {

namespace {
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
constexpr milliseconds kPoll{20};
constexpr milliseconds kHeartbeat{100};
constexpr milliseconds kDeadAfter{3000};
constexpr milliseconds kStuckGrace{2000};
constexpr milliseconds kReportWait{10000};
const std::string kPrefix = "dtensor_ext/";

std::optional<comm::RendezvousInfo> g_info;
bool g_checked = false;
comm::GroupPtr g_group;
std::vector<comm::GroupPtr>* g_retired = new std::vector<comm::GroupPtr>();  // never destroyed
c10::intrusive_ptr<c10d::Store> g_store;     // the main thread's connection (rank 0: the server)
c10::intrusive_ptr<c10d::TCPStore> g_backup;  // rank 1: the backup store it hosts
std::string g_backup_host;
int g_backup_port = 0;
int g_generation = 0;
int g_test = 0;
std::string g_broken;  // non-empty: no further test can run, and why
int g_live = 0;         // ranks expected to check out at the end (not stuck, not gone)
bool g_rank_zero_gone = false;
bool g_joined = false;
std::string g_join_error;  // joining the job failed: the first test fails with this
comm::C10dGroupOptions g_group_options;

std::string err_text(const std::exception& e) {
  auto* ce = dynamic_cast<const c10::Error*>(&e);
  return ce ? ce->what_without_backtrace() : e.what();
}
std::string short_text(std::string s, size_t n = 300) {
  if (s.size() > n) s = s.substr(0, n) + "...";
  return s;
}
std::string bytes_str(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }
std::vector<uint8_t> str_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

c10::intrusive_ptr<c10d::TCPStore> connect_store(const std::string& host, int port, milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = timeout;
  compat::disable_libuv(o);
  return c10::make_intrusive<c10d::TCPStore>(host, o);
}

// ---- printing on one rank only, switchable -----------------------------------------------
class Switchable : public ::testing::TestEventListener {
 public:
  explicit Switchable(::testing::TestEventListener* inner) : inner_(inner) {}
  std::atomic<bool> on{false};
#define DTENSOR_FWD(name, T) \
  void name(T x) override {  \
    if (on) inner_->name(x); \
  }
  DTENSOR_FWD(OnTestProgramStart, const ::testing::UnitTest&)
  DTENSOR_FWD(OnEnvironmentsSetUpStart, const ::testing::UnitTest&)
  DTENSOR_FWD(OnEnvironmentsSetUpEnd, const ::testing::UnitTest&)
  DTENSOR_FWD(OnTestSuiteStart, const ::testing::TestSuite&)
  DTENSOR_FWD(OnTestStart, const ::testing::TestInfo&)
  DTENSOR_FWD(OnTestDisabled, const ::testing::TestInfo&)
  DTENSOR_FWD(OnTestPartResult, const ::testing::TestPartResult&)
  DTENSOR_FWD(OnTestEnd, const ::testing::TestInfo&)
  DTENSOR_FWD(OnTestSuiteEnd, const ::testing::TestSuite&)
  DTENSOR_FWD(OnEnvironmentsTearDownStart, const ::testing::UnitTest&)
  DTENSOR_FWD(OnEnvironmentsTearDownEnd, const ::testing::UnitTest&)
  DTENSOR_FWD(OnTestProgramEnd, const ::testing::UnitTest&)
#ifndef GTEST_REMOVE_LEGACY_TEST_CASEAPI_
  DTENSOR_FWD(OnTestCaseStart, const ::testing::TestCase&)
  DTENSOR_FWD(OnTestCaseEnd, const ::testing::TestCase&)
#endif
#undef DTENSOR_FWD
  void OnTestIterationStart(const ::testing::UnitTest& u, int i) override {
    if (on) inner_->OnTestIterationStart(u, i);
  }
  void OnTestIterationEnd(const ::testing::UnitTest& u, int i) override {
    if (on) inner_->OnTestIterationEnd(u, i);
  }

 private:
  std::unique_ptr<::testing::TestEventListener> inner_;
};
Switchable* g_printer = nullptr;
Switchable* g_xml = nullptr;

void start_reporting() {
  if (g_printer) g_printer->on = true;
  if (g_xml) g_xml->on = true;
}

// ---- the watchdog --------------------------------------------------------------------------
class Watchdog {
 public:
  void connect(c10::intrusive_ptr<c10d::Store> store) { store_ = std::move(store); }
  void start(int rank) {
    rank_ = rank;
    thread_ = std::thread([this] { loop(); });
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  void begin(int test, const std::string& test_id, Clock::time_point deadline, milliseconds timeout) {
    std::lock_guard<std::mutex> lk(mu_);
    test_ = test;
    test_id_ = test_id;
    deadline_ = deadline;
    timeout_ = timeout;
    in_body_ = true;
    timed_out_ = false;
  }
  // The body returned; true when it was still running at the deadline.
  bool end() {
    std::unique_lock<std::mutex> lk(mu_);
    // A rank declared stuck has posted its result already and is leaving (loop()).
    cv_.wait(lk, [&] { return !stuck_; });
    in_body_ = false;
    test_ = -1;
    return timed_out_;
  }
  std::string store_lost() {
    std::lock_guard<std::mutex> lk(mu_);
    return store_lost_;
  }

 private:
  void loop() {
    c10::intrusive_ptr<c10d::Store> store = store_;
    auto last_beat = Clock::now() - kHeartbeat;
    std::unique_lock<std::mutex> lk(mu_);
    while (!stop_) {
      cv_.wait_for(lk, kPoll);
      if (stop_) break;
      if (!store_lost_.empty()) continue;
      const int test = test_;
      const auto deadline = deadline_;
      const bool in_body = in_body_;
      lk.unlock();
      try {
        const auto now = Clock::now();
        if (now - last_beat >= kHeartbeat) {
          store->add(kPrefix + "hb/" + std::to_string(rank_), 1);
          last_beat = now;
        }
        if (test >= 0) {
          const std::string pre = kPrefix + "t" + std::to_string(test) + "/";
          if (!comm::waits_aborted() && store->check({pre + "why"})) {
            const std::string why = bytes_str(store->get(pre + "why"));
            std::lock_guard<std::mutex> g(mu_);
            if (test_ == test) comm::abort_waits(why);  // not once the next test began
          }
          if (in_body && now > deadline) on_deadline(*store, test, pre, now > deadline + kStuckGrace);
        }
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> g(mu_);
        store_lost_ = short_text(err_text(e));
        comm::abort_waits("rank 0 is gone (the connection to the job's store, which it hosts, failed: " +
                          store_lost_ + ")");
      }
      lk.lock();
    }
  }

  void on_deadline(c10d::Store& store, int test, const std::string& pre, bool stuck) {
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
    r.parts.push_back({"exception", "", -1,
                       "still running the test body " + std::to_string(kStuckGrace.count() / 1000) +
                           " s after the timeout, outside any collective (its stack is on this "
                           "rank's stderr); this rank leaves the job"});
    nlohmann::json j = {{"result", r}, {"timed_out", true}, {"stuck", true}};
    try {
      store.set(pre + "result/" + std::to_string(rank_), str_bytes(j.dump()));
      const auto until = Clock::now() + kReportWait;
      while (Clock::now() < until && !store.check({pre + "reported"}))
        std::this_thread::sleep_for(kPoll);  // waiting for the reporter (rank 0 hosts the store)
    } catch (const std::exception&) {
      // the store is gone: nothing left to wait for
    }
    std::cerr << "[dtensor] rank " << rank_ << ": stuck in " << test_id << " after its timeout; leaving the job"
              << std::endl;
    ::_exit(1);
  }

  int rank_ = -1;
  c10::intrusive_ptr<c10d::Store> store_;  // its own connection to the job's store
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  int test_ = -1;
  std::string test_id_;
  Clock::time_point deadline_;
  milliseconds timeout_{0};
  bool in_body_ = false;
  bool timed_out_ = false;
  bool stuck_ = false;
  std::string store_lost_;
};
Watchdog* g_watchdog = nullptr;

// NOTE: [Rank 0 leaves group creation last]
// C10dGroup::create returns on a rank once every rank has arrived at its creation barrier,
// but a rank that arrived early may still be sending its wait for the barrier's gate when the
// last one, rank 0, goes on: rank 0 failing at once (a crash in its first test) then dies with
// that request unread, the kernel resets the connection, and the peer's join failed with
// "Connection reset by peer" (1 in 4 runs of HarnessReports.ExternalRankZeroDying*) instead of
// its first test reporting that rank 0 is gone. So after creating a group every rank > 0
// counts itself out (an add: its reply means the store has read everything the rank sent),
// the last one opens a gate (a set, which has no reply), and rank 0, which hosts the store,
// waits for that gate: once it goes on, no peer has a store request in flight.
void make_group() {
  const std::string gen = "dtensor_world_" + std::to_string(g_generation);
  auto prefixed = c10::make_intrusive<c10d::PrefixStore>(gen, g_store);
  g_group = comm::C10dGroup::create(prefixed, g_info->rank, g_info->world_size, g_group_options);
  const int n = g_info->world_size;
  if (n > 1) {
    const std::string gate = kPrefix + gen + "/all_out";
    if (g_info->rank > 0 && g_store->add(kPrefix + gen + "/out", 1) == n - 1) g_store->set(gate, str_bytes("1"));
    if (g_info->rank == 0) g_store->wait({gate}, g_group_options.timeout);
  }
  comm::set_default_group(g_group);
}

// Whether rank 0, which hosts the job's store, still answers (a new connection and one round
// trip; a failed join is then reported as rank 0 being gone, like a failure in a test).
bool rank_zero_answers() {
  try {
    auto s = connect_store(g_info->master_addr, g_info->master_port, std::chrono::seconds(2));
    s->add(kPrefix + "probe", 1);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// A rank other than 0 decides whether it reports in rank 0's place (rank 0 is gone).
bool i_report_for_rank_zero() {
  if (g_info->rank == 1) return true;
  if (g_backup_port <= 0) return true;
  try {
    auto s = connect_store(g_backup_host, g_backup_port, std::chrono::seconds(2));
    s->add(kPrefix + "alive", 1);
    return false;  // rank 1 is alive and reports
  } catch (const std::exception&) {
    return true;  // rank 1 is gone too: every surviving rank reports
  }
}
}  // namespace

bool external_launcher_detected() {
  if (!g_checked) {
    g_checked = true;
    g_info = comm::rendezvous_from_env();
  }
  return g_info.has_value();
}

bool external_launcher_active() { return g_joined; }

void init_external_launcher() {
  if (!external_launcher_detected()) return;
  const auto& info = *g_info;
  g_joined = true;  // tests run as this rank from now on, even if joining fails below
  std::cerr << "dtensor: rendezvous from " << info.source << ": rank " << info.rank << " of "
            << info.world_size << " (local rank " << info.local_rank << "), master " << info.master_addr
            << ":" << info.master_port << std::endl;
  g_group_options.backend = env_or("DTENSOR_BACKEND", "gloo");
  g_group_options.timeout = comm::kDefaultCollectiveTimeout;
  install_rank_signals(info.rank);
  g_watchdog = new Watchdog();
  try {
    g_store = comm::make_tcp_store(info.master_addr, info.master_port, info.rank, info.world_size,
                                   g_group_options.timeout);
    // Everything that needs every rank alive happens before the group's creation, which no
    // rank leaves before all have arrived: a rank 0 failing in its first test cannot stop a
    // peer still joining.
    g_watchdog->connect(connect_store(info.master_addr, info.master_port, g_group_options.timeout));
    if (info.world_size > 1) {
      if (info.rank == 1) {
        c10d::TCPStoreOptions o;
        o.port = 0;
        o.isServer = true;
        o.waitWorkers = false;
        o.timeout = std::chrono::seconds(30);
        compat::disable_libuv(o);
        char host[256] = "127.0.0.1";
        if (info.master_addr != "127.0.0.1" && info.master_addr != "localhost") ::gethostname(host, sizeof host);
        g_backup = c10::make_intrusive<c10d::TCPStore>(host, o);
        g_store->set(kPrefix + "backup", str_bytes(std::string(host) + " " + std::to_string(g_backup->getPort())));
      }
      const std::string b = bytes_str(g_store->get(kPrefix + "backup"));
      g_backup_host = b.substr(0, b.find(' '));
      g_backup_port = std::stoi(b.substr(b.find(' ') + 1));
    }
    make_group();
  } catch (const std::exception& e) {
    // Reported as the first test's failure (run_external), by this rank when rank 0 is gone.
    g_join_error = "joining the job (" + info.source + ", master " + info.master_addr + ":" +
                   std::to_string(info.master_port) + ") failed: " + short_text(err_text(e));
    if (info.rank > 0 && !rank_zero_answers()) {
      g_rank_zero_gone = true;
      g_join_error = "rank 0 is gone (it no longer answers at " + info.master_addr + ":" +
                     std::to_string(info.master_port) + ", the job's store it hosts): " + g_join_error;
    }
    g_broken = g_join_error;
    std::cerr << "[dtensor] rank " << info.rank << ": " << g_join_error << std::endl;
  }
  comm::set_waits_abortable(true);
  if (g_join_error.empty()) g_watchdog->start(info.rank);
  // Every rank records the results; only the reporter (rank 0, NOTE above) prints them.
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (auto* p = listeners.default_result_printer()) listeners.Append(g_printer = new Switchable(listeners.Release(p)));
  if (auto* x = listeners.default_xml_generator()) listeners.Append(g_xml = new Switchable(listeners.Release(x)));
  if (info.rank == 0 || (!g_join_error.empty() && i_report_for_rank_zero())) start_reporting();
}

void run_external(const std::string& test_id, std::chrono::milliseconds timeout) {
  if (!g_join_error.empty() && g_test++ == 0) {
    ADD_FAILURE() << "[rank " << g_info->rank << "] " << g_join_error
                  << (g_info->rank == 0 || g_rank_zero_gone ? ""
                                                            : " (rank 0, which hosts the job's store, answers: "
                                                              "this rank's own connection failed)");
    return;
  }
  if (!g_broken.empty()) GTEST_SKIP() << "not run: " << g_broken;
  const int me = g_group->rank(), n = g_group->size();
  const int k = g_test++;
  const std::string pre = kPrefix + "t" + std::to_string(k) + "/";
  const auto t0 = Clock::now();
  comm::clear_aborted_waits();
  g_watchdog->begin(k, test_id, t0 + timeout, timeout);
  RankResult mine;
  bool body_done = false;
  {
    auto sink = std::make_shared<RankSink>();
    RankCapture capture(sink);
    set_body_done_hook([&body_done] { body_done = true; });
    mine = run_rank_body(test_id, me, g_group, *sink);
    set_body_done_hook(nullptr);
  }
  const bool timed_out = g_watchdog->end();
  const bool aborted = comm::waits_aborted().has_value();

  std::vector<RankOutcome> outcomes(n);
  std::vector<bool> stuck(n, false), gone(n, false);
  try {
    if (mine.fatal() && g_store->add(pre + "nwhy", 1) == 1) {
      std::string why;
      for (auto& p : mine.parts)
        if (p.kind != "failure") {
          why = (p.kind == "skip" ? "skipped: " : "failed: ") + short_text(p.message, 200);
          break;
        }
      g_store->set(pre + "why", str_bytes("rank " + std::to_string(me) + " " + why));
    }
    g_store->set(pre + "result/" + std::to_string(me),
                 str_bytes(nlohmann::json({{"result", mine}, {"timed_out", timed_out}, {"stuck", false},
                                           {"body_done", body_done}}).dump()));
    // Everyone's result, or its absence: stuck ranks post theirs kStuckGrace after the
    // deadline; a rank whose heartbeat stops for kDeadAfter is gone.
    std::vector<bool> have(n, false);
    std::vector<int64_t> beat(n, -1);
    std::vector<Clock::time_point> beat_at(n, Clock::now());
    const auto give_up = t0 + timeout + kStuckGrace + kReportWait / 2;
    for (;;) {
      bool all = true;
      for (int r = 0; r < n; ++r) {
        if (have[r] || gone[r]) continue;
        const std::string key = pre + "result/" + std::to_string(r);
        if (g_store->check({key})) {
          auto j = nlohmann::json::parse(bytes_str(g_store->get(key)));
          outcomes[r].result = j.at("result").get<RankResult>();
          if (j.value("timed_out", false)) outcomes[r].end = RankOutcome::End::kTimedOut;
          outcomes[r].body_done = j.value("body_done", false);
          stuck[r] = j.value("stuck", false);
          have[r] = true;
          continue;
        }
        const int64_t b = g_store->add(kPrefix + "hb/" + std::to_string(r), 0);
        const auto now = Clock::now();
        if (b != beat[r]) {
          beat[r] = b;
          beat_at[r] = now;
        } else if (now - beat_at[r] > kDeadAfter || now > give_up) {
          gone[r] = true;
          continue;
        }
        all = false;
      }
      if (all) break;
      std::this_thread::sleep_for(kPoll);  // polling the store (the group may be unusable)
    }
  } catch (const std::exception& e) {
    // The store is gone: rank 0, which hosts it, died (NOTE above).
    const std::string lost = short_text(err_text(e));
    g_broken = "rank 0 is gone (the connection to the job's store, which it hosts, failed: " + lost + ")";
    g_rank_zero_gone = true;
    if (i_report_for_rank_zero()) start_reporting();
    ADD_FAILURE() << "[rank " << me << "] " << g_broken << " during " << test_id << "; rank " << me
                  << " reports in its place, with its own result";
    RankOutcome o;
    o.rank = me;
    o.result = mine;
    if (timed_out) o.end = RankOutcome::End::kTimedOut;
    o.body_done = body_done;
    report_outcomes(test_id, {o}, timeout, "");
    return;
  }
  for (int r = 0; r < n; ++r) {
    outcomes[r].rank = r;
    if (gone[r]) {
      RankResult gr;
      gr.rank = r;
      gr.parts.push_back({"exception", "", -1,
                          "rank " + std::to_string(r) +
                              " is gone: it posted no result and its heartbeat stopped (crashed or killed)"});
      outcomes[r].result = gr;
    }
  }
  int reporter = -1;
  for (int r = 0; r < n && reporter < 0; ++r)
    if (!stuck[r] && !gone[r]) reporter = r;
  if (reporter == me) start_reporting();
  report_outcomes(test_id, outcomes, timeout, "");
  if (reporter == me) {
    try {
      g_store->set(pre + "reported", str_bytes("1"));
    } catch (const std::exception&) {
    }
  }
  g_live = 0;
  for (int r = 0; r < n; ++r) g_live += !stuck[r] && !gone[r];
  for (int r = 0; r < n; ++r)
    if (stuck[r] || gone[r]) {
      g_broken = "rank " + std::to_string(r) + (stuck[r] ? " is stuck in " : " left the job during ") +
                 test_id + (stuck[r] ? " (after its timeout)" : "");
      return;
    }
  bool replace = aborted || timed_out;
  for (auto& o : outcomes) replace = replace || (o.result && o.result->fatal()) || o.end != RankOutcome::End::kFinished;
  if (replace) {
    // The old group may hold a pending collective: keep it alive, never use it again.
    g_retired->push_back(g_group);
    ++g_generation;
    try {
      make_group();
    } catch (const std::exception& e) {
      g_broken = "replacing the process group after " + test_id + " failed: " + short_text(err_text(e));
      ADD_FAILURE() << "[rank " << me << "] " << g_broken;
    }
  }
}

void shutdown_external() {
  if (g_watchdog) g_watchdog->stop();
  if (!g_joined) return;
  const int me = g_info->rank, n = g_info->world_size;
  if (g_live == 0) g_live = n;
  try {
    if (g_rank_zero_gone && me == 1 && g_backup) {
      // The others ask whether rank 1 lives (i_report_for_rank_zero): stay until they did.
      const auto until = Clock::now() + kDeadAfter;
      while (Clock::now() < until && g_backup->add(kPrefix + "alive", 0) < n - 2)
        std::this_thread::sleep_for(kPoll);
    }
  } catch (const std::exception&) {
  }
  if (!g_group) return;
  try {
    if (!g_rank_zero_gone) {
      // Rank 0 hosts the store: it leaves last, once every rank that can has checked out.
      g_store->add(kPrefix + "done", 1);
      if (me == 0) {
        const auto until = Clock::now() + kReportWait;
        while (Clock::now() < until && g_store->add(kPrefix + "done", 0) < g_live)
          std::this_thread::sleep_for(kPoll);
      }
    }
  } catch (const std::exception&) {
  }
  if (g_broken.empty() && !comm::waits_aborted()) {
    comm::destroy_process_group();
    g_group.reset();
  } else {
    g_retired->push_back(g_group);  // may hold a pending collective: never destroyed
    comm::set_default_group(nullptr);
  }
}

}  // namespace internal
}  // namespace testing
}  // namespace dtensor
